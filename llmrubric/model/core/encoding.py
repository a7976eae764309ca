"""Canonical tables → tensors: feature layout, judge map, and (text, judge) pairs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables, source_of
from llmrubric.model.core.memo import memoised
from llmrubric.model.core.samples import counted, smoothed

log = logging.getLogger(__name__)
PAIR = ["text_id", "judge_id", "round"]


@dataclass(frozen=True)
class Block:
    """One feature block: a source's distribution over the options of one question."""

    source: str
    question_id: str
    options: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.source}/{self.question_id}"

    @property
    def values(self) -> list[float]:
        """Numeric value of each option: the option itself when numeric, else its position."""
        try:
            return [float(o) for o in self.options]
        except ValueError:
            return [float(i) for i in range(len(self.options))]


@dataclass(frozen=True)
class FeatureLayout:
    """The named, ordered feature blocks; x = [probs of each block..., presence flag of each block].

    ``sample_prior``: the Dirichlet strength that counted blocks (the features' ``samples``) are smoothed by
    before they are read (:mod:`llmrubric.model.core.samples`), set when the model was fitted on counted
    blocks; None: features are read as they are."""

    blocks: tuple[Block, ...]
    sample_prior: float | None = None

    @property
    def dim(self) -> int:
        return sum(len(b.options) for b in self.blocks) + len(self.blocks)

    @property
    def values(self) -> list[list[float]]:
        """Option values of each block, in layout order (the network's ``block_values``)."""
        return [b.values for b in self.blocks]

    @classmethod
    @memoised
    def from_features(cls, features: pd.DataFrame, rubric: Rubric, sample_prior: float | None = None) -> FeatureLayout:
        """Rubric questions first (rubric order, options in ``llm_options`` order), then other blocks;
        ``sample_prior`` is kept where ``features`` hold counted blocks."""
        order = {q: i for i, q in enumerate(rubric.ids)}
        blocks = []
        for (source, qid), part in features.groupby(["source", "question_id"], sort=False):
            if qid in rubric:
                options = rubric[qid].llm_options
            else:
                options = tuple(sorted(part.option.unique(), key=_option_sort_key))
            blocks.append(Block(str(source), str(qid), tuple(options)))
        blocks.sort(key=lambda b: (order.get(b.question_id, len(order)), b.question_id, b.source))
        return cls(tuple(blocks), sample_prior if sample_prior is not None and counted(features) else None)

    def smoothed(self, features: pd.DataFrame) -> pd.DataFrame:
        """``features`` as this layout reads them: counted blocks smoothed by :attr:`sample_prior` where it is set."""
        return features if self.sample_prior is None else smoothed(features, self.sample_prior)

    def restrict(self, question_ids: list[str] | None = None, drop: list[str] | None = None) -> FeatureLayout:
        """Keep only blocks of ``question_ids`` and/or remove blocks of ``drop``."""
        blocks = [
            b
            for b in self.blocks
            if (question_ids is None or b.question_id in question_ids) and b.question_id not in (drop or [])
        ]
        if not blocks:
            raise InputError(f"no feature blocks left after restricting to {question_ids} / dropping {drop}")
        return replace(self, blocks=tuple(blocks))

    @memoised
    def matrix(self, features: pd.DataFrame, text_ids: list[str], absent_ok: bool = False) -> np.ndarray:
        """(texts, dim) float32: probabilities per block in layout order, then presence flags.

        A block missing for a text is zeros with presence flag 0. Blocks in ``features``
        with other options than the layout's are an error (layout mismatch), as is a layout
        block absent from all of ``features`` unless ``absent_ok`` (see :meth:`check`).
        """
        self.check(features, absent_ok)
        features = self.smoothed(features)
        index = pd.Index(text_ids)
        x = np.zeros((len(text_ids), self.dim), dtype=np.float32)
        n_probs = self.dim - len(self.blocks)
        offset = 0
        feats = features[features.text_id.isin(index)]
        groups = dict(tuple(feats.groupby(["source", "question_id"], sort=False)))
        for b, block in enumerate(self.blocks):
            part = groups.get((block.source, block.question_id))
            if part is not None:
                rows = index.get_indexer(part.text_id)
                cols = offset + pd.Index(block.options).get_indexer(part.option)
                x[rows, cols] = part.prob.to_numpy(dtype=np.float32)
                x[np.unique(rows), n_probs + b] = 1.0
            offset += len(block.options)
        return x

    def check(self, features: pd.DataFrame, absent_ok: bool = False) -> None:
        """Every layout block must appear in ``features`` with exactly the layout's options; with
        ``absent_ok`` a block may be absent, but ``features`` must share at least one block with the layout."""
        distinct = features[["source", "question_id", "option"]].drop_duplicates()
        seen = distinct.groupby(["source", "question_id"], sort=False)["option"].agg(set)
        shared = [b for b in self.blocks if (b.source, b.question_id) in seen.index]
        if absent_ok and self.blocks and not shared:
            raise InputError(
                f"feature layout mismatch: the features share no block with the model (model: "
                f"{[b.name for b in self.blocks]}, features: {sorted('/'.join(map(str, k)) for k in seen.index)})",
                file=source_of(features),
                column="question_id",
            )
        for block in self.blocks:
            key = (block.source, block.question_id)
            if key not in seen.index:
                if absent_ok:
                    continue
                raise InputError(
                    f"feature layout mismatch: block {block.name} expected by the model is absent from the features "
                    f"(features have {sorted('/'.join(k) for k in seen.index)})",
                    file=source_of(features),
                    column="question_id",
                )
            if seen[key] != set(block.options):
                raise InputError(
                    f"feature layout mismatch: block {block.name} has options {sorted(seen[key])}, the model expects {list(block.options)}",
                    file=source_of(features),
                    column="option",
                )

    def to_dict(self) -> list[dict]:
        """Each block as a dict; each also holds ``sample_prior`` where it is set (a checkpoint's layout)."""
        prior = {} if self.sample_prior is None else {"sample_prior": self.sample_prior}
        return [
            {"source": b.source, "question_id": b.question_id, "options": list(b.options), **prior} for b in self.blocks
        ]

    @classmethod
    def from_dict(cls, data: list[dict]) -> FeatureLayout:
        blocks = tuple(Block(d["source"], d["question_id"], tuple(d["options"])) for d in data)
        return cls(blocks, next((d["sample_prior"] for d in data if "sample_prior" in d), None))


