"""Score new texts with a trained calibrator (LLM-Rubric Appendix A).

Checkpoint + features of new texts (+ ``system_id``) → every trusted judge's predicted
distribution per (text, question) and the judge-free score over the trusted set A:
``mean`` (ŷ_i = mean_{a∈A} ŷ_i^a), ``max`` and a ``quantile`` over A. Texts are scored in
chunks, so memory is bounded by the chunk size, and the predictions table can be streamed
to a file. A text that lacks some of the checkpoint's feature blocks is scored with those
blocks marginalised by the model's answer model (:mod:`llmrubric.model.core.absent`; status
``masked``, blocks named in ``missing_blocks``); a text with no features at all is not scored
(status ``no_features``, scores NA).
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
from tqdm.auto import tqdm

from llmrubric.io.contracts import SPECS
from llmrubric.io.errors import InputError
from llmrubric.io.files import atomic_path
from llmrubric.io.guards import check_choice
from llmrubric.io.predictions import predictions_frame, probabilities
from llmrubric.io.rows import check_unique
from llmrubric.io.tables import Tables, source_of
from llmrubric.model.core.absent import DRAWS, SEED, batch_of
from llmrubric.model.core.registry import Family, capabilities
from llmrubric.scoring.intervals import (
    COVERAGE_BY,
    DEFAULT_COVERAGE,
    calibrations,
    check_coverage,
    score_intervals,
    with_intervals,
)

log = logging.getLogger(__name__)
SCORE_COLUMNS = list(SPECS["scores"].required)  # the scores table contract (llmrubric.io.contracts), in order
EMPTY_ANNOTATIONS = ["text_id", "judge_id", "question_id", "answer", "round"]


@dataclass
class ScoreResult:
    """``scores``: one row per (text, question) (columns ``SCORE_COLUMNS``); ``summary``: counts and timing."""

    scores: pd.DataFrame
    summary: dict = field(default_factory=dict)
    predictions: pd.DataFrame | None = None
    levels: pd.DataFrame | None = None


def trusted_judges(calibrator: Family, judges: list[str] | None) -> list[str]:
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
    check_unique(texts, "text_id", "duplicate text_id {text_id!r}", file=source_of(texts), column="text_id")
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
    calibrator: Family,
    features: pd.DataFrame,
    texts: pd.DataFrame | None = None,
    judges: list[str] | None = None,
    questions: list[str] | None = None,
    quantile: float = 0.9,
    chunk_texts: int = 4096,
    predictions_out: str | Path | None = None,
    keep_predictions: bool = False,
    progress: bool = False,
    coverage: float = DEFAULT_COVERAGE,
    coverage_by: str = "pooled",
) -> ScoreResult:
    """Predict every trusted judge on every text, chunk by chunk; aggregate over judges.

    features: validated features table of the new texts; texts: optional ``text_id`` (+ ``system_id``) table
    choosing the texts. Each chunk holds ``chunk_texts`` texts, i.e. ``chunk_texts × |A|`` (text, judge) pairs.
    ``predictions_out`` receives the predictions table (``text_id, judge_id, system_id, round, question_id,
    p_<option>…, mean, var, lo, hi``), written atomically: a failure leaves no file; ``keep_predictions`` also
    returns it in memory. ``questions`` defaults to the rubric's ordered questions (a categorical question has no
    judge-free score). ``lo``/``hi``: conformal intervals at ``coverage`` of the calibrated question
    (:mod:`llmrubric.scoring.intervals`; NA for other questions and models without a calibration), by judge with
    ``coverage_by="judge"``."""
    coverage = _checked_settings(quantile, chunk_texts, coverage, coverage_by)
    start = time.perf_counter()
    judges = trusted_judges(calibrator, judges)
    questions = _scored_questions(calibrator, questions)
    src = source_of(features)
    features = features.astype({c: object for c in ("text_id", "source", "question_id", "option")})
    calibrator.layout_.check(features, absent_ok=_answers(calibrator) is not None)
    scored, unscored = _split_featured(_text_table(features, texts), features)
    levels, member_levels = _system_levels(calibrator, features, scored, judges)
    chunks = _ChunkPredictor(calibrator, judges, questions, _features_by_text(features, scored, src), member_levels)
    parts, kept, n_pairs = [], [], 0
    out = Path(predictions_out) if predictions_out is not None else None
    bar = tqdm(total=len(scored), desc="score", unit="text", disable=not progress, dynamic_ncols=True)
    with atomic_path(out) if out is not None else contextlib.nullcontext() as tmp:
        sink = _Sink(tmp, out.suffix) if out is not None else None
        try:
            for lo in range(0, len(scored), chunk_texts):
                chunk = scored.iloc[lo : lo + chunk_texts]
                pairs, probs = chunks.predict(lo, chunk)
                if sink is not None or keep_predictions:
                    flat = probs.reshape(len(chunk) * len(judges), len(questions), -1)
                    frame = predictions_frame(pairs, chunks.questions, flat)
                    frame = with_intervals(frame, calibrator, coverage, coverage_by)
                    if sink is not None:
                        sink.write(frame)
                    if keep_predictions:
                        kept.append(frame)
                parts += _chunk_scores(chunk, chunks.questions, probs, quantile, calibrator, coverage)
                n_pairs += len(pairs)
                bar.update(len(chunk))
        finally:
            bar.close()
            if sink is not None:
                sink.close()
    scores = _score_table(parts, chunks.missing, len(judges), unscored, questions)
    masked, beyond = _warnings(scores, questions[0], levels)
    summary = {
        "texts": int(len(scored)),
        "masked_texts": masked,
        "unscored_texts": int(len(unscored)),
        "judges": judges,
        "questions": questions,
        "quantile": quantile,
        "coverage": coverage,
        "coverage_by": coverage_by,
        "intervals": [q for q in calibrations(calibrator) if q in questions],
        "beyond_training_range": beyond,
        "pairs": int(n_pairs),
        "fast_path": chunks.fast is not None,
        "seconds": time.perf_counter() - start,
    }
    return ScoreResult(scores, summary, pd.concat(kept, ignore_index=True) if kept else None, levels)


def _checked_settings(quantile: float, chunk_texts: int, coverage: float, coverage_by: str) -> float:
    """The settings of :func:`score_texts` checked (an error names the bad one); the coverage as a float."""
    if not 0 <= quantile <= 1:
        raise InputError(f"quantile {quantile} is not in [0, 1]", column="quantile")
    if chunk_texts < 1:
        raise InputError(f"chunk_texts must be >= 1, got {chunk_texts}", column="chunk_texts")
    check_choice("coverage_by", coverage_by, COVERAGE_BY)
    return check_coverage(coverage)


def _warnings(scores: pd.DataFrame, question_id: str, levels: pd.DataFrame | None) -> tuple[int, list[str] | None]:
    """The number of texts scored with blocks marginalised, and the new systems beyond the training systems' range
    (None without a system level), each warned about in one line."""
    masked = int(scores[scores.question_id == question_id].status.eq("masked").sum())
    if masked:
        log.warning(
            "%d texts lack some feature blocks and were scored with those blocks marginalised (see missing_blocks)",
            masked,
        )
    beyond = None if levels is None else sorted(map(str, levels.system_id[levels.beyond & ~levels.known]))
    if beyond:
        log.warning(
            "systems %s lie beyond the training systems' range of the LLMs' answers: their scores, levels and intervals "
            "extrapolate (the LLMs may misjudge a system as a whole); a few human labels of their texts correct it "
            "(`leaderboard build --levels --annotations`, docs/scoring.md)",
            ", ".join(beyond),
        )
    return masked, beyond


def _answers(calibrator):
    """The model's answer model (None for a family without ``absent_blocks`` or an old checkpoint)."""
    return calibrator.answers_ if capabilities(calibrator).absent_blocks else None


