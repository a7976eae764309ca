"""How much each block weighs in the calibrated score, for the adaptive stop weighted by it (docs/extract.md,
"Weighted by the score"): a block (source, question) whose expected answer moves the main question's calibrated
answer more gets a smaller tolerance, ``tolerance / weight``, so more answers.

The weight is ``|coef| / sd`` of a ridge (:class:`sklearn.linear_model.RidgeCV`, on standardised columns) of the
main question's mean human answer on every (source, question) block's expected answer, from a pilot extraction of
labelled texts; normalised to mean 1 over the features' blocks. Blocks of categories have no expected answer and
weigh 1.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from sklearn.linear_model import RidgeCV

from llmrubric.extract.adaptive_stop import moments, option_values
from llmrubric.io.errors import InputError, yaml_error
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables

log = logging.getLogger(__name__)
BLOCK = ["text_id", "source", "question_id"]
ALPHAS = np.logspace(-2, 3, 21)  # the ridge penalties RidgeCV chooses among (leave-one-out)
MIN_LABELLED_TEXTS = 3  # the fewest labelled texts with features a ridge is fitted on


def block_spreads(features: pd.DataFrame) -> pd.DataFrame:
    """Per block of 2+ options: its expected answer and spread (the sd of its value on a scale, else of the option
    indicators) under its own distribution; blocks of categories have no expected answer (NaN)."""
    rows = []
    for key, block in features.groupby(BLOCK, sort=False):
        if len(block) < 2:
            continue
        p = block["prob"].to_numpy(dtype=float)
        expected, spread = moments(p / p.sum(), option_values(block["option"].tolist()))
        rows.append((*key, np.nan if expected is None else expected, spread))
    return pd.DataFrame(rows, columns=[*BLOCK, "expected", "spread"])


def main_labels(annotations: pd.DataFrame, rubric: Rubric) -> pd.Series:
    """text_id → the main question's mean numeric human answer; an error naming the question when it has none."""
    main = rubric.main.id
    labels = annotations[annotations.question_id.astype(str) == main]
    target = pd.to_numeric(labels["answer"], errors="coerce").groupby(labels["text_id"]).mean().dropna()
    if target.empty:
        raise InputError(f"the main question {main!r} has no numeric human answer to weigh the blocks by")
    return target


def ridge_weights(blocks: pd.DataFrame, tables: Tables, rubric: Rubric) -> pd.Series:
    """Per (source, question) with an expected answer: |d main answer / d expected answer| of a ridge of the main
    question's mean human answer on the blocks' expected answers (missing blocks: the column mean); not
    normalised."""
    target = main_labels(tables.annotations, rubric)
    wide = blocks.set_index(BLOCK)["expected"].unstack(["source", "question_id"]).dropna(axis=1, how="all")
    if wide.empty:
        return pd.Series(dtype=float, index=pd.MultiIndex.from_tuples([], names=["source", "question_id"]))
    x = wide.loc[wide.index.intersection(target.index)]
    if len(x) < MIN_LABELLED_TEXTS:
        raise InputError(
            f"{len(x)} texts have both features on a scale and a human answer to the main question "
            f"{rubric.main.id!r}; the weights need at least {MIN_LABELLED_TEXTS}"
        )
    x = x.fillna(x.mean())
    scale = x.std().replace(0, 1.0).fillna(1.0)
    fit = RidgeCV(alphas=ALPHAS).fit((x - x.mean()) / scale, target.loc[x.index])
    return pd.Series(np.abs(fit.coef_) / scale.to_numpy(), index=x.columns)


def score_weights(tables: Tables, rubric: Rubric) -> dict[str, dict[str, float]]:
    """``{source: {question_id: weight}}`` of every block of the features (:func:`ridge_weights`), scaled to mean
    1 over the features' (text, source, question) blocks; blocks of categories weigh 1."""
    blocks = block_spreads(tables.features.reset_index(drop=True))
    raw = ridge_weights(blocks, tables, rubric)
    keys = pd.MultiIndex.from_frame(blocks[["source", "question_id"]])
    numeric = keys.isin(raw.index)
    mean = float(np.mean(raw.reindex(keys[numeric]).to_numpy())) if numeric.any() else 0.0
    scaled = raw / mean if mean > 0 else raw * 0.0 + 1.0
    weights: dict[str, dict[str, float]] = {}
    for source, question in dict.fromkeys(keys):
        value = scaled.get((source, question), 1.0)
        weights.setdefault(str(source), {})[str(question)] = float(value)
    return weights


def read_weights(path: str | Path, source: str, questions) -> dict[str, float]:
    """The weights of ``source`` in the weights YAML at ``path`` (``extract weights``), one per question of
    ``questions``: missing ones weigh 1 with a warning naming them; a source the file lacks is an error."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise InputError(f"cannot read the tolerance weights: {e.strerror or e}", file=str(path)) from e
    except yaml.YAMLError as e:
        raise yaml_error(e, str(path)) from e
    if not isinstance(data, Mapping) or not all(isinstance(v, Mapping) for v in data.values()):
        raise InputError("tolerance weights: expected {source: {question_id: weight}}", file=str(path))
    if source not in data:
        raise InputError(f"no weights of source {source!r}; the file holds {sorted(map(str, data))}", file=str(path))
    given = {str(q): w for q, w in data[source].items()}
    for question, weight in given.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            raise InputError(
                f"source {source!r}, question {question!r}: weight {weight!r} is not a number >= 0", file=str(path)
            )
    missing = sorted({str(q) for q in questions} - set(given))
    if missing:
        log.warning("%s: no weight of source %r for questions %s: they weigh 1", path, source, ", ".join(missing))
    return {str(q): float(given.get(str(q), 1.0)) for q in dict.fromkeys(questions)}