def _option_sort_key(option: str):
    try:
        return (0, float(option), option)
    except ValueError:
        return (1, 0.0, option)


@dataclass(frozen=True)
class JudgeMap:
    """Judge ids known to a model, in index order."""

    judges: tuple[str, ...]

    @classmethod
    def from_annotations(cls, annotations: pd.DataFrame) -> JudgeMap:
        return cls(tuple(sorted(annotations.judge_id.unique(), key=_option_sort_key)))

    def indices(self, judge_ids: pd.Series) -> np.ndarray:
        """Index of each judge; -1 (shared weights only) for unseen judges, with a warning naming them."""
        idx = pd.Index(self.judges).get_indexer(judge_ids).astype(np.int64)
        unseen = sorted(pd.unique(np.asarray(judge_ids)[idx < 0]))
        if unseen:
            log.warning(
                "judges never seen in training, predicted with the shared weights only: %s", ", ".join(map(str, unseen))
            )
        return idx


@dataclass
class Encoded:
    """Tensors of one data set: one row per (text, judge, round) pair.

    x: (pairs, dim) float32, judge: (pairs,) long (-1 = unseen), y: (pairs, questions) long
    option index (-1 = not observed); ``pairs`` holds the ids of each row.
    """

    x: torch.Tensor
    judge: torch.Tensor
    y: torch.Tensor
    pairs: pd.DataFrame

    def __len__(self) -> int:
        return len(self.pairs)

    def take(self, rows: np.ndarray) -> Encoded:
        rows = torch.as_tensor(rows, dtype=torch.long)
        return Encoded(
            self.x[rows], self.judge[rows], self.y[rows], self.pairs.iloc[rows.numpy()].reset_index(drop=True)
        )


