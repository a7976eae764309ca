"""The report's metric sections from the trained variants' predictions (nothing is trained here):
Table 1 with significance, ablations (Table 2), each question as the target (Table 3), oracles and
the learning curve; :func:`build_sections` computes the chosen ones."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pandas as pd
from tqdm import tqdm

from llmrubric.evaluation.metrics import METRICS, evaluate, seed_sd
from llmrubric.evaluation.significance import (
    POINT_METRICS,
    Aligned,
    align_methods,
    bootstrap_intervals,
    compare_methods,
    superscripts,
)
from llmrubric.experiments.variants import (
    ablation_variants,
    learning_curve_variants,
    oracle_variants,
    per_question_variants,
)
from llmrubric.report import calibration
from llmrubric.report.plots import learning_curve_figure, png_bytes
from llmrubric.report.results import DROP_METRICS, Results, as_predictions, drop_tests
from llmrubric.report.settings import SECTIONS
from llmrubric.report.tables import Section, Sup, Table, fmt, fmt_ci, fmt_p


def _metric_rows(
    r: Results,
    aligned: Aligned,
    names: list[str],
    labels: dict[str, str],
    display: dict[str, str],
    tests: pd.DataFrame,
    star_group: list[str] | None,
    reference: dict,
) -> tuple[list[list], pd.DataFrame]:
    s = r.settings
    marks = {m: superscripts(tests, labels, m, s.alpha, star_group) for m in POINT_METRICS}
    rows, records = [], []
    for i, name in enumerate(tqdm(names, desc="bootstrap", unit="method", leave=False)):
        metrics = evaluate(as_predictions(aligned, name, r.question), r.annotations, r.question)
        ci = bootstrap_intervals(
            aligned.y,
            aligned.means[name],
            aligned.probs[name],
            aligned.answer_index,
            s.bootstrap,
            s.seed + 100 * i,
            s.confidence,
        )
        seeds = r.per_seed_metrics(name) if len(r.seeds_of(name)) > 1 else []
        record = {"label": labels[name], "method": name, "seeds": max(1, len(seeds)), "n": metrics["n"]}
        for m in METRICS:
            record[m], (record[f"{m}_low"], record[f"{m}_high"]) = metrics[m], ci.get(m, (math.nan, math.nan))
            if m in POINT_METRICS:
                record[f"{m}_marks"] = marks[m][name]
        for m in ("rmse", "pearson"):
            values = [x[m] for x in seeds]
            record[f"{m}_seed_mean"] = float(np.mean(values)) if values else math.nan
            record[f"{m}_seed_sd"] = seed_sd(values)
            record[f"per_judge_{m}"] = metrics["per_judge"][m]
        ref = reference.get(name) or {}
        record["paper_rmse"], record["paper_pearson"] = ref.get("rmse", math.nan), ref.get("pearson", math.nan)
        records.append(record)
        row = [labels[name], display[name]]
        row += [
            Sup(fmt_ci(record[m], record[f"{m}_low"], record[f"{m}_high"]), record[f"{m}_marks"]) for m in POINT_METRICS
        ]
        row.append(fmt_ci(record["nll"], record["nll_low"], record["nll_high"]))
        row.append(f"{fmt(record['pearson_seed_mean'])} ± {fmt(record['pearson_seed_sd'])}" if seeds else "—")
        if reference:
            row.append(f"{fmt(record['paper_rmse'])} / {fmt(record['paper_pearson'])}" if ref else "—")
        rows.append(row)
    return rows, pd.DataFrame(records)


def _header(confidence: float, first: str, reference: bool) -> list[str]:
    ci = f"{round(100 * confidence)} % CI"
    header = [
        "",
        first,
        f"RMSE ↓ [{ci}]",
        f"Pearson ↑ [{ci}]",
        f"Spearman ↑ [{ci}]",
        f"Kendall ↑ [{ci}]",
        f"NLL ↓ [{ci}]",
        "Pearson over seeds",
    ]
    return header + (["paper RMSE / Pearson"] if reference else [])


def table1(r: Results) -> Section:
    """Table 1: every method's metrics with intervals and pairwise significance marks."""
    s = r.settings
    names = list(r.plan.methods)
    aligned = align_methods({n: r.prediction(n) for n in names}, r.annotations, r.question)
    labels = {n: str(i + 1) for i, n in enumerate(names)}
    tests = compare_methods(aligned, list(itertools.combinations(names, 2)), POINT_METRICS, s.permutations, s.seed)
    reference = dict(r.reference.get("table1") or {})
    rows, data = _metric_rows(r, aligned, names, labels, {n: n for n in names}, tests, None, reference)
    text = (
        f"{r.question.id} on {len(aligned.y)} held-out (text, judge) pairs, pooled. Superscripts: the row is "
        f"significantly better than the rows named (paired permutation test, {s.permutations:,} permutations, one-sided, "
        f"p < {s.alpha}). Intervals: percentile bootstrap over pairs ({s.bootstrap:,} resamples). Learned methods: mean of "
        f"{s.seeds} seed(s)' predictions; 'Pearson over seeds' is the single-seed spread (mean ± sd)."
    )
    table = Table(
        "Table 1: methods", _header(r.settings.confidence, "method", bool(reference)), rows, "table1.csv", data
    )
    sig = Table("Pairwise permutation tests", [], [], "significance.csv", tests)
    return Section(
        "table1",
        "Table 1: methods and significance",
        text,
        [table, sig],
        notes=list(r.plan.method_notes),
        numbers={"rows": data, "tests": tests},
    )


