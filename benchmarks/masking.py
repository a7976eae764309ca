"""Absent feature blocks (issue 34, items 1–2): the answer model's calibration and predictions from
part of the blocks, by 5-fold CV by text.

    .venv/bin/python benchmarks/masking.py [--part calibration nll] [--sets synthetic simulated real]
        [--families ridge_judge clmm_all network] [--folds 5] [--data ../shared/data/llm-rubric]

``calibration``: the answer model (:class:`llmrubric.model.core.answers.AnswerModel`) is fitted on the
training folds' features; on each held-out text a random half of its blocks is hidden and the
central 80 % (and 50 %, 95 %) interval of each hidden block's column given the others is checked
against the real column (coverage, nominal 0.80), for the logit transform (shipped) and a Gaussian
of the raw columns (``identity``). Features only: the real set's GPT-3.5 answers are inputs, no labels.

``nll``: each family is fitted on the training folds (complete blocks) and predicts the held-out
texts' main question with every block, with a random half of each text's blocks removed
(marginalised: :mod:`llmrubric.model.core.absent`; and the old filling: zeros and flags for the
network, the training mean for ridge and the mixed model) and with no block (every block drawn
from the answer model's marginal). Pair NLL and Pearson; the issue's target: NLL with half the
blocks at most halfway between all and none. Synthetic and simulated sets only (no test labels
are used to choose anything). Writes ``benchmarks/results/masking.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import code_version, exit_code, llm_rubric_default, write_result  # noqa: E402
from llmrubric.config import TrainConfig, model_settings  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.splits import text_folds  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import Tables, load_tables  # noqa: E402
from llmrubric.model.auto_settings import candidate  # noqa: E402
from llmrubric.model.core.absent import DRAWS, SEED, batch_of  # noqa: E402
from llmrubric.model.core.answers import TRANSFORMS, AnswerModel  # noqa: E402
from llmrubric.model.core.encoding import FeatureLayout, question_targets  # noqa: E402
from llmrubric.model.core.registry import fit_questions  # noqa: E402
from llmrubric.model.core.threads import one_thread  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "masking.json"
LEVELS = (0.5, 0.8, 0.95)


def load(name: str, data: str, rubric: Rubric) -> Tables:
    if name == "simulated":
        d = ROOT / "data" / "simulated"
        return load_tables(d / "annotations.csv", d / "features.csv", rubric, d / "texts.csv")
    return llm_rubric.load(data, name, rubric)


def half_masks(n_texts: int, n_blocks: int, seed: int) -> np.ndarray:
    """(texts, blocks) bool: a random half of each text's blocks (rounded down)."""
    rng = np.random.default_rng(seed)
    masks = np.zeros((n_texts, n_blocks), dtype=bool)
    for t in range(n_texts):
        masks[t, rng.permutation(n_blocks)[: n_blocks // 2]] = True
    return masks


def calibration(tables: Tables, rubric: Rubric, folds: int) -> dict:
    """Coverage of the hidden columns' intervals, per transform (module doc)."""
    texts = tables.text_ids
    fold = text_folds(texts, folds, 0).set_index("text_id").fold
    layout = FeatureLayout.from_features(tables.features, rubric)
    out = {}
    for transform in TRANSFORMS:
        hits = {level: [] for level in LEVELS}
        for k in range(folds):
            train, test = [t for t in texts if fold[t] != k], [t for t in texts if fold[t] == k]
            model = AnswerModel.fit(tables.subset(train).features, layout, rubric, transform)
            truth = model.columns(tables.features, test)
            hidden = half_masks(len(test), model.n_blocks, k)[:, model.column_block] & ~np.isnan(truth)
            for level in LEVELS:
                low, high = model.interval(np.where(hidden, np.nan, truth), level)
                hits[level].append(((truth >= low - 1e-9) & (truth <= high + 1e-9))[hidden])
        out[transform] = {f"coverage_{int(level * 100)}": float(np.concatenate(hits[level]).mean()) for level in LEVELS}
        out[transform]["hidden_columns"] = int(sum(len(h) for h in hits[0.8]))
    return out


def scores(probs: np.ndarray, answers: np.ndarray, question) -> dict:
    p = np.clip(probs[np.arange(len(answers)), answers], 1e-12, 1.0)
    values = np.asarray(question.values, dtype=float)
    return {
        "pair_nll": float(-np.log(p).mean()),
        "pair_pearson": float(np.corrcoef(probs @ values, values[answers])[0, 1]),
    }


def fold_probs(model, test: Tables, mask: np.ndarray | None, fill: bool) -> np.ndarray:
    """Held-out main-question probabilities with the blocks of ``mask`` hidden (None: all present;
    ``fill``: the old filling instead of marginalising)."""
    main = model.rubric.ids.index(model.rubric.main.id)
    k = len(model.rubric.main.options)
    pairs, _ = question_targets(test, model.rubric.main)
    if mask is None:
        return model.predict_proba(test, pairs)[:, main, :k]
    batch = batch_of(model, test, pairs)
    if fill:
        old = copy.copy(model)
        blocks = model.answers_.layout.blocks
        hidden = {(batch.texts[t], blocks[b].source, blocks[b].question_id) for t, b in zip(*np.nonzero(mask))}
        f = test.features
        keep = [(t, s, q) not in hidden for t, s, q in zip(f.text_id, f.source, f.question_id)]
        _unset_answers(old)
        return old.predict_proba(Tables(test.annotations, f[keep], test.texts), pairs)[:, main, :k]
    batch = batch.hide(mask)
    draws = model.answers_.sample(batch.columns, DRAWS, SEED)
    return model.proba_completed(batch, draws).mean(axis=0)[:, main, :k]


def _unset_answers(model) -> None:
    """The model without its answer model: the filling of absent blocks it had before (issue 34)."""
    for member in getattr(model, "members_", {}).values():
        member.answers_ = None
    if not hasattr(model, "members_"):
        model.answers_ = None


def nll(tables: Tables, rubric: Rubric, families: list[str], folds: int) -> dict:
    texts = tables.text_ids
    fold = text_folds(texts, folds, 0).set_index("text_id").fold
    out = {}
    for family in families:
        start = time.perf_counter()
        probs = {"all": [], "half": [], "half_filled": [], "none": []}
        answers = []
        for k in range(folds):
            train = tables.subset([t for t in texts if fold[t] != k])
            test = tables.subset([t for t in texts if fold[t] == k])
            model = candidate(family, rubric, model_settings(None), TrainConfig(), 0)
            model = fit_questions(model, train, [rubric.main.id])
            pairs, y = question_targets(test, rubric.main)
            answers.append(y)
            batch = batch_of(model, test, pairs)
            n_blocks = model.answers_.n_blocks
            half = half_masks(len(batch.texts), n_blocks, k)
            probs["all"].append(fold_probs(model, test, None, False))
            probs["half"].append(fold_probs(model, test, half, False))
            probs["half_filled"].append(fold_probs(model, test, half, True))
            probs["none"].append(fold_probs(model, test, np.ones_like(half), False))
        y = np.concatenate(answers)
        out[family] = {case: scores(np.concatenate(p), y, rubric.main) for case, p in probs.items()}
        nlls = {case: r["pair_nll"] for case, r in out[family].items()}
        out[family]["half_at_most_halfway"] = bool(nlls["half"] <= (nlls["all"] + nlls["none"]) / 2)
        out[family]["seconds"] = time.perf_counter() - start
        print(family, json.dumps(out[family]), flush=True)
    return out


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", nargs="+", default=["calibration", "nll"], choices=["calibration", "nll"])
    parser.add_argument("--sets", nargs="+", default=["synthetic", "simulated", "real"])
    parser.add_argument("--families", nargs="+", default=["ridge_judge", "clmm_all", "network"])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--data", default=llm_rubric_default())
    args = parser.parse_args(argv)
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    result = json.loads(OUT.read_text()) if OUT.is_file() else {}
    version = code_version()
    runs = result.setdefault("meta", {}).setdefault("runs", {})  # each set's parts' commit: parts merge
    with one_thread(blas=True):
        for name in args.sets:
            tables = load(name, args.data, rubric)
            entry = result.setdefault(name, {})
            if "calibration" in args.part:
                entry["calibration"] = calibration(tables, rubric, args.folds)
                print(name, "calibration", json.dumps(entry["calibration"]), flush=True)
            if "nll" in args.part and name != "real":
                entry["nll"] = nll(tables, rubric, args.families, args.folds)
            runs.update({f"{name}.{part}": version for part in args.part if part in entry})
    write_result(result, OUT, version)
    print(f"written to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(run, None))
