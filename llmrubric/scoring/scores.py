"""Score new texts with a trained calibrator (LLM-Rubric Appendix A).

Checkpoint + features of new texts (+ ``system_id``) → every trusted judge's predicted
distribution per (text, question) and the judge-free score over the trusted set A:
``mean`` (ŷ_i = mean_{a∈A} ŷ_i^a), ``max`` and a ``quantile`` over A. Texts are scored in
chunks, so memory is bounded by the chunk size, and the predictions table can be streamed
to a file. A text that lacks some of the checkpoint's feature blocks is scored with those
blocks masked (status ``masked``, blocks named in ``missing_blocks``); a text with no
features at all is not scored (status ``no_features``, scores NA).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from llmrubric.io.errors import InputError
from llmrubric.io.files import atomic_path
from llmrubric.io.integrity import check_finite_predictions
from llmrubric.io.predictions import predictions_frame, probabilities
from llmrubric.io.tables import Tables, source_of
from llmrubric.model.calibrator import Calibrator
from llmrubric.model.threads import one_thread

log = logging.getLogger(__name__)
SCORE_COLUMNS = ["text_id", "system_id", "question_id", "mean", "max", "quantile", "judges", "status", "missing_blocks"]
EMPTY_ANNOTATIONS = ["text_id", "judge_id", "question_id", "answer", "round"]


@dataclass
class ScoreResult:
    """``scores``: one row per (text, question) (columns ``SCORE_COLUMNS``); ``summary``: counts and timing."""

    scores: pd.DataFrame
    summary: dict = field(default_factory=dict)
    predictions: pd.DataFrame | None = None


def trusted_judges(calibrator: Calibrator, judges: list[str] | None) -> list[str]:
    """The trusted set A: ``judges`` (each must be known to the checkpoint), or all its judges."""
    known = list(calibrator.judges_.judges)
    if not judges:
        return known
    judges = [str(j) for j in judges]
    unknown = [j for j in judges if j not in known]
    if unknown:
        raise InputError(
            f"trusted judge(s) {unknown} are not in the checkpoint (it knows {known})", column="trusted_judges"
        )
    if len(set(judges)) != len(judges):
        raise InputError(f"trusted judges listed twice: {judges}", column="trusted_judges")
    return judges


def judge_free(means: np.ndarray, quantile: float) -> dict[str, np.ndarray]:
    """Aggregates over judges of ``means`` (texts, judges): mean, max and the ``quantile``."""
    return {"mean": means.mean(axis=1), "max": means.max(axis=1), "quantile": np.quantile(means, quantile, axis=1)}


def _text_table(features: pd.DataFrame, texts: pd.DataFrame | None) -> pd.DataFrame:
    """``text_id, system_id`` of the texts to score (all texts of ``texts``, else of ``features``)."""
    featured = pd.Index(features.text_id.unique())
    if texts is None:
        return pd.DataFrame({"text_id": sorted(featured), "system_id": None})
    dup = texts.text_id.duplicated()
    if dup.any():
        row = texts.index[dup.argmax()]
        raise InputError(
            f"duplicate text_id {texts.at[row, 'text_id']!r}", file=source_of(texts), row=int(row), column="text_id"
        )
    extra = featured.difference(pd.Index(texts.text_id))
    if len(extra):
        log.warning(
            "%d texts have features but are not in the texts table %s; they are not scored (first: %r)",
            len(extra),
            source_of(texts),
            extra[0],
        )
    system = texts["system_id"] if "system_id" in texts.columns else None
    return pd.DataFrame(
        {"text_id": texts.text_id.to_numpy(), "system_id": None if system is None else system.to_numpy()}
    ).sort_values("text_id", kind="stable")


class _Sink:
    """Appends predictions chunks to a table file by suffix; renamed into place on success."""

    def __init__(self, tmp: Path, suffix: str):
        if suffix not in (".parquet", ".csv", ".tsv", ".jsonl"):
            raise InputError(f"unknown table format {suffix!r} (use .csv, .tsv, .parquet or .jsonl)", file=str(tmp))
        self.tmp, self.suffix, self.writer, self.first = tmp, suffix, None, True

    def write(self, frame: pd.DataFrame) -> None:
        if self.suffix == ".parquet":
            table = pa.Table.from_pandas(frame, preserve_index=False)
            if self.writer is None:
                self.writer = pq.ParquetWriter(str(self.tmp), table.schema)
            self.writer.write_table(table.cast(self.writer.schema))
        elif self.suffix == ".jsonl":
            frame.to_json(self.tmp, orient="records", lines=True, mode="w" if self.first else "a")
        else:
            frame.to_csv(
                self.tmp,
                sep="\t" if self.suffix == ".tsv" else ",",
                index=False,
                header=self.first,
                mode="w" if self.first else "a",
            )
        self.first = False

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def score_texts(
    calibrator: Calibrator,
    features: pd.DataFrame,
    texts: pd.DataFrame | None = None,
    judges: list[str] | None = None,
    questions: list[str] | None = None,
    quantile: float = 0.9,
    chunk_texts: int = 4096,
    predictions_out: str | Path | None = None,
    keep_predictions: bool = False,
    progress: bool = False,
) -> ScoreResult:
    """Predict every trusted judge on every text, chunk by chunk; aggregate over judges.

    features: validated features table of the new texts; texts: optional ``text_id`` (+
    ``system_id``) table choosing the texts. Each chunk holds ``chunk_texts`` texts, i.e.
    ``chunk_texts × |A|`` (text, judge) pairs. ``predictions_out`` receives the predictions
    table (``text_id, judge_id, system_id, round, question_id, p_<option>…, mean, var``),
    written atomically: a failure leaves no file; ``keep_predictions`` also returns it in memory.
    ``questions`` defaults to the rubric's ordered questions: a categorical question has no
    judge-free score (asking for one is an error; ``Calibrator.predict`` gives its distributions).
    """
    if not 0 <= quantile <= 1:
        raise InputError(f"quantile {quantile} is not in [0, 1]", column="quantile")
    if chunk_texts < 1:
        raise InputError(f"chunk_texts must be >= 1, got {chunk_texts}", column="chunk_texts")
    start = time.perf_counter()
    judges = trusted_judges(calibrator, judges)
    questions = list(questions or [q.id for q in calibrator.rubric.questions if q.ordered])
    unknown = [q for q in questions if q not in calibrator.rubric]
    if unknown:
        raise InputError(
            f"question(s) {unknown} are not in the checkpoint's rubric {calibrator.rubric.ids}", column="questions"
        )
    categorical = [q for q in questions if not calibrator.rubric[q].ordered]
    if categorical or not questions:
        raise InputError(
            f"judge-free scores need questions with ordered numeric options; categorical: "
            f"{categorical or [q.id for q in calibrator.rubric.questions]}",
            column="questions",
        )
    rubric_questions = [calibrator.rubric[q] for q in questions]
    q_index = [calibrator.rubric.ids.index(q) for q in questions]
    layout = calibrator.layout_
    src = source_of(features)
    features = features.astype({c: object for c in ("text_id", "source", "question_id", "option")})
    layout.check(features)
    table = _text_table(features, texts)
    has = table.text_id.isin(set(features.text_id)).to_numpy()
    scored, unscored = table[has].reset_index(drop=True), table[~has]
    if len(unscored):
        log.warning("%d texts have no features and are not scored (first: %r)", len(unscored), unscored.text_id.iloc[0])
    keep = {(b.source, b.question_id) for b in layout.blocks}
    codes = pd.Index(scored.text_id).get_indexer(features.text_id)  # position of each row's text in ``scored``
    order = np.flatnonzero(codes >= 0)
    order = order[np.argsort(codes[order], kind="stable")]
    feats, ids = features.iloc[order], codes[order]
    feats.attrs["source"] = src
    block_names = np.array([b.name for b in layout.blocks], dtype=object)
    n_probs = sum(len(b.options) for b in layout.blocks)
    missing: dict[str, str] = {}
    predict = _judge_predictor(calibrator, judges)
    parts, kept, n_pairs, verified = [], [], 0, False
    out = Path(predictions_out) if predictions_out is not None else None
    bar = tqdm(total=len(scored), desc="score", unit="text", disable=not progress, dynamic_ncols=True)
    with atomic_path(out) if out is not None else contextlib.nullcontext() as tmp:
        sink = _Sink(tmp, out.suffix) if out is not None else None
        try:
            for lo in range(0, len(scored), chunk_texts):
                chunk = scored.iloc[lo : lo + chunk_texts]
                text_ids = chunk.text_id.tolist()
                first, last = np.searchsorted(ids, lo, "left"), np.searchsorted(ids, lo + len(chunk) - 1, "right")
                chunk_feats = feats.iloc[first:last]
                if not keep <= set(zip(chunk_feats.source, chunk_feats.question_id)):
                    chunk_feats = feats  # a block absent from the whole chunk: the full table passes the layout check
                chunk_feats.attrs["source"] = src
                n = len(chunk)
                pairs = pd.DataFrame(
                    {
                        "text_id": np.repeat(chunk.text_id.to_numpy(), len(judges)),
                        "judge_id": np.tile(np.asarray(judges, dtype=object), n),
                        "system_id": np.repeat(chunk.system_id.to_numpy(), len(judges)),
                        "round": "1",
                    }
                )
                x = layout.matrix(chunk_feats, text_ids)
                absent = x[:, n_probs : n_probs + len(block_names)] == 0  # presence flags follow the probabilities
                for row in np.flatnonzero(absent.any(axis=1)):
                    missing[text_ids[row]] = ";".join(block_names[absent[row]])
                if predict is not None:
                    probs = (
                        predict(x)[:, :, q_index]
                        if verified
                        else _checked(calibrator, chunk_feats, pairs, x, q_index, predict)
                    )
                    verified = True
                    if probs is None:
                        predict = None
                if predict is None:
                    pred = calibrator.predict(Tables(_empty_annotations(), chunk_feats), pairs, questions)
                    probs = np.stack(
                        [
                            probabilities_padded(pred[pred.question_id == q.id], q, probs_width(rubric_questions))
                            for q in rubric_questions
                        ],
                        axis=1,
                    )
                    probs = probs.reshape(n, len(judges), len(questions), -1)
                flat = probs.reshape(n * len(judges), len(questions), -1)
                if sink is not None or keep_predictions:
                    frame = predictions_frame(pairs, rubric_questions, flat)
                    if sink is not None:
                        sink.write(frame)
                    if keep_predictions:
                        kept.append(frame)
                for qi, question in enumerate(rubric_questions):
                    k = len(question.options)
                    means = probs[:, :, qi, :k] @ np.asarray(question.values)  # (texts, judges)
                    agg = judge_free(means, quantile)
                    parts.append(
                        pd.DataFrame(
                            {
                                "text_id": chunk.text_id.to_numpy(),
                                "system_id": chunk.system_id.to_numpy(),
                                "question_id": question.id,
                                **agg,
                            }
                        )
                    )
                n_pairs += len(pairs)
                bar.update(n)
        finally:
            bar.close()
            if sink is not None:
                sink.close()
    scores = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=SCORE_COLUMNS[:6])
    scores["judges"] = len(judges)
    scores["missing_blocks"] = [missing.get(t, "") for t in scores.text_id]
    scores["status"] = np.where(scores.missing_blocks == "", "ok", "masked")
    if len(unscored):
        na = pd.DataFrame(
            [
                {
                    "text_id": t,
                    "system_id": s,
                    "question_id": q,
                    "judges": 0,
                    "status": "no_features",
                    "missing_blocks": "all",
                }
                for t, s in zip(unscored.text_id, unscored.system_id)
                for q in questions
            ]
        )
        scores = pd.concat([scores, na], ignore_index=True)
    scores = scores[SCORE_COLUMNS].sort_values(["question_id", "text_id"], kind="stable").reset_index(drop=True)
    masked = int(scores[scores.question_id == questions[0]].status.eq("masked").sum())
    if masked:
        log.warning(
            "%d texts lack some feature blocks and were scored with those blocks masked (see missing_blocks)", masked
        )
    summary = {
        "texts": int(len(scored)),
        "masked_texts": masked,
        "unscored_texts": int(len(unscored)),
        "judges": judges,
        "questions": questions,
        "quantile": quantile,
        "pairs": int(n_pairs),
        "fast_path": predict is not None,
        "seconds": time.perf_counter() - start,
    }
    return ScoreResult(scores, summary, pd.concat(kept, ignore_index=True) if kept else None)


def _empty_annotations() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in EMPTY_ANNOTATIONS})


def probs_width(questions) -> int:
    return max(len(q.options) for q in questions)


def probabilities_padded(pred: pd.DataFrame, question, width: int) -> np.ndarray:
    """(rows, width) option probabilities of ``question`` from a predictions table, zero-padded."""
    p = probabilities(pred, question)
    return np.pad(p, ((0, 0), (0, width - p.shape[1])))


def _judge_predictor(calibrator: Calibrator, judges: list[str]):
    """A function x (texts, dim) → probabilities (texts, judges, questions, max options).

    Personalization is per (text, judge) pair, which dominates the cost of scoring many pairs.
    For a fixed judge it folds into the shared weights (:meth:`CalibrationNet.for_judge`), so
    each trusted judge gets plain copies of the ensemble's networks that run on the texts alone.
    """
    if not hasattr(calibrator, "nets_"):
        return None  # model=auto: its members are not all networks
    index = [calibrator.judges_.judges.index(judge) for judge in judges]
    members = [[net.for_judge(a) for a in index] for net in calibrator.nets_]

    @torch.no_grad()
    def predict(x: np.ndarray) -> np.ndarray:
        xt = torch.from_numpy(x)
        dummy = torch.full((len(x),), -1, dtype=torch.long)
        with one_thread():
            per_judge = [torch.stack([m.probabilities(xt, dummy) for m in nets], dim=1) for nets in members]
        probs = torch.stack(per_judge).mean(dim=0).numpy().astype(np.float64)
        check_finite_predictions(probs, getattr(calibrator, "source_", "<model>"))
        return probs

    return predict


def _checked(
    calibrator: Calibrator, features: pd.DataFrame, pairs: pd.DataFrame, x: np.ndarray, q_index: list[int], predict
):
    """``predict``'s probabilities (texts, judges, questions, options) of the first chunk if they
    match ``Calibrator.predict_proba`` on up to 64 pairs of ``pairs``, else None."""
    sample = pairs.iloc[: min(len(pairs), 64)]
    reference = calibrator.predict_proba(Tables(_empty_annotations(), features), sample)
    try:
        probs = predict(x)[:, :, q_index]
    except (RuntimeError, ValueError, TypeError, AttributeError, IndexError) as e:
        log.warning("per-judge fast path failed (%s); scoring with Calibrator.predict", e)
        return None
    fast = probs.reshape(len(pairs), *probs.shape[2:])[: len(sample)]
    if fast.shape[1:] == reference[:, q_index, : fast.shape[-1]].shape[1:] and np.allclose(
        fast, reference[:, q_index, : fast.shape[-1]], atol=1e-5
    ):
        return probs
    log.warning("per-judge fast path disagrees with Calibrator.predict; scoring with Calibrator.predict")
    return None
