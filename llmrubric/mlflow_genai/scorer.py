"""A scorer for ``mlflow.genai.evaluate`` built from a trained checkpoint: calibrated, judge-free scores.

For each row :class:`CalibratedScorer` reads the LLM's answer distributions (the row's trace's
``LLM_JUDGE`` feedback, as :func:`llmrubric.mlflow_genai.read.read_traces` reads them, or a features
table given to the scorer, matched by the trace's text id or ``inputs["text_id"]``) and returns one
``Feedback`` per scored rubric question: the judge-free calibrated score (the mean over the
checkpoint's trusted judges, as ``llmrubric score texts`` computes it) as the value, its conformal
interval and the predicted distribution in the metadata, a rationale naming the checkpoint, the
coverage and the level used.

A checkpoint with a system level (the shipped ``model=auto`` given 5+ labelled systems) scores a text
within its system, and a system level is a property of the whole system: the scorer reads a trace's
system from the tag ``system_tag`` (as ``llmrubric import mlflow --system-tag``) and scores all the
traces of that system in the trace's experiment together, once, as ``score texts`` scores the texts of
``import mlflow``: a training system gets the level its labels gave it; a new system the level its
texts' LLM answers predict (the checkpoint's prior, wider beyond the training systems' range). A
trace without the tag is a scorer error on its row, naming the tag, never a value; a checkpoint with a
system level and no ``system_tag`` (nor ``texts`` with ``system_id`` for a features table) is an error
when the scorer is made. With a level, each row also gets the system view: feedback
``<name>/<main question>/system/<system>`` (the system's level) and ``.../lo``, ``.../hi`` (its central
interval at ``coverage`` of the level's Student t), so evaluate's metrics hold every system's level.

The checkpoint is loaded once; scoring holds a lock, so evaluate's thread pool may call the scorer
concurrently. A row without features of the checkpoint is a scorer error (MLflow records it on the
row), never a value. Evaluate's metrics then hold ``<name>/<question>/mean``, the calibrated system
score of the rows scored (``name``: the scorer's, so that two checkpoints' scorers do not collide).
"""

from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow.entities import AssessmentSource, Feedback
from mlflow.genai.scorers import Scorer
from pydantic import PrivateAttr

from llmrubric.io.errors import InputError
from llmrubric.io.predictions import probabilities
from llmrubric.io.tables import read_table, validate_features
from llmrubric.mlflow_genai.read import CODE, read_traces, search_traces, trace_text_id
from llmrubric.model.core.checkpoints import load_model
from llmrubric.model.core.registry import capabilities
from llmrubric.model.core.system_level import t_interval
from llmrubric.scoring.intervals import DEFAULT_COVERAGE
from llmrubric.scoring.scores import ScoreResult, score_texts

SYSTEM_NAME = "{name}/{question}/system/{system}"  # the system view's feedback: the level, then /lo and /hi