def _system_levels(calibrator, features: pd.DataFrame, scored: pd.DataFrame, judges: list[str]):
    """A model with a system level (:mod:`llmrubric.model.core.system_level`): (the levels table, its
    members' levels over all the scored texts, passed to the predictions of every chunk); (None, None)
    for other models."""
    if not (capabilities(calibrator).system_level and calibrator.levels_):
        return None, None
    pairs = pd.DataFrame(
        {
            "text_id": np.repeat(scored.text_id.to_numpy(), len(judges)),
            "judge_id": np.tile(np.asarray(judges, dtype=object), len(scored)),
            "system_id": np.repeat(scored.system_id.to_numpy(), len(judges)),
            "round": "1",
        }
    )
    tables = Tables(_empty_annotations(), features)
    members = calibrator.member_levels(tables, pairs)
    return calibrator.system_levels(tables, pairs, members), members


def _scored_questions(calibrator: Family, questions: list[str] | None) -> list[str]:
    """``questions`` (default: the rubric's ordered ones), each in the rubric and ordered."""
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
    return questions


def _split_featured(table: pd.DataFrame, features: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The texts to score that have features (renumbered from 0) and those without (warned about)."""
    has = table.text_id.isin(features.text_id.unique()).to_numpy()
    scored, unscored = table[has].reset_index(drop=True), table[~has]
    if len(unscored):
        log.warning("%d texts have no features and are not scored (first: %r)", len(unscored), unscored.text_id.iloc[0])
    return scored, unscored


def _features_by_text(features: pd.DataFrame, scored: pd.DataFrame, src: str) -> tuple[pd.DataFrame, np.ndarray]:
    """The feature rows of the scored texts in their order, and each row's text position in ``scored``."""
    codes = pd.Index(scored.text_id).get_indexer(features.text_id)
    order = np.flatnonzero(codes >= 0)
    order = order[np.argsort(codes[order], kind="stable")]
    feats = features.iloc[order]
    feats.attrs["source"] = src
    return feats, codes[order]


class _ChunkPredictor:
    """Predictions of every trusted judge on one chunk of texts at a time: the per-judge fast
    path once its first chunk agrees with the calibrator's ``predict_proba``, else the calibrator's ``predict``.
    ``missing`` collects text id → the blocks it lacks (``;``-joined)."""

    def __init__(
        self,
        calibrator: Family,
        judges: list[str],
        questions: list[str],
        by_text: tuple[pd.DataFrame, np.ndarray],
        levels: dict | None = None,
    ):
        self.calibrator, self.judges, self.levels = calibrator, judges, levels
        self.question_ids = questions
        self.questions = [calibrator.rubric[q] for q in questions]
        self.q_index = [calibrator.rubric.ids.index(q) for q in questions]
        layout = calibrator.layout_
        self.feats, self.ids = layout.smoothed(by_text[0]), by_text[1]  # counted blocks as the model read them
        self.layout, self.keep = layout, {(b.source, b.question_id) for b in layout.blocks}
        self.block_names = np.array([b.name for b in layout.blocks], dtype=object)
        self.n_probs = sum(len(b.options) for b in layout.blocks)
        self.fast, self.verified = _judge_predictor(calibrator, judges), False
        self.missing: dict[str, str] = {}

    def predict(self, lo: int, chunk: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
        """The chunk's (text, judge) pairs and probabilities (texts, judges, questions, options)."""
        text_ids = chunk.text_id.tolist()
        chunk_feats = self._chunk_features(lo, len(chunk))
        pairs = pd.DataFrame(
            {
                "text_id": np.repeat(chunk.text_id.to_numpy(), len(self.judges)),
                "judge_id": np.tile(np.asarray(self.judges, dtype=object), len(chunk)),
                "system_id": np.repeat(chunk.system_id.to_numpy(), len(self.judges)),
                "round": "1",
            }
        )
        x = self.layout.matrix(chunk_feats, text_ids, absent_ok=_answers(self.calibrator) is not None)
        absent = (
            x[:, self.n_probs : self.n_probs + len(self.block_names)] == 0
        )  # presence flags follow the probabilities
        for row in np.flatnonzero(absent.any(axis=1)):
            self.missing[text_ids[row]] = ";".join(self.block_names[absent[row]])
        if self.fast is not None:
            fast = lambda x: self._fast_marginal(x, absent, chunk_feats, text_ids)
            probs = (
                fast(x)[:, :, self.q_index]
                if self.verified
                else _checked(self.calibrator, chunk_feats, pairs, x, self.q_index, fast)
            )
            self.verified = True
            if probs is None:
                self.fast = None
        if self.fast is None:
            probs = self._predict_slow(chunk_feats, pairs, len(chunk))
        return pairs, probs

    def _fast_marginal(self, x: np.ndarray, absent: np.ndarray, feats: pd.DataFrame, text_ids: list[str]):
        """The fast path's probabilities of texts ``x``; those with ``absent`` blocks are the mean over
        the completions of :func:`llmrubric.model.core.absent.marginal_proba` (a model without an answer
        model: its old filling)."""
        probs = self.fast(x)
        rows = np.flatnonzero(absent.any(axis=1))
        if not len(rows) or _answers(self.calibrator) is None:
            return probs
        pairs = pd.DataFrame({"text_id": [text_ids[r] for r in rows], "judge_id": self.judges[0]})
        batch = batch_of(self.calibrator, Tables(_empty_annotations(), feats), pairs)
        inputs = batch.network_inputs(self.calibrator.answers_.sample(batch.columns, DRAWS, SEED))
        draws = inputs.shape[0]
        completed = self.fast(inputs.reshape(draws * len(rows), -1))
        probs[rows] = completed.reshape(draws, len(rows), *completed.shape[1:]).mean(axis=0)
        return probs

    def _chunk_features(self, lo: int, n: int) -> pd.DataFrame:
        """The feature rows of texts ``lo`` to ``lo + n - 1`` (all rows if a block is absent from them all)."""
        first, last = np.searchsorted(self.ids, lo, "left"), np.searchsorted(self.ids, lo + n - 1, "right")
        chunk_feats = self.feats.iloc[first:last]
        if not self.keep <= set(zip(chunk_feats.source, chunk_feats.question_id)):
            chunk_feats = self.feats  # a block absent from the whole chunk: the full table passes the layout check
        chunk_feats.attrs["source"] = self.feats.attrs["source"]
        return chunk_feats

    def _predict_slow(self, chunk_feats: pd.DataFrame, pairs: pd.DataFrame, n: int) -> np.ndarray:
        """Probabilities by the calibrator's ``predict``, zero-padded to the widest question."""
        extra = {"levels": self.levels} if self.levels is not None else {}
        pred = self.calibrator.predict(Tables(_empty_annotations(), chunk_feats), pairs, self.question_ids, **extra)
        width = probs_width(self.questions)
        probs = np.stack(
            [probabilities_padded(pred[pred.question_id == q.id], q, width) for q in self.questions], axis=1
        )
        return probs.reshape(n, len(self.judges), len(self.questions), -1)


def _chunk_scores(
    chunk: pd.DataFrame, questions: list, probs: np.ndarray, quantile: float, calibrator: Family, coverage: float
) -> list[pd.DataFrame]:
    """One judge-free score frame per question for the texts of ``chunk``, the mean's interval where calibrated."""
    parts = []
    for qi, question in enumerate(questions):
        k = len(question.options)
        means = probs[:, :, qi, :k] @ np.asarray(question.values)  # (texts, judges)
        agg = judge_free(means, quantile)
        agg["lo"], agg["hi"] = score_intervals(calibrator, question, probs[:, :, qi, :k], coverage)
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
    return parts


def _score_table(
    parts: list[pd.DataFrame], missing: dict[str, str], n_judges: int, unscored: pd.DataFrame, questions: list[str]
) -> pd.DataFrame:
    """The scores (``SCORE_COLUMNS``) with status and missing blocks; texts without features as ``no_features``."""
    scores = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=SCORE_COLUMNS[:8])
    scores["judges"] = n_judges
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
    return scores[SCORE_COLUMNS].sort_values(["question_id", "text_id"], kind="stable").reset_index(drop=True)


def _empty_annotations() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in EMPTY_ANNOTATIONS})