def ablations(r: Results) -> Section:
    """Table 2: LLM-Rubric without one design decision or one feature question."""
    s = r.settings
    variants = ablation_variants(r.rubric, r.plan.ablation_questions())
    names = {display: v.name for display, v in variants.items()}
    aligned = align_methods({v: r.prediction(v) for v in names.values()}, r.annotations, r.question)
    tests = drop_tests(r, "llm_rubric", [v for v in names.values() if v != "llm_rubric"], aligned)
    reference = dict(r.reference.get("table2") or {})
    records, rows = [], []
    for display, name in names.items():
        metrics = evaluate(as_predictions(aligned, name, r.question), r.annotations, r.question)
        seeds = r.per_seed_metrics(name) if len(r.seeds_of(name)) > 1 else []
        record = {
            "ablation": display,
            "variant": name,
            "rmse": metrics["rmse"],
            "pearson": metrics["pearson"],
            "nll": metrics["nll"],
        }
        for m in DROP_METRICS:
            t = tests[(tests.method_b == name) & (tests.metric == m)]
            record[f"p_{m}"] = float(t.p_value.iloc[0]) if len(t) else math.nan
            record[f"{m}_seed_sd"] = seed_sd([x[m] for x in seeds])
        ref = reference.get(name) or {}
        record["paper_rmse"], record["paper_pearson"] = ref.get("rmse", math.nan), ref.get("pearson", math.nan)
        records.append(record)
        drop = lambda m: "▽" if record[f"p_{m}"] < s.alpha else ""
        row = [
            display,
            Sup(fmt(record["rmse"]), drop("rmse")),
            Sup(fmt(record["pearson"]), drop("pearson")),
            fmt(record["nll"]),
            fmt_p(record["p_rmse"]),
            fmt_p(record["p_pearson"]),
        ]
        if reference:
            row += [fmt(record["paper_rmse"]), fmt(record["paper_pearson"])]
        rows.append(row)
    data = pd.DataFrame(records)
    header = ["model", "RMSE ↓", "Pearson ↑", "NLL ↓", "p (RMSE drop)", "p (Pearson drop)"] + (
        ["paper RMSE", "paper Pearson"] if reference else []
    )
    significant = [
        rec["ablation"]
        for rec in records
        if rec["variant"] != "llm_rubric" and (rec["p_rmse"] < s.alpha or rec["p_pearson"] < s.alpha)
    ]
    text = (
        f"Each variant is trained like LLM-Rubric ({s.seeds} seed(s), predictions averaged) with one design decision or one feature "
        f"question removed. ▽: significantly worse than the full model (one-sided paired permutation test, p < {s.alpha}). "
        f"Significant drops: {', '.join(significant) if significant else 'none'}."
    )
    table = Table("Table 2: ablations", header, rows, "ablations.csv", data)
    return Section("ablations", "Table 2: ablations", text, [table], numbers={"rows": data, "tests": tests})


