"""Part ``cv`` of ``benchmarks/real_llm.py``: 5-fold CV by dialogue on the real LLM-Rubric
annotations (main question, pooled over (dialogue, judge) pairs) with several feature sets:

- ``gpt35``: the release's GPT-3.5 distributions;
- ``smollm2``: the committed SmolLM2 table (``--features``);
- ``smollm2_permuted``: a SmolLM2 table extracted with ``orders: 2`` (``--permuted``; skipped,
  with the reason recorded, when not given or absent);
- ``both``: GPT-3.5 and SmolLM2 as two sources.

Only the dialogues whose SmolLM2 features are complete (every applicable block done) are used,
for every feature set, with the same folds. Methods: ``expected`` (the source's expected answer;
``expected_<set>`` per source with two), ``mean_of_sources`` (two sources), ``ridge_judge``,
``llm_rubric`` (the default calibrator, ``--seeds`` seeds, metrics averaged). Metrics: Pearson,
Kendall, NLL (``llmrubric.evaluation.metrics.evaluate``) and smECE (mean over the answer
values of the one-vs-rest smoothed ECE). A paired bootstrap over dialogues (scipy.stats.bootstrap)
gives the NLL difference ``both`` − ``gpt35`` of each learned method with a 95 % interval.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from real_llm_probe import complete_dialogues
from scipy import stats
from table1 import make
from tqdm.auto import tqdm

from llmrubric.data import llm_rubric
from llmrubric.data.splits import text_folds
from llmrubric.evaluation.calibration import smece
from llmrubric.evaluation.metrics import evaluate
from llmrubric.evaluation.significance import align_methods, pair_nll
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables, read_table, validate_features

ROOT = Path(__file__).resolve().parents[1]
SHORT = {llm_rubric.SOURCE: "gpt35"}


def cross_validate(name: str, rubric: Rubric, tables: Tables, folds: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Out-of-fold predictions of one method for every annotated pair."""
    parts = []
    for k in sorted(folds.fold.unique()):
        train = tables.subset(folds.text_id[folds.fold != k])
        test = tables.subset(folds.text_id[folds.fold == k])
        parts.append(make(name, rubric, seed).fit(train).predict(test))
    return pd.concat(parts, ignore_index=True)


def figures(predictions: pd.DataFrame, annotations: pd.DataFrame, rubric: Rubric) -> dict:
    question = rubric.main
    m = evaluate(predictions, annotations, question, per_judge=False)
    aligned = align_methods({"m": predictions}, annotations, question)
    probs, index = aligned.probs["m"], aligned.answer_index
    ece = np.mean([smece(probs[:, j], (index == j).astype(float)) for j in range(len(question.keys))])
    return {"pearson": m["pearson"], "kendall": m["kendall"], "nll": m["nll"], "smece": float(ece)}


def dialogue_nll(predictions: pd.DataFrame, annotations: pd.DataFrame, rubric: Rubric) -> pd.DataFrame:
    """Per dialogue: summed NLL of its annotated main-question pairs and their count."""
    aligned = align_methods({"m": predictions}, annotations, rubric.main)
    losses = pair_nll(aligned.probs["m"], aligned.answer_index)
    return pd.DataFrame({"text_id": aligned.pairs.text_id, "nll": losses}).groupby("text_id").nll.agg(["sum", "count"])


