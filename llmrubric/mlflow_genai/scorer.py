"""A scorer for ``mlflow.genai.evaluate`` built from a trained checkpoint: calibrated, judge-free scores.

For each row :class:`CalibratedScorer` reads the LLM's answer distributions (the row's trace's
``LLM_JUDGE`` feedback, as :func:`llmrubric.mlflow_genai.read.read_traces` reads them, or a features
table given to the scorer, matched by the trace's text id or ``inputs["text_id"]``) and returns one
``Feedback`` per scored rubric question: the judge-free calibrated score (the mean over the
checkpoint's trusted judges, as ``llmrubric score texts`` computes it) as the value, its conformal
interval and the predicted distribution in the metadata, a rationale naming the checkpoint and the
coverage. The checkpoint is loaded once; prediction holds a lock, so evaluate's thread pool may
call the scorer concurrently. A row without features of the checkpoint is a scorer error (MLflow
records it on the row), never a value. Evaluate's metrics then hold ``llmrubric/<question>/mean``,
the calibrated system score of the rows scored (``<name>/<question>``: the scorer's ``name``, so that
two checkpoints' scorers do not collide).
"""

from __future__ import annotations

import json
import math
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
from llmrubric.mlflow_genai.read import CODE, read_traces, trace_text_id
from llmrubric.model.core.checkpoints import load_model
from llmrubric.scoring.intervals import DEFAULT_COVERAGE
from llmrubric.scoring.scores import score_texts


class CalibratedScorer(Scorer):
    """``CalibratedScorer(checkpoint="outputs/mine/fold0.safetensors")``; optional ``features`` (a features
    table file), ``questions`` and ``judges`` (the trusted set; default: all of the checkpoint's) and
    ``coverage`` of the intervals."""

    name: str = "llmrubric"
    checkpoint: str
    features: str | None = None
    questions: list[str] | None = None
    judges: list[str] | None = None
    coverage: float = DEFAULT_COVERAGE

    _model: Any = PrivateAttr(default=None)
    _table: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        self._model = load_model(self.checkpoint)
        if self.features is not None:
            self._table = validate_features(read_table(self.features, "features"), self._model.rubric)

    def __call__(self, *, inputs: Any = None, trace: Any = None) -> list[Feedback]:
        text_id, features = self._row_features(inputs, trace)
        with self._lock:  # torch prediction and the model's caches are not shared between threads
            result = score_texts(
                self._model,
                features,
                judges=self.judges,
                questions=self.questions,
                keep_predictions=True,
                coverage=self.coverage,
            )
        scores = result.scores[result.scores.text_id == text_id]
        if scores.empty or not np.isfinite(scores["mean"].to_numpy(dtype=float)).any():
            raise InputError(f"text {text_id!r}: no feature block of the checkpoint's sources to score")
        return [self._feedback(row, result.predictions) for row in scores.itertuples(index=False)]

    def _row_features(self, inputs: Any, trace: Any) -> tuple[str, pd.DataFrame]:
        """The text id of the row and its validated features (from the given table, else the trace)."""
        text_id = trace_text_id(trace) if trace is not None else None
        if self._table is not None:
            if text_id is None or not (self._table.text_id == text_id).any():
                text_id = str(inputs.get("text_id")) if isinstance(inputs, dict) and "text_id" in inputs else text_id
            rows = self._table[self._table.text_id == text_id]
        elif trace is not None:
            rows = read_traces([trace], self._model.rubric).features
        else:
            raise InputError("a row without a trace needs the scorer's features table (CalibratedScorer(features=...))")
        if rows.empty:
            raise InputError(f"text {text_id!r} has no LLM answer distributions (LLM_JUDGE feedback or features rows)")
        rows = rows.copy()
        rows.attrs["source"] = f"trace {trace.info.trace_id}" if trace is not None else str(self.features)
        return str(text_id), validate_features(rows, self._model.rubric)

    def _feedback(self, row, predictions: pd.DataFrame) -> Feedback:
        question = self._model.rubric[row.question_id]
        mine = predictions[(predictions.text_id == row.text_id) & (predictions.question_id == row.question_id)]
        distribution = probabilities(mine, question).mean(axis=0)
        interval = (float(row.lo), float(row.hi)) if _finite(row.lo, row.hi) else None
        shown = f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "none (no calibration of this question)"
        meta = {
            "lo": interval[0] if interval else None,
            "hi": interval[1] if interval else None,
            "coverage": self.coverage,
            "distribution": json.dumps(dict(zip(question.keys, np.round(distribution, 6).tolist()))),
            "checkpoint": Path(self.checkpoint).name,
            "judges": int(row.judges),
            "status": row.status,
        }
        return Feedback(
            name=f"{self.name}/{row.question_id}",
            value=float(row.mean),
            source=AssessmentSource(source_type=CODE, source_id=Path(self.checkpoint).name),
            rationale=(
                f"calibrated judge-free score of checkpoint {Path(self.checkpoint).name} (mean over {int(row.judges)} "
                f"judges' predicted answers); {self.coverage:.0%} interval {shown}; status {row.status}"
            ),
            metadata={k: str(v) for k, v in meta.items()},
        )


def _finite(*values) -> bool:
    try:
        return all(math.isfinite(float(v)) for v in values)
    except (TypeError, ValueError):
        return False