def per_question(r: Results) -> Section:
    """Table 3: LLM-Rubric fine-tuned on each question against the LLM's expected answer."""
    s = r.settings
    reference = dict(r.reference.get("table3") or {})
    records, rows = [], []
    notes = [
        f"{qid}: categorical, left out (RMSE and Pearson need ordered numeric options)"
        if not r.rubric[qid].ordered
        else f"{qid}: no LLM source answered it, left out"
        for qid in r.plan.table3_questions(kept=False)
    ]
    for qid, (model, base) in per_question_variants(r.rubric, r.plan.table3_questions()).items():
        q = r.rubric[qid]
        preds = {"model": r.prediction(model.name, qid), "base": r.prediction(base.name, qid)}
        aligned = align_methods(preds, r.annotations, q)
        if len(aligned.y) < 3:
            notes.append(f"{qid}: only {len(aligned.y)} annotated held-out pairs, skipped")
            continue
        tests = compare_methods(aligned, [("model", "base")], DROP_METRICS, s.permutations, s.seed, progress=False)
        record = {"question": qid, "name": q.name, "n": len(aligned.y)}
        for who, name in (("expected_llm", "base"), ("llm_rubric", "model")):
            metrics = evaluate(as_predictions(aligned, name, q), r.annotations, q)
            record[f"{who}_rmse"], record[f"{who}_pearson"] = metrics["rmse"], metrics["pearson"]
        for m in DROP_METRICS:
            record[f"p_{m}"] = float(tests[tests.metric == m].p_value.iloc[0])
        ref = reference.get(qid) or {}
        record["paper_expected_llm_rmse"], record["paper_expected_llm_pearson"] = (
            ref.get("rmse", math.nan),
            ref.get("pearson", math.nan),
        )
        records.append(record)
        star = lambda m: "*" if record[f"p_{m}"] < s.alpha else ""
        row = [
            f"{qid}" + (f" ({q.name})" if q.name else ""),
            str(record["n"]),
            fmt(record["expected_llm_rmse"]),
            fmt(record["expected_llm_pearson"]),
            Sup(fmt(record["llm_rubric_rmse"]), star("rmse")),
            Sup(fmt(record["llm_rubric_pearson"]), star("pearson")),
            fmt_p(record["p_rmse"]),
            fmt_p(record["p_pearson"]),
        ]
        if reference:
            row.append(
                f"{fmt(record['paper_expected_llm_rmse'])} / {fmt(record['paper_expected_llm_pearson'])}"
                if ref
                else "—"
            )
        rows.append(row)
    data = pd.DataFrame(records)
    header = [
        "question",
        "pairs",
        "expected LLM RMSE",
        "expected LLM Pearson",
        "LLM-Rubric RMSE",
        "LLM-Rubric Pearson",
        "p (RMSE)",
        "p (Pearson)",
    ]
    header += ["paper expected LLM RMSE / Pearson"] if reference else []
    text = (
        f"LLM-Rubric fine-tuned on each question in turn against the LLM's expected answer to that question. *: LLM-Rubric is "
        f"significantly better (one-sided paired permutation test, p < {s.alpha})."
    )
    table = Table("Table 3: per question", header, rows, "per_question.csv", data)
    return Section(
        "per_question", "Table 3: each question as the target", text, [table], notes=notes, numbers={"rows": data}
    )


def oracles(r: Results) -> Section:
    """Table 1, rows a–f: the network given the judge's own (or other judges') answers."""
    s = r.settings
    coverage = r.plan.depersonalized_coverage()
    rows_spec = oracle_variants(coverage >= s.depersonalized_min_coverage)
    notes = []
    if coverage < s.depersonalized_min_coverage:
        notes.append(
            f"depersonalized oracle (rows e, f) skipped: only {100 * coverage:.0f} % of the held-out pairs have another judge on the same "
            f"text (needs {100 * s.depersonalized_min_coverage:.0f} %)"
        )
    main = list(r.plan.methods)
    oracle_names = [v.name for _, v in rows_spec.values()]
    names = main + oracle_names
    aligned = align_methods({n: r.prediction(n) for n in names}, r.annotations, r.question)
    labels = {n: str(i + 1) for i, n in enumerate(main)} | {v.name: letter for letter, (_, v) in rows_spec.items()}
    display = {n: n for n in main} | {v.name: title for _, (title, v) in rows_spec.items()}
    pairs = list(itertools.combinations(oracle_names, 2)) + [(o, m) for o in oracle_names for m in main]
    tests = compare_methods(aligned, pairs, POINT_METRICS, s.permutations, s.seed)
    reference = dict(r.reference.get("oracles") or {})
    reference = {v.name: reference[letter] for letter, (_, v) in rows_spec.items() if letter in reference}
    sub = Aligned(
        aligned.pairs,
        aligned.y,
        aligned.answer_index,
        r.question,
        {n: aligned.means[n] for n in oracle_names},
        {n: aligned.probs[n] for n in oracle_names},
    )
    rows, data = _metric_rows(r, sub, oracle_names, labels, display, tests, main, reference)
    text = (
        f"The calibration network given the judge's own answers to the other questions as one-hot input (rows a–d), or the other "
        f"judges' mean answers (e, f). Superscripts as in Table 1; * = better than every method of Table 1 ({', '.join(main)})."
    )
    table = Table(
        "Table 1 (oracles)", _header(r.settings.confidence, "oracle", bool(reference)), rows, "oracles.csv", data
    )
    return Section(
        "oracles", "Table 1, rows a–f: oracles", text, [table], notes=notes, numbers={"rows": data, "tests": tests}
    )