def probs_width(questions) -> int:
    return max(len(q.options) for q in questions)


def probabilities_padded(pred: pd.DataFrame, question, width: int) -> np.ndarray:
    """(rows, width) option probabilities of ``question`` from a predictions table, zero-padded."""
    p = probabilities(pred, question)
    return np.pad(p, ((0, 0), (0, width - p.shape[1])))


def _judge_predictor(calibrator: Family, judges: list[str]):
    """The family's per-judge fast path, a function x (texts, dim) → probabilities (texts, judges, questions,
    max options) (capability ``judge_scoring``), or None (``model=auto``: its members are not all networks)."""
    return calibrator.judge_predictor(judges) if capabilities(calibrator).judge_scoring else None


def _checked(
    calibrator: Family,
    features: pd.DataFrame,
    pairs: pd.DataFrame,
    x: np.ndarray,
    q_index: list[int],
    predict,
):
    """``predict``'s probabilities (texts, judges, questions, options) of the first chunk if they
    match the calibrator's ``predict_proba`` on up to 64 pairs of ``pairs``, else None."""
    sample = pairs.iloc[: min(len(pairs), 64)]
    reference = calibrator.predict_proba(Tables(_empty_annotations(), features), sample)
    try:
        probs = predict(x)[:, :, q_index]
    except (RuntimeError, ValueError, TypeError, AttributeError, IndexError) as e:
        log.warning("per-judge fast path failed (%s); scoring with the calibrator's predict", e)
        return None
    fast = probs.reshape(len(pairs), *probs.shape[2:])[: len(sample)]
    if fast.shape[1:] == reference[:, q_index, : fast.shape[-1]].shape[1:] and np.allclose(
        fast, reference[:, q_index, : fast.shape[-1]], atol=1e-5
    ):
        return probs
    log.warning("per-judge fast path disagrees with the calibrator's predict; scoring with the calibrator's predict")
    return None