class CalibratedScorer(Scorer):
    """``CalibratedScorer(checkpoint="outputs/mine/fold0.safetensors", system_tag="app_version")``; optional
    ``features`` (a features table file) with ``texts`` (its texts table: ``system_id``), ``questions`` and
    ``judges`` (the trusted set; default: all of the checkpoint's) and ``coverage`` of the intervals."""

    name: str = "llmrubric"
    checkpoint: str
    system_tag: str | None = None
    features: str | None = None
    texts: str | None = None
    questions: list[str] | None = None
    judges: list[str] | None = None
    coverage: float = DEFAULT_COVERAGE

    _model: Any = PrivateAttr(default=None)
    _table: Any = PrivateAttr(default=None)
    _texts: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _systems: dict = PrivateAttr(default_factory=dict)  # (experiment, system) or the table → its ScoreResult

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        self._model = load_model(self.checkpoint)
        if self.features is not None:
            self._table = validate_features(read_table(self.features, "features"), self._model.rubric)
        if self.texts is not None:
            self._texts = read_table(self.texts, "texts")
        if self.levelled and not (self._has_systems() if self.features else self.system_tag):
            raise InputError(
                f"checkpoint {Path(self.checkpoint).name} has a system level: a text is scored within its system; "
                + (
                    "give texts (a texts table with every text's system_id) with the features table"
                    if self.features
                    else "give system_tag (the traces' tag of the system, as `import mlflow --system-tag`)"
                ),
                setting="texts" if self.features else "system_tag",
            )

    @property
    def levelled(self) -> bool:
        """Whether the checkpoint has a system level (its predictions of a text depend on the text's system)."""
        return bool(capabilities(self._model).system_level and self._model.levels_)

    def _has_systems(self) -> bool:
        return self._texts is not None and "system_id" in self._texts and self._texts.system_id.notna().all()

    def __call__(self, *, inputs: Any = None, trace: Any = None) -> list[Feedback]:
        text_id, result, level_source = self._scored(inputs, trace)
        scores = result.scores[result.scores.text_id == text_id]
        if scores.empty or not np.isfinite(scores["mean"].to_numpy(dtype=float)).any():
            raise InputError(f"text {text_id!r}: no feature block of the checkpoint's sources to score")
        level = self._level(result, scores.system_id.iloc[0])
        out = [self._feedback(row, result.predictions, level, level_source) for row in scores.itertuples(index=False)]
        return out + (self._system_view(level) if level is not None else [])

    def _scored(self, inputs: Any, trace: Any) -> tuple[str, ScoreResult, str]:
        """The row's text id, the scores of the texts it was scored with, and where its system's level came from."""
        text_id = trace_text_id(trace) if trace is not None else None
        if self._table is not None:
            if text_id is None or not (self._table.text_id == text_id).any():
                text_id = str(inputs.get("text_id")) if isinstance(inputs, dict) and "text_id" in inputs else text_id
            if not (self._table.text_id == text_id).any():
                raise InputError(f"text {text_id!r} has no LLM answer distributions (features rows)")
            if self.levelled:
                return str(text_id), self._cached(("table",), self._table_set), f"the features table {self.features}"
            rows = self._table[self._table.text_id == text_id].copy()
            rows.attrs["source"] = str(self.features)
            return str(text_id), self._score(validate_features(rows, self._model.rubric)), "none"
        if trace is None:
            raise InputError("a row without a trace needs the scorer's features table (CalibratedScorer(features=...))")
        if not self.levelled:
            return str(text_id), self._score(self._trace_features([trace], trace.info.trace_id)), "none"
        system = trace.info.tags.get(self.system_tag) if self.system_tag else None
        if system in (None, ""):
            raise InputError(
                f"trace {trace.info.trace_id} has no tag {self.system_tag!r} (the system): checkpoint "
                f"{Path(self.checkpoint).name} has a system level and scores a text within its system",
                setting="system_tag",
            )
        experiment = trace.info.experiment_id
        result = self._cached((experiment, system), lambda: self._system_set(experiment, str(system)))
        return str(text_id), result, f"its {result.summary['texts']} trace(s) in experiment {experiment}"

    def _cached(self, key: tuple, score) -> ScoreResult:
        """The scores of a set of texts scored together, computed once (evaluate's threads wait on the lock)."""
        with self._lock:
            if key not in self._systems:
                self._systems[key] = score()
            return self._systems[key]

    def _system_set(self, experiment: str, system: str) -> ScoreResult:
        """Every trace of ``system`` in ``experiment`` scored together (its level is the whole system's)."""
        import mlflow

        traces = search_traces(mlflow.MlflowClient(), experiment, tag=(self.system_tag, system))
        features = self._trace_features(traces, f"system {system!r} of experiment {experiment}")
        texts = pd.DataFrame({"text_id": sorted(features.text_id.unique()), "system_id": system})
        return score_texts(self._model, features, texts, **self._settings())

    def _table_set(self) -> ScoreResult:
        return score_texts(self._model, self._table, self._texts, **self._settings())

    def _trace_features(self, traces: list, where: str) -> pd.DataFrame:
        rows = read_traces(traces, self._model.rubric).features
        if rows.empty:
            ids = ", ".join(repr(trace_text_id(t)) for t in traces[:3])
            raise InputError(f"text {ids} has no LLM answer distributions (LLM_JUDGE feedback or features rows)")
        rows.attrs["source"] = f"trace {where}" if len(traces) == 1 else where
        return validate_features(rows, self._model.rubric)

    def _score(self, features: pd.DataFrame) -> ScoreResult:
        with self._lock:  # torch prediction and the model's caches are not shared between threads
            return score_texts(self._model, features, **self._settings())

    def _settings(self) -> dict:
        return {"judges": self.judges, "questions": self.questions, "keep_predictions": True, "coverage": self.coverage}

    def _level(self, result: ScoreResult, system) -> dict | None:
        """The level of ``system`` (its row of the levels table, the interval at ``coverage``); None without."""
        if result.levels is None:
            return None
        row = result.levels.set_index(result.levels.system_id.astype(str)).loc[str(system)]
        lo, hi = t_interval(row.level, row.level_sd**2, row.level_df, self.coverage)
        return {
            "system": str(system),
            "level": float(row.level),
            "lo": float(lo),
            "hi": float(hi),
            "known": bool(row.known),
            "applied": bool(row.applied),
            "beyond": bool(row.beyond),
        }

    def _feedback(self, row, predictions: pd.DataFrame, level: dict | None, level_source: str) -> Feedback:
        question = self._model.rubric[row.question_id]
        mine = predictions[(predictions.text_id == row.text_id) & (predictions.question_id == row.question_id)]
        distribution = probabilities(mine, question).mean(axis=0)
        interval = (float(row.lo), float(row.hi)) if _finite(row.lo, row.hi) else None
        shown = f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "none (no calibration of this question)"
        used = _level_used(level, level_source, question.id == self._model.rubric.main.id)
        meta = {
            "lo": interval[0] if interval else None,
            "hi": interval[1] if interval else None,
            "coverage": self.coverage,
            "distribution": json.dumps(dict(zip(question.keys, np.round(distribution, 6).tolist()))),
            "checkpoint": Path(self.checkpoint).name,
            "judges": int(row.judges),
            "status": row.status,
            "level": used,
            **({"system": level["system"]} if level else {}),
        }
        return Feedback(
            name=f"{self.name}/{row.question_id}",
            value=float(row.mean),
            source=AssessmentSource(source_type=CODE, source_id=Path(self.checkpoint).name),
            rationale=(
                f"calibrated judge-free score of checkpoint {Path(self.checkpoint).name} (mean over {int(row.judges)} "
                f"judges' predicted answers); {self.coverage:.0%} interval {shown}; status {row.status}; level: {used}"
            ),
            metadata={k: str(v) for k, v in meta.items()},
        )

    def _system_view(self, level: dict) -> list[Feedback]:
        """The level of the row's system and its interval, as feedback whose means are evaluate's per-system metrics."""
        base = SYSTEM_NAME.format(
            name=self.name, question=self._model.rubric.main.id, system=metric_name(level["system"])
        )
        source = AssessmentSource(source_type=CODE, source_id=Path(self.checkpoint).name)
        kind = (
            "a training system's level (its labels)"
            if level["known"]
            else "a new system's level (its texts' LLM answers)"
        )
        rationale = (
            f"system {level['system']}: {kind} {level['level']:.3f}, {self.coverage:.0%} interval "
            f"[{level['lo']:.3f}, {level['hi']:.3f}]"
        )
        meta = {k: str(v) for k, v in level.items()}
        return [
            Feedback(name=f"{base}{end}", value=level[key], source=source, rationale=rationale, metadata=meta)
            for end, key in (("", "level"), ("/lo", "lo"), ("/hi", "hi"))
        ]


def _level_used(level: dict | None, source: str, main: bool) -> str:
    """What the rationale says of the system level behind a score."""
    if level is None:
        return "none (the checkpoint has no system level: text level)"
    if not main:
        return f"text level (the system level is the main question's; system {level['system']})"
    kind = "training system, its labels' level" if level["known"] else f"new system, the level predicted from {source}"
    applied = (
        "" if level["applied"] else "; not applied: the checkpoint weighs it for new systems beyond its range only"
    )
    return f"system {level['system']} ({kind}){applied}"


def metric_name(value: str) -> str:
    """``value`` with the characters an MLflow metric name may not hold replaced by ``_``."""
    return re.sub(r"[^\w\-. :]", "_", str(value))


def _finite(*values) -> bool:
    try:
        return all(math.isfinite(float(v)) for v in values)
    except (TypeError, ValueError):
        return False