def learning_curve(r: Results) -> Section:
    """The learning curve (Appendix J): metrics against the share of training texts."""
    s = r.settings
    variants = learning_curve_variants(r.plan.fractions())
    records = []
    for fraction, variant in variants.items():
        for seed in r.seeds_of(variant.name, s.lc_repetitions):
            metrics = evaluate(r.runs[(variant.name, seed)], r.annotations, r.question)
            records.append({"fraction": fraction, "repetition": seed, **{m: metrics[m] for m in METRICS}})
    data = pd.DataFrame(records)
    summary = data.groupby("fraction")[list(METRICS)].agg(["mean", "std"])
    summary.columns = [f"{m}_{'sd' if stat == 'std' else stat}" for m, stat in summary.columns]
    summary = summary.reset_index()
    full = variants[max(variants)].name
    predictions = {}
    for variant in variants.values():
        predictions[variant.name] = r.prediction(variant.name, limit=s.lc_repetitions)
    aligned = align_methods(predictions, r.annotations, r.question)
    tests = drop_tests(r, full, [v.name for v in variants.values() if v.name != full], aligned)
    for m in DROP_METRICS:
        p = {row.method_b: row.p_value for row in tests[tests.metric == m].itertuples()}
        summary[f"p_{m}_drop"] = [p.get(variants[f].name, math.nan) for f in summary.fraction]
    rows = []
    for point in summary.itertuples():
        drop = lambda m: "▽" if getattr(point, f"p_{m}_drop") < s.alpha else ""
        rows.append(
            [f"{100 * point.fraction:.0f} %"]
            + [
                Sup(
                    f"{fmt(getattr(point, f'{m}_mean'))} ± {fmt(getattr(point, f'{m}_sd'))}",
                    drop(m) if m in DROP_METRICS else "",
                )
                for m in METRICS
            ]
        )
    text = (
        f"LLM-Rubric trained on a random share of the training texts, {s.lc_repetitions} repetitions per share (each its own sample "
        f"and seed); mean ± sd. ▽: the repetitions' averaged predictions are significantly worse than with all training data "
        f"(one-sided paired permutation test, p < {s.alpha})."
    )
    title = f"{r.question.id}: learning curve (mean ± 1 sd over {s.lc_repetitions} repetitions)"
    figure = (
        title,
        "learning_curve.png",
        png_bytes(learning_curve_figure(summary, ["rmse", "pearson", "nll"], title)),
    )
    table = Table("Learning curve", ["training data"] + [m for m in METRICS], rows, "learning_curve.csv", data)
    summary_table = Table("Learning curve summary", [], [], "learning_curve_summary.csv", summary)
    return Section(
        "learning_curve",
        "Learning curve (Appendix J)",
        text,
        [table, summary_table],
        [figure],
        numbers={"rows": data, "summary": summary},
    )


BUILDERS = {
    "table1": table1,
    "calibration": calibration.calibration,
    "ablations": ablations,
    "per_question": per_question,
    "oracles": oracles,
    "learning_curve": learning_curve,
}


def build_sections(r: Results) -> tuple[list[Section], dict[str, float]]:
    """The sections of ``r.settings.sections`` in report order, and the seconds each took."""
    sections, seconds = [], {}
    for key in SECTIONS:
        if key in r.settings.sections:
            start = time.perf_counter()
            sections.append(BUILDERS[key](r))
            seconds[key] = round(time.perf_counter() - start, 1)
    return sections, seconds
