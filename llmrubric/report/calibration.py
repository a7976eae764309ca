"""The calibration section: smoothed ECE per answer value (pooled, per judge, per system), reliability
diagrams and each judge's answer distribution beside LLM-Rubric's prediction."""

from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm import tqdm

from llmrubric.evaluation.calibration import calibration_groups, reliability_diagram
from llmrubric.evaluation.significance import Aligned, align_methods
from llmrubric.report.plots import judge_distribution_figure, png_bytes, reliability_figure
from llmrubric.report.results import Results
from llmrubric.report.tables import Section, Table, fmt, fmt_ci


def calibration(r: Results) -> Section:
    """smECE of LLM-Rubric's predicted probability of each answer of the main question, with its figures."""
    s = r.settings
    q = r.question
    compared = ["llm_rubric"] + (["expected_llm"] if r.question.id in r.plan.llm_questions else [])
    aligned = align_methods({n: r.prediction(n) for n in compared}, r.annotations, q)
    probs, answers = aligned.probs["llm_rubric"], aligned.answer_index
    groups = {"judge": aligned.pairs.judge_id}
    if "system_id" in aligned.pairs.columns and aligned.pairs.system_id.notna().any():
        groups["system"] = aligned.pairs.system_id
    results, notes = calibration_groups(
        probs, answers, q.keys, groups, s.calibration_min_examples, s.calibration_bootstrap, s.seed
    )
    if "system" not in groups:
        notes.append("no system ids in the data: per-system calibration skipped")
    section = Section("calibration", f"Calibration of {q.id} (smoothed ECE)", notes=notes)
    data = pd.DataFrame([row for g in results for row in g.rows])
    section.text = (
        f"smECE (relplot) of the predicted probability of each answer of {q.id} for LLM-Rubric on {len(answers)} held-out pairs, "
        f"with {round(100 * s.confidence)} % basic bootstrap intervals ({s.calibration_bootstrap} resamples, as relplot). "
        f"Per judge and per system where a group has at least {s.calibration_min_examples} pairs."
    )
    section.tables.append(_smece_table(data))
    for g in tqdm(results, desc="reliability diagrams", unit="group", leave=False):
        section.figures.append(_reliability_figure(r, g, probs, answers, groups))
    section.figures.append(_judge_figure(r, aligned, section.notes))
    pooled = data[data.kind == "all"]
    section.numbers = {
        "smece": {row.answer: {"value": row.smece, "low": row.low, "high": row.high} for row in pooled.itertuples()},
        "rows": data,
    }
    return section


def _smece_table(data: pd.DataFrame) -> Table:
    """The smECE of each answer value, pooled and per group, with the rows as ``calibration.csv``."""
    rows = [
        [
            g.kind,
            g.group,
            g.answer,
            str(g.n),
            str(g.positives),
            fmt(g.mean_forecast),
            fmt(g.frequency),
            fmt_ci(g.smece, g.low, g.high),
        ]
        for g in data.itertuples()
    ]
    return Table(
        "smECE per answer value",
        ["kind", "group", "answer", "pairs", "answered", "mean p", "frequency", "smECE [CI]"],
        rows,
        "calibration.csv",
        data,
    )


def _reliability_figure(
    r: Results, g, probs: np.ndarray, answers: np.ndarray, groups: dict[str, pd.Series]
) -> tuple[str, str, bytes]:
    """Title, file name and PNG of one group's reliability diagrams (a panel per answer value)."""
    s, q = r.settings, r.question
    group_rows = (
        np.arange(len(answers)) if g.kind == "all" else np.flatnonzero(groups[g.kind].astype(str).to_numpy() == g.group)
    )
    panels = []
    for j, row in enumerate(g.rows):
        y = (answers[group_rows] == j).astype(float)
        diagram = reliability_diagram(
            probs[group_rows, j], y, row["smece"], row["low"], row["high"], s.diagram_bootstrap, s.seed + j
        )
        panels.append((row["answer"], diagram))
    title = (
        f"{q.id} reliability, all pairs (n={g.n})"
        if g.kind == "all"
        else f"{q.id} reliability, {g.kind} {g.group} (n={g.n})"
    )
    name = "reliability_all.png" if g.kind == "all" else f"reliability_{g.kind}_{_slug(g.group)}.png"
    return title, name, png_bytes(reliability_figure(panels, title))


def _judge_figure(r: Results, aligned: Aligned, notes: list[str]) -> tuple[str, str, bytes]:
    q, s = r.question, r.settings
    k = len(q.keys)
    observed, predicted, counts = {}, {}, {}
    skipped = []
    for judge, rows in sorted(aligned.pairs.groupby("judge_id").indices.items(), key=lambda kv: -len(kv[1])):
        if len(rows) < s.judge_figure_min_pairs:
            skipped.append(f"{judge} ({len(rows)})")
            continue
        observed[judge] = np.bincount(aligned.answer_index[rows], minlength=k) / len(rows)
        predicted[judge] = aligned.probs["llm_rubric"][rows].mean(axis=0)
        counts[judge] = len(rows)
    if skipped:
        notes.append(
            f"judge-distribution figure: {len(skipped)} judge(s) with fewer than {s.judge_figure_min_pairs} pairs not shown: {', '.join(skipped)}"
        )
    llm = aligned.probs["expected_llm"].mean(axis=0) if "expected_llm" in aligned.probs else None
    title = f"{q.id}: each judge's answers (black), LLM-Rubric's mean prediction (gray), raw LLM (light gray)"
    return (
        title,
        "judge_distributions.png",
        png_bytes(judge_distribution_figure(observed, predicted, counts, llm, list(q.keys), title)),
    )


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in str(text))