def with_round(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a ``round`` column (default "1"), so pairs are keyed by (text, judge, round)."""
    return df if "round" in df.columns else df.assign(round="1")


@memoised
def pairs_of(annotations: pd.DataFrame) -> pd.DataFrame:
    """The annotated (text, judge, round) pairs, with system ids where known."""
    ann = with_round(annotations)
    cols = PAIR + (["system_id"] if "system_id" in ann.columns else [])
    return ann[cols].drop_duplicates(PAIR).sort_values(PAIR, kind="stable").reset_index(drop=True)


@memoised
def question_targets(tables: Tables, question) -> tuple[pd.DataFrame, np.ndarray]:
    """The annotated pairs of ``question`` and each pair's option index (-1: not an option)."""
    ann = with_round(tables.annotations)
    ann = ann[ann.question_id == question.id]
    pairs = pairs_of(ann)
    answers = ann.drop_duplicates(PAIR).set_index(PAIR).answer.reindex(pd.MultiIndex.from_frame(pairs[PAIR]))
    return pairs, pd.Index(question.keys).get_indexer(answers.to_numpy())


def encode(
    tables: Tables,
    rubric: Rubric,
    layout: FeatureLayout,
    judges: JudgeMap,
    pairs: pd.DataFrame | None = None,
    absent_ok: bool = False,
) -> Encoded:
    """Encode annotations (or explicit ``pairs`` to predict) as tensors (``absent_ok``: see
    :meth:`FeatureLayout.matrix`)."""
    ann = with_round(tables.annotations)
    pairs = pairs_of(ann) if pairs is None else pairs.assign(round=pairs.get("round", "1")).reset_index(drop=True)
    text_ids = sorted(pairs.text_id.unique())
    missing = set(text_ids) - set(tables.features.text_id.unique())
    if missing:
        raise InputError(
            f"{len(missing)} texts have no features (first: {sorted(missing)[0]!r})",
            file=source_of(tables.features),
            column="text_id",
        )
    x_text = layout.matrix(tables.features, text_ids, absent_ok)
    row_of_text = pd.Index(text_ids).get_indexer(pairs.text_id)
    y = np.full((len(pairs), len(rubric.questions)), -1, dtype=np.int64)
    pair_index = pd.MultiIndex.from_frame(pairs[PAIR])
    ann_rows = pair_index.get_indexer(pd.MultiIndex.from_frame(ann[PAIR]))
    found = ann_rows >= 0
    q_index = pd.Index(rubric.ids).get_indexer(ann.question_id)
    options = pd.MultiIndex.from_tuples([(q.id, key) for q in rubric.questions for key in q.keys])
    option_number = np.array([i for q in rubric.questions for i in range(len(q.keys))], dtype=np.int64)
    found_option = options.get_indexer(pd.MultiIndex.from_arrays([ann.question_id, ann.answer]))
    option_index = np.where(found_option >= 0, option_number[found_option], -1)
    unknown = found & (q_index >= 0) & (option_index < 0)
    if unknown.any():
        row = int(np.flatnonzero(unknown)[0])
        raise InputError(
            f"answer {ann.answer.iloc[row]!r} is not an option of question {ann.question_id.iloc[row]}",
            file=source_of(tables.annotations),
            row=row,
            column="answer",
        )
    keep = found & (q_index >= 0)
    y[ann_rows[keep], q_index[keep].astype(int)] = option_index[keep]
    return Encoded(
        x=torch.from_numpy(x_text[row_of_text]),
        judge=torch.from_numpy(judges.indices(pairs.judge_id)),
        y=torch.from_numpy(y),
        pairs=pairs,
    )
