"""The evaluation report: significance, calibration, ablations, per-question, oracles, learning curves.

    python evaluate.py report=full experiment=llm_rubric_real

:func:`build_report` trains every variant the chosen sections need under the
experiment's protocol (:mod:`llmrubric.training.studies`), computes every number and writes one
self-contained folder: ``report.md``, ``report.html`` (tables and figures embedded),
``report.json`` and one CSV per table (every number), and ``figures/*.png``. The folder is
written under a temporary name and renamed into place, so a failure leaves no partial
report. :func:`report_from_config` does the same from a composed Hydra config and returns
the folder (what an MLflow run logs as artifacts).

Learned methods are trained with ``seeds`` seeds; a method's prediction for a pair is the
mean of its seeds' predicted distributions (and point predictions), and the spread of the
single-seed metrics is reported beside it.
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from llmrubric.evaluation.calibration import calibration_groups, reliability_diagram
from llmrubric.evaluation.metrics import METRICS, evaluate, seed_sd
from llmrubric.evaluation.significance import (
    POINT_METRICS,
    Aligned,
    align_methods,
    bootstrap_intervals,
    compare_methods,
    superscripts,
)
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.schemas import _umask, json_safe
from llmrubric.model.baselines import METHODS
from llmrubric.model.encoding import FeatureLayout
from llmrubric.model.oracles import JudgeAnswers
from llmrubric.report.plots import judge_distribution_figure, learning_curve_figure, png_bytes, reliability_figure
from llmrubric.training.experiment import (
    FOLDS_FILE,
    Split,
    load_data,
    load_rubric,
    make_folds,
    prepare,
    splits_from_folds,
)
from llmrubric.training.studies import (
    Variant,
    ablation_variants,
    ensemble,
    learning_curve_variants,
    oracle_variants,
    per_question_variants,
    run_variants,
    table1_variants,
)

log = logging.getLogger(__name__)
LLM_ANSWER_METHODS = ("argmax_llm", "expected_llm", "calibrated_q0")  # need an LLM's answers to the main question
SECTIONS = ("table1", "calibration", "ablations", "per_question", "oracles", "learning_curve")
DROP_METRICS = ("rmse", "pearson")


@dataclass
class ReportSettings:
    """What the report computes (``conf/report/*.yaml``)."""

    sections: list[str] = field(default_factory=lambda: list(SECTIONS))
    methods: list[str] | None = None
    seeds: int = 3
    workers: int = 1
    seed: int = 0
    permutations: int = 10_000
    bootstrap: int = 1000
    alpha: float = 0.05
    confidence: float = 0.95
    calibration_bootstrap: int = 200
    calibration_min_examples: int = 30
    diagram_bootstrap: int = 100
    judge_figure_min_pairs: int = 15
    ablation_questions: list[str] | None = None
    per_question: list[str] | None = None
    lc_fractions: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    lc_repetitions: int = 3
    depersonalized_min_coverage: float = 0.5
    model: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict) -> ReportSettings:
        """Settings from ``report.*`` config keys; a bad value is an InputError naming the key."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k not in ("enabled", "name", "dir")}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(
                f"unknown report setting(s) {unknown}; known: {sorted(known)}", column=f"report.{unknown[0]}"
            )
        self = cls(**data)
        self.check()
        return self

    def __post_init__(self) -> None:
        if self.methods is None:
            self.methods = list(METHODS)

    def check(self) -> None:
        def bad(key, message):
            raise InputError(f"report.{key}: {message}", column=f"report.{key}")

        if not self.sections or set(self.sections) - set(SECTIONS):
            bad("sections", f"must be a non-empty subset of {list(SECTIONS)}, got {self.sections}")
        if set(self.methods) - set(METHODS) or "llm_rubric" not in self.methods:
            bad("methods", f"must include llm_rubric and only methods of {list(METHODS)}, got {self.methods}")
        for key in ("seeds", "workers", "permutations", "bootstrap", "lc_repetitions"):
            if int(getattr(self, key)) < 1:
                bad(key, f"must be >= 1, got {getattr(self, key)}")
        for key in ("calibration_bootstrap", "diagram_bootstrap", "calibration_min_examples", "judge_figure_min_pairs"):
            if int(getattr(self, key)) < 0:
                bad(key, f"must be >= 0, got {getattr(self, key)}")
        if not 0 < self.alpha < 1:
            bad("alpha", f"must be in (0, 1), got {self.alpha}")
        if not 0 < self.confidence < 1:
            bad("confidence", f"must be in (0, 1), got {self.confidence}")
        if not self.lc_fractions or any(not 0 < float(f) <= 1 for f in self.lc_fractions):
            bad("lc_fractions", f"must be shares in (0, 1], got {self.lc_fractions}")


@dataclass
class Sup:
    """A table cell with Table 1-style significance marks."""

    text: str
    sup: str = ""


@dataclass
class Table:
    caption: str
    header: list[str]
    rows: list[list]
    csv: str
    data: pd.DataFrame


@dataclass
class Section:
    key: str
    title: str
    text: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[str, str, bytes]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)


def fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.{digits}f}"


def fmt_ci(value, low, high) -> str:
    return f"{fmt(value)} [{fmt(low)}, {fmt(high)}]" if math.isfinite(low) and math.isfinite(high) else fmt(value)


def fmt_p(p) -> str:
    return "—" if p is None or not math.isfinite(p) else (f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}")


class ReportBuilder:
    """Trains the variants of the chosen sections and turns their predictions into sections."""

    def __init__(
        self,
        rubric: Rubric,
        splits: list[Split],
        settings: ReportSettings,
        model: dict,
        trainer: dict,
        reference: dict | None = None,
    ):
        self.rubric, self.splits, self.settings = rubric, splits, settings
        self.model, self.trainer = dict(model), dict(trainer)
        self.reference = reference or {}
        self.question = rubric.main
        self.annotations = pd.concat([s.test.annotations for s in splits], ignore_index=True)
        self._check_questions()
        self.llm_questions = self._feature_questions()
        self.methods = [
            m for m in settings.methods if self.question.id in self.llm_questions or m not in LLM_ANSWER_METHODS
        ]
        self.method_notes = [
            f"{m} left out: no LLM source answered {self.question.id} in the features"
            for m in settings.methods
            if m not in self.methods
        ]

    def _feature_questions(self) -> list[str]:
        """Rubric questions that some LLM source answered (have a feature block)."""
        layout = FeatureLayout.from_features(self.splits[0].train.features, self.rubric)
        return [q for q in self.rubric.ids if any(b.question_id == q for b in layout.blocks)]

    def _check_questions(self) -> None:
        check_questions(self.settings, self.rubric)

    def depersonalized_coverage(self) -> float:
        judge_answers = JudgeAnswers(self.rubric, others=True)
        return min(judge_answers.coverage(s.test) for s in self.splits)

    def requests(self) -> dict[Variant, int]:
        """Every variant the sections need, with its number of seeds."""
        s = self.settings
        out: dict[Variant, int] = {}

        def add(variant: Variant, seeds: int = s.seeds):
            out[variant] = max(out.get(variant, 0), seeds)

        sections = set(s.sections)
        if sections & {"table1", "oracles"}:
            for v in table1_variants(self.methods):
                add(v)
        if "calibration" in sections:
            add(Variant("llm_rubric"))
            if self.question.id in self.llm_questions:
                add(Variant("expected_llm", method="expected_llm"))
        if "ablations" in sections:
            for v in ablation_variants(self.rubric, self._ablation_questions()).values():
                add(v)
        if "per_question" in sections:
            for model, base in per_question_variants(self.rubric, self._per_question()).values():
                add(model)
                add(base)
        if "oracles" in sections:
            for _, v in oracle_variants(self.depersonalized_coverage() >= s.depersonalized_min_coverage).values():
                add(v)
        if "learning_curve" in sections:
            for v in learning_curve_variants(self._fractions()).values():
                add(v, s.lc_repetitions)
        return out

    def _ablation_questions(self) -> list[str]:
        return (
            list(self.settings.ablation_questions)
            if self.settings.ablation_questions is not None
            else self._feature_questions()
        )

    def _per_question(self, kept: bool = True) -> list[str]:
        """The questions of Table 3 (``kept=False``: those left out): answered by the judges, ordered and
        answered by an LLM source."""
        ids = self.settings.per_question if self.settings.per_question is not None else self.rubric.ids
        answered = set(self.annotations.question_id)
        return [q for q in ids if q in answered and (self.rubric[q].ordered and q in self.llm_questions) == kept]

    def _fractions(self) -> list[float]:
        return sorted({float(f) for f in self.settings.lc_fractions})

    def run(self) -> list[Section]:
        s = self.settings
        start = time.perf_counter()
        self.results = run_variants(self.requests(), self.rubric, self.splits, self.model, self.trainer, s.workers)
        self.timings = {"training": round(time.perf_counter() - start, 1)}
        builders = {
            "table1": self.table1,
            "calibration": self.calibration,
            "ablations": self.ablations,
            "per_question": self.per_question,
            "oracles": self.oracles,
            "learning_curve": self.learning_curve,
        }
        sections = []
        for key in SECTIONS:
            if key in s.sections:
                start = time.perf_counter()
                sections.append(builders[key]())
                self.timings[key] = round(time.perf_counter() - start, 1)
        return sections

    def seeds_of(self, name: str, limit: int | None = None) -> list[int]:
        """The variant's trained seeds, the first ``limit`` (default: the report's ``seeds``)."""
        return sorted(seed for n, seed in self.results if n == name)[: limit or self.settings.seeds]

    def prediction(self, name: str, question: str | None = None, limit: int | None = None) -> pd.DataFrame:
        """The seed-averaged predictions of a variant."""
        frames = [self.results[(name, seed)] for seed in self.seeds_of(name, limit)]
        return ensemble(frames, self.rubric, question or self.question.id)

    def per_seed_metrics(self, name: str, question=None) -> list[dict]:
        question = question or self.question
        return [evaluate(self.results[(name, seed)], self.annotations, question) for seed in self.seeds_of(name)]

    # -- Table 1 -------------------------------------------------------------------------
    def _metric_rows(
        self,
        aligned: Aligned,
        names: list[str],
        labels: dict[str, str],
        display: dict[str, str],
        tests: pd.DataFrame,
        star_group: list[str] | None,
        reference: dict,
    ) -> tuple[list[list], pd.DataFrame]:
        s = self.settings
        marks = {m: superscripts(tests, labels, m, s.alpha, star_group) for m in POINT_METRICS}
        rows, records = [], []
        for i, name in enumerate(tqdm(names, desc="bootstrap", unit="method", leave=False)):
            metrics = evaluate(_as_predictions(aligned, name, self.question), self.annotations, self.question)
            ci = bootstrap_intervals(
                aligned.y,
                aligned.means[name],
                aligned.probs[name],
                aligned.answer_index,
                s.bootstrap,
                s.seed + 100 * i,
                s.confidence,
            )
            seeds = self.per_seed_metrics(name) if len(self.seeds_of(name)) > 1 else []
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
                Sup(fmt_ci(record[m], record[f"{m}_low"], record[f"{m}_high"]), record[f"{m}_marks"])
                for m in POINT_METRICS
            ]
            row.append(fmt_ci(record["nll"], record["nll_low"], record["nll_high"]))
            row.append(f"{fmt(record['pearson_seed_mean'])} ± {fmt(record['pearson_seed_sd'])}" if seeds else "—")
            if reference:
                row.append(f"{fmt(record['paper_rmse'])} / {fmt(record['paper_pearson'])}" if ref else "—")
            rows.append(row)
        return rows, pd.DataFrame(records)

    def _header(self, first: str, reference: bool) -> list[str]:
        ci = f"{round(100 * self.settings.confidence)} % CI"
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

    def table1(self) -> Section:
        s = self.settings
        names = list(self.methods)
        aligned = align_methods({n: self.prediction(n) for n in names}, self.annotations, self.question)
        labels = {n: str(i + 1) for i, n in enumerate(names)}
        tests = compare_methods(aligned, list(itertools.combinations(names, 2)), POINT_METRICS, s.permutations, s.seed)
        reference = dict(self.reference.get("table1") or {})
        rows, data = self._metric_rows(aligned, names, labels, {n: n for n in names}, tests, None, reference)
        text = (
            f"{self.question.id} on {len(aligned.y)} held-out (text, judge) pairs, pooled. Superscripts: the row is "
            f"significantly better than the rows named (paired permutation test, {s.permutations:,} permutations, one-sided, "
            f"p < {s.alpha}). Intervals: percentile bootstrap over pairs ({s.bootstrap:,} resamples). Learned methods: mean of "
            f"{s.seeds} seed(s)' predictions; 'Pearson over seeds' is the single-seed spread (mean ± sd)."
        )
        table = Table("Table 1: methods", self._header("method", bool(reference)), rows, "table1.csv", data)
        sig = Table("Pairwise permutation tests", [], [], "significance.csv", tests)
        return Section(
            "table1",
            "Table 1: methods and significance",
            text,
            [table, sig],
            notes=list(self.method_notes),
            numbers={"rows": data, "tests": tests},
        )

    # -- calibration -----------------------------------------------------------------------
    def calibration(self) -> Section:
        s = self.settings
        q = self.question
        compared = ["llm_rubric"] + (["expected_llm"] if self.question.id in self.llm_questions else [])
        aligned = align_methods({n: self.prediction(n) for n in compared}, self.annotations, q)
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
        records = [row for r in results for row in r.rows]
        data = pd.DataFrame(records)
        pooled = data[data.kind == "all"]
        section.text = (
            f"smECE (relplot) of the predicted probability of each answer of {q.id} for LLM-Rubric on {len(answers)} held-out pairs, "
            f"with {round(100 * s.confidence)} % basic bootstrap intervals ({s.calibration_bootstrap} resamples, as relplot). "
            f"Per judge and per system where a group has at least {s.calibration_min_examples} pairs."
        )
        rows = [
            [
                r.kind,
                r.group,
                r.answer,
                str(r.n),
                str(r.positives),
                fmt(r.mean_forecast),
                fmt(r.frequency),
                fmt_ci(r.smece, r.low, r.high),
            ]
            for r in data.itertuples()
        ]
        section.tables.append(
            Table(
                "smECE per answer value",
                ["kind", "group", "answer", "pairs", "answered", "mean p", "frequency", "smECE [CI]"],
                rows,
                "calibration.csv",
                data,
            )
        )
        for r in tqdm(results, desc="reliability diagrams", unit="group", leave=False):
            panels = []
            group_rows = (
                np.arange(len(answers))
                if r.kind == "all"
                else np.flatnonzero(groups[r.kind].astype(str).to_numpy() == r.group)
            )
            for j, row in enumerate(r.rows):
                y = (answers[group_rows] == j).astype(float)
                panels.append(
                    (
                        row["answer"],
                        reliability_diagram(
                            probs[group_rows, j],
                            y,
                            row["smece"],
                            row["low"],
                            row["high"],
                            s.diagram_bootstrap,
                            s.seed + j,
                        ),
                    )
                )
            title = (
                f"{q.id} reliability, all pairs (n={r.n})"
                if r.kind == "all"
                else f"{q.id} reliability, {r.kind} {r.group} (n={r.n})"
            )
            name = "reliability_all.png" if r.kind == "all" else f"reliability_{r.kind}_{_slug(r.group)}.png"
            section.figures.append((title, name, png_bytes(reliability_figure(panels, title))))
        section.figures.append(self._judge_figure(aligned, section.notes))
        section.numbers = {
            "smece": {
                row.answer: {"value": row.smece, "low": row.low, "high": row.high} for row in pooled.itertuples()
            },
            "rows": data,
        }
        return section

    def _judge_figure(self, aligned: Aligned, notes: list[str]) -> tuple[str, str, bytes]:
        q, s = self.question, self.settings
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

    # -- ablations -------------------------------------------------------------------------
    def _drop_tests(self, full: str, others: list[str], aligned: Aligned) -> pd.DataFrame:
        return compare_methods(
            aligned, [(full, o) for o in others], DROP_METRICS, self.settings.permutations, self.settings.seed
        )

    def ablations(self) -> Section:
        s = self.settings
        variants = ablation_variants(self.rubric, self._ablation_questions())
        names = {display: v.name for display, v in variants.items()}
        aligned = align_methods({v: self.prediction(v) for v in names.values()}, self.annotations, self.question)
        tests = self._drop_tests("llm_rubric", [v for v in names.values() if v != "llm_rubric"], aligned)
        reference = dict(self.reference.get("table2") or {})
        records, rows = [], []
        for display, name in names.items():
            metrics = evaluate(_as_predictions(aligned, name, self.question), self.annotations, self.question)
            seeds = self.per_seed_metrics(name) if len(self.seeds_of(name)) > 1 else []
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
            r["ablation"]
            for r in records
            if r["variant"] != "llm_rubric" and (r["p_rmse"] < s.alpha or r["p_pearson"] < s.alpha)
        ]
        text = (
            f"Each variant is trained like LLM-Rubric ({s.seeds} seed(s), predictions averaged) with one design decision or one feature "
            f"question removed. ▽: significantly worse than the full model (one-sided paired permutation test, p < {s.alpha}). "
            f"Significant drops: {', '.join(significant) if significant else 'none'}."
        )
        table = Table("Table 2: ablations", header, rows, "ablations.csv", data)
        return Section("ablations", "Table 2: ablations", text, [table], numbers={"rows": data, "tests": tests})

    # -- per question ----------------------------------------------------------------------
    def per_question(self) -> Section:
        s = self.settings
        reference = dict(self.reference.get("table3") or {})
        records, rows = [], []
        notes = [
            f"{qid}: categorical, left out (RMSE and Pearson need ordered numeric options)"
            if not self.rubric[qid].ordered
            else f"{qid}: no LLM source answered it, left out"
            for qid in self._per_question(kept=False)
        ]
        for qid, (model, base) in per_question_variants(self.rubric, self._per_question()).items():
            q = self.rubric[qid]
            preds = {"model": self.prediction(model.name, qid), "base": self.prediction(base.name, qid)}
            aligned = align_methods(preds, self.annotations, q)
            if len(aligned.y) < 3:
                notes.append(f"{qid}: only {len(aligned.y)} annotated held-out pairs, skipped")
                continue
            tests = compare_methods(aligned, [("model", "base")], DROP_METRICS, s.permutations, s.seed, progress=False)
            record = {"question": qid, "name": q.name, "n": len(aligned.y)}
            for who, name in (("expected_llm", "base"), ("llm_rubric", "model")):
                metrics = evaluate(_as_predictions(aligned, name, q), self.annotations, q)
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

    # -- oracles ---------------------------------------------------------------------------
    def oracles(self) -> Section:
        s = self.settings
        coverage = self.depersonalized_coverage()
        rows_spec = oracle_variants(coverage >= s.depersonalized_min_coverage)
        notes = []
        if coverage < s.depersonalized_min_coverage:
            notes.append(
                f"depersonalized oracle (rows e, f) skipped: only {100 * coverage:.0f} % of the held-out pairs have another judge on the same "
                f"text (needs {100 * s.depersonalized_min_coverage:.0f} %)"
            )
        main = list(self.methods)
        oracle_names = [v.name for _, v in rows_spec.values()]
        names = main + oracle_names
        aligned = align_methods({n: self.prediction(n) for n in names}, self.annotations, self.question)
        labels = {n: str(i + 1) for i, n in enumerate(main)} | {v.name: letter for letter, (_, v) in rows_spec.items()}
        display = {n: n for n in main} | {v.name: title for _, (title, v) in rows_spec.items()}
        pairs = list(itertools.combinations(oracle_names, 2)) + [(o, m) for o in oracle_names for m in main]
        tests = compare_methods(aligned, pairs, POINT_METRICS, s.permutations, s.seed)
        reference = dict(self.reference.get("oracles") or {})
        reference = {v.name: reference[letter] for letter, (_, v) in rows_spec.items() if letter in reference}
        sub = Aligned(
            aligned.pairs,
            aligned.y,
            aligned.answer_index,
            self.question,
            {n: aligned.means[n] for n in oracle_names},
            {n: aligned.probs[n] for n in oracle_names},
        )
        rows, data = self._metric_rows(sub, oracle_names, labels, display, tests, main, reference)
        text = (
            f"The calibration network given the judge's own answers to the other questions as one-hot input (rows a–d), or the other "
            f"judges' mean answers (e, f). Superscripts as in Table 1; * = better than every method of Table 1 ({', '.join(main)})."
        )
        table = Table("Table 1 (oracles)", self._header("oracle", bool(reference)), rows, "oracles.csv", data)
        return Section(
            "oracles", "Table 1, rows a–f: oracles", text, [table], notes=notes, numbers={"rows": data, "tests": tests}
        )

    # -- learning curve --------------------------------------------------------------------
    def learning_curve(self) -> Section:
        s = self.settings
        variants = learning_curve_variants(self._fractions())
        records = []
        for fraction, variant in variants.items():
            for seed in self.seeds_of(variant.name, s.lc_repetitions):
                metrics = evaluate(self.results[(variant.name, seed)], self.annotations, self.question)
                records.append({"fraction": fraction, "repetition": seed, **{m: metrics[m] for m in METRICS}})
        data = pd.DataFrame(records)
        summary = data.groupby("fraction")[list(METRICS)].agg(["mean", "std"])
        summary.columns = [f"{m}_{'sd' if stat == 'std' else stat}" for m, stat in summary.columns]
        summary = summary.reset_index()
        full = variants[max(variants)].name
        predictions = {}
        for variant in variants.values():
            predictions[variant.name] = self.prediction(variant.name, limit=s.lc_repetitions)
        aligned = align_methods(predictions, self.annotations, self.question)
        tests = self._drop_tests(full, [v.name for v in variants.values() if v.name != full], aligned)
        for m in DROP_METRICS:
            p = {row.method_b: row.p_value for row in tests[tests.metric == m].itertuples()}
            summary[f"p_{m}_drop"] = [p.get(variants[f].name, math.nan) for f in summary.fraction]
        rows = []
        for r in summary.itertuples():
            drop = lambda m: "▽" if getattr(r, f"p_{m}_drop") < s.alpha else ""
            rows.append(
                [f"{100 * r.fraction:.0f} %"]
                + [
                    Sup(
                        f"{fmt(getattr(r, f'{m}_mean'))} ± {fmt(getattr(r, f'{m}_sd'))}",
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
        title = f"{self.question.id}: learning curve (mean ± 1 sd over {s.lc_repetitions} repetitions)"
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


def _as_predictions(aligned: Aligned, name: str, question) -> pd.DataFrame:
    frame = aligned.pairs.assign(question_id=question.id)
    for j, key in enumerate(question.keys):
        frame[f"p_{key}"] = aligned.probs[name][:, j]
    return frame.assign(mean=aligned.means[name], var=0.0)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in str(text))


# -- rendering -------------------------------------------------------------------------------
CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.6em 0 1.2em;font-size:0.85em}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:nth-child(-n+2){text-align:left}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:0.85em;color:#555}.notes{color:#8a5a00;font-size:0.9em}
"""
FIGURE_CHECK = """
<script>
window.addEventListener('load', () => {
  const images = Array.from(document.images);
  const loaded = images.filter(i => i.complete && i.naturalWidth > 0).length;
  const el = document.getElementById('figure-check');
  el.dataset.loaded = loaded; el.dataset.total = images.length;
  el.textContent = loaded + ' of ' + images.length + ' figures loaded';
});
</script>
"""


def _cell_md(cell) -> str:
    if isinstance(cell, Sup):
        return cell.text + (f"<sup>{cell.sup}</sup>" if cell.sup else "")
    return str(cell).replace("|", "\\|")


def _cell_html(cell) -> str:
    if isinstance(cell, Sup):
        return html.escape(cell.text) + (f"<sup>{html.escape(cell.sup)}</sup>" if cell.sup else "")
    return html.escape(str(cell))


def render_markdown(title: str, meta: dict, sections: list[Section]) -> str:
    out = [f"# {title}", ""]
    out += [f"- **{k}**: {v}" for k, v in meta.items()] + [""]
    for section in sections:
        out += [f"## {section.title}", "", section.text, ""]
        for table in section.tables:
            if not table.header:
                out += [f"All numbers: [`{table.csv}`]({table.csv}).", ""]
                continue
            out += [f"**{table.caption}** ([`{table.csv}`]({table.csv}))", ""]
            out.append("| " + " | ".join(table.header) + " |")
            out.append("|" + "---|" * len(table.header))
            out += ["| " + " | ".join(_cell_md(c) for c in row) + " |" for row in table.rows]
            out.append("")
        for caption, name, _ in section.figures:
            out += [f"![{caption}](figures/{name})", ""]
        if section.notes:
            out += ["Notes:", ""] + [f"- {n}" for n in section.notes] + [""]
    return "\n".join(out)


def render_html(title: str, meta: dict, sections: list[Section]) -> str:
    e = html.escape
    out = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    out.append("<ul>" + "".join(f"<li><b>{e(str(k))}</b>: {e(str(v))}</li>" for k, v in meta.items()) + "</ul>")
    out.append("<p id='figure-check' data-loaded='0' data-total='-1'></p>")
    for section in sections:
        out.append(f"<section id='{e(section.key)}'><h2>{e(section.title)}</h2><p>{e(section.text)}</p>")
        for table in section.tables:
            if not table.header:
                out.append(f"<p>All numbers: <a href='{e(table.csv)}'>{e(table.csv)}</a></p>")
                continue
            out.append(
                f"<table class='report-table' id='{e(Path(table.csv).stem)}'><caption>{e(table.caption)} (<a href='{e(table.csv)}'>{e(table.csv)}</a>)</caption>"
            )
            out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in table.header) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{_cell_html(c)}</td>" for c in row) + "</tr>" for row in table.rows]
            out.append("</table>")
        for caption, name, data in section.figures:
            src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
            out.append(
                f"<figure><img alt='{e(caption)}' data-file='figures/{e(name)}' src='{src}'><figcaption>{e(caption)}</figcaption></figure>"
            )
        if section.notes:
            out.append(
                "<div class='notes'><b>Notes</b><ul>"
                + "".join(f"<li>{e(n)}</li>" for n in section.notes)
                + "</ul></div>"
            )
        out.append("</section>")
    out.append(FIGURE_CHECK + "</body></html>")
    return "\n".join(out)


def _records(df: pd.DataFrame) -> list[dict]:
    return [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        for row in df.to_dict(orient="records")
    ]


def _numbers_json(sections: list[Section], meta: dict) -> dict:
    out: dict = {"meta": meta}
    for section in sections:
        out[section.key] = {k: (_records(v) if isinstance(v, pd.DataFrame) else v) for k, v in section.numbers.items()}
    return out


def write_report_folder(out_dir: str | Path, files: dict[str, bytes]) -> Path:
    """Write ``files`` (relative path → bytes) as the folder ``out_dir``, atomically.

    Everything goes to a temporary sibling folder that is renamed onto ``out_dir``; an
    existing report there is replaced only once the new one is complete.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    old = None
    try:
        for rel, data in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        os.chmod(tmp, 0o777 & ~_umask())
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
            os.rename(out, old / out.name)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / out.name).exists() and not out.exists():
            os.rename(old / out.name, out)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out


def build_report(
    rubric: Rubric,
    splits: list[Split],
    settings: ReportSettings,
    out_dir: str | Path,
    model: dict | None = None,
    trainer: dict | None = None,
    reference: dict | None = None,
    title: str | None = None,
    meta: dict | None = None,
) -> Path:
    """Train, evaluate and write the report folder; returns its path."""
    start = time.perf_counter()
    builder = ReportBuilder(rubric, splits, settings, {**(model or {}), **settings.model}, trainer or {}, reference)
    sections = builder.run()
    title = title or f"Evaluation report: {rubric.main.id}"
    meta = {
        **(meta or {}),
        "question": rubric.main.id,
        "held-out pairs": int(len(builder.annotations[builder.annotations.question_id == rubric.main.id])),
        "splits": len(splits),
        "seeds": settings.seeds,
        "permutations": settings.permutations,
        "bootstrap resamples": settings.bootstrap,
        "model settings changed for the report": settings.model or "none",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "",
    }
    meta["seconds"] = round(time.perf_counter() - start, 1)
    meta["seconds per step"] = ", ".join(f"{k} {v}" for k, v in builder.timings.items())
    files: dict[str, bytes] = {}
    for section in sections:
        for table in section.tables:
            files[table.csv] = table.data.to_csv(index=False).encode()
        for _, name, data in section.figures:
            files[f"figures/{name}"] = data
    files["report.md"] = render_markdown(title, meta, sections).encode()
    files["report.html"] = render_html(title, meta, sections).encode()
    files["report.json"] = (
        json.dumps(json_safe(_numbers_json(sections, meta)), indent=2, allow_nan=False) + "\n"
    ).encode()
    path = write_report_folder(out_dir, files)
    log.info("report written to %s in %.0fs", path, time.perf_counter() - start)
    return path


def experiment_splits(cfg: DictConfig) -> tuple[Rubric, list[Split]]:
    """The experiment's rubric and splits: the folds saved in ``run_dir`` when present, else made from the config (not saved)."""
    if cfg.data.get("test") or (Path(cfg.run_dir) / FOLDS_FILE).exists():
        return prepare(cfg, create_folds=False)
    rubric = load_rubric(cfg)
    train, test = load_data(cfg, rubric)
    return rubric, splits_from_folds(cfg, make_folds(cfg, train), train, test)


def check_questions(settings: ReportSettings, rubric: Rubric) -> None:
    if not rubric.main.ordered:
        raise InputError(
            f"the report needs an ordered main question; {rubric.main.id} is categorical "
            "(evaluate.py without report= scores it by accuracy, macro-F1, NLL and Brier)",
            column="main_question",
        )
    for key, ids in (("ablation_questions", settings.ablation_questions), ("per_question", settings.per_question)):
        unknown = [q for q in (ids or []) if q not in rubric]
        if unknown:
            raise InputError(
                f"report.{key}: question(s) {unknown} are not in the rubric {rubric.ids}", column=f"report.{key}"
            )


def settings_from_config(cfg: DictConfig) -> ReportSettings:
    return ReportSettings.from_dict(OmegaConf.to_container(cfg.report, resolve=True))


def check_report_config(cfg: DictConfig, rubric: Rubric) -> ReportSettings:
    """Validate ``report.*`` before anything is trained or written; InputError names the key."""
    settings = settings_from_config(cfg)
    check_questions(settings, rubric)
    return settings


def report_from_config(cfg: DictConfig, rubric: Rubric, splits: list[Split]) -> Path:
    """The report of an experiment config (``report=fast|full``); returns the folder (to log as MLflow artifacts)."""
    settings = settings_from_config(cfg)
    reference = OmegaConf.to_container(cfg.reference, resolve=True) if cfg.get("reference") else {}
    meta = {"experiment": cfg.name, "protocol": cfg.protocol, "report mode": cfg.report.name}
    title = f"{cfg.name}: evaluation report ({rubric.main.id}, {cfg.protocol})"
    return build_report(
        rubric, splits, settings, cfg.report.dir, dict(cfg.model), dict(cfg.trainer), reference, title, meta
    )