def paired_bootstrap(a: pd.DataFrame, b: pd.DataFrame, seed: int = 0) -> dict:
    """Mean pair NLL of b minus a, resampling dialogues (paired), percentile 95 % interval."""
    a, b = a.align(b, join="inner", axis=0)
    diff, count = (b["sum"] - a["sum"]).to_numpy(), a["count"].to_numpy().astype(float)
    statistic = lambda d, n, axis=-1: d.sum(axis=axis) / n.sum(axis=axis)
    res = stats.bootstrap(
        (diff, count),
        statistic,
        paired=True,
        vectorized=True,
        n_resamples=5000,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return {
        "nll_difference": float(statistic(diff, count)),
        "ci95": [low, high],
        "dialogues": len(diff),
        "not_worse": bool(low <= 0.0 or statistic(diff, count) <= 0.0),
        "better": bool(high < 0.0),
    }


def feature_sets(args, rubric: Rubric, real) -> tuple[dict, dict]:
    smollm2 = validate_features(read_table(args.features, "features"), rubric)
    sets = {"gpt35": real.features, "smollm2": smollm2}
    skipped = {}
    permuted = Path(args.permuted) if args.permuted else None
    if permuted and permuted.is_file():
        sets["smollm2_permuted"] = validate_features(read_table(permuted, "features"), rubric)
    else:
        skipped["smollm2_permuted"] = (
            f"{permuted} not found" if permuted else "no features table extracted with orders: 2 (--permuted)"
        )
    sets["both"] = validate_features(pd.concat([real.features, smollm2], ignore_index=True), rubric)
    return sets, skipped


def cv(args, cfg: dict) -> dict:
    start = time.perf_counter()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rubric = Rubric.load(ROOT / cfg["rubric"])
    real = llm_rubric.load(Path(args.data).parents[1], "real", rubric)
    ids = sorted(set(complete_dialogues(args.features)) & set(real.text_ids))
    annotations = real.annotations[real.annotations.text_id.isin(ids)]
    folds = text_folds(ids, 5, seed=0)
    sets, skipped = feature_sets(args, rubric, real)
    main = annotations[annotations.question_id == rubric.main.id]
    out = {
        "dialogues": len(ids),
        "pairs": len(main),
        "judges": int(main.judge_id.nunique()),
        "folds": 5,
        "seeds": args.seeds,
        "skipped": skipped,
        "note": (
            f"all {len(ids)} real dialogues"
            if len(ids) == len(set(real.text_ids))
            else f"partial: the {len(ids)} of {len(set(real.text_ids))} dialogues with complete SmolLM2 features"
        ),
    }
    losses = {}
    for name, features in sets.items():
        tables = Tables(annotations, features[features.text_id.isin(ids)])
        sources = sorted(features.source.unique())
        methods = {}
        if len(sources) == 1:
            methods["expected"] = ["expected_llm"]
        else:
            for s in sources:
                methods[f"expected_{SHORT.get(s, 'smollm2')}"] = [f"expected_llm/{s}"]
            methods["mean_of_sources"] = ["expected_llm"]
        methods["ridge_judge"] = ["ridge_judge"]
        methods["llm_rubric"] = ["llm_rubric"] * args.seeds
        out[name] = {}
        for label, runs in methods.items():
            per_seed, nll_parts = [], []
            for seed, method in enumerate(tqdm(runs, desc=f"{name} {label}", disable=len(runs) == 1)):
                predictions = cross_validate(method, rubric, tables, folds, seed)
                per_seed.append(figures(predictions, annotations, rubric))
                nll_parts.append(dialogue_nll(predictions, annotations, rubric))
            out[name][label] = {m: float(np.mean([f[m] for f in per_seed])) for m in per_seed[0]}
            if len(per_seed) > 1:
                out[name][label]["pearson_sd"] = float(np.std([f["pearson"] for f in per_seed], ddof=1))
                out[name][label]["nll_sd"] = float(np.std([f["nll"] for f in per_seed], ddof=1))
            losses[name, label] = sum(nll_parts) / len(nll_parts)
            print(name, label, out[name][label], flush=True)
    out["bootstrap_nll_both_vs_gpt35"] = {
        method: paired_bootstrap(losses["gpt35", method], losses["both", method])
        for method in ("ridge_judge", "llm_rubric")
    }
    out["seconds"] = round(time.perf_counter() - start, 1)
    logging.disable(logging.NOTSET)
    return out
