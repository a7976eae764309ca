"""Issue 58: how many samples a judge without logprobs needs. Each logprob block of a data set is replaced by the
empirical distribution of ``k`` answers drawn from it (what temperature-1 sampling of a one-token answer returns;
``samples`` = k), or by the answers the adaptive stop (:func:`llmrubric.extract.adaptive_stop.needs_more`) asks for,
drawn one at a time until it says stop; the model is trained on each outer fold as ``train.py`` builds it and scored
against the same model on the logprob features.

    .venv/bin/python benchmarks/samples.py [--cells CELL ...] [--workers 2] [--partial PATH] [--out PATH]
    .venv/bin/python benchmarks/samples.py --list
    .venv/bin/python benchmarks/samples.py --assemble PATH   # write --out from the cells a partial run finished

A cell is ``<set>/<protocol>/<method>/<features>[/a<prior>]``: sets ``dialsumm`` (../shared/data/dialsumm),
``llm_rubric_synthetic`` and ``llm_rubric_real`` (the release's loader); protocols ``cv`` (5 folds by text) and
``systems`` (leave one system out); methods ``auto`` (the shipped default, ``model=auto``), ``network``
(``model=network``, the network alone: the default's usual choice, six times cheaper) and ``ridge_judge`` (the
candidate of model=auto alone, fed the tables model=auto hands its members, a hundred times cheaper); features
``logprob``, ``k<K>s<SEED>`` (the first K answers of each block), ``t<TOL>s<SEED>`` (the adaptive stop of
``llmrubric/extract/adaptive_stop.py`` at tolerance TOL, at most :data:`MAX_SAMPLES` answers), ``p<TOL>s<SEED>`` and
``m<TOL>s<SEED>`` (two equal-precision rules simulated beside it: every option's, or the expected answer's,
posterior sd at most TOL) and ``w<TOL>s<SEED>`` (the stop with each block's tolerance divided by its weight in the
score, learnt per outer fold on the training texts: :func:`score_weighted`); ``/a<PRIOR>`` sets ``model.sample_prior`` (else the shipped one). All cells of one seed
read prefixes of the same answer sequence per block (paired: a stop is compared with fixed k on the very answers it
read); seeds share nothing. Cells without ``draws`` in the JSON were drawn before the pairing, independently per
cell (their figures stand alone; the adaptive comparison leaves them out). Figures of the main question, pooled over the outer
folds: pair NLL, pair Pearson, interval width (the mean width of each pair's central 90 % predictive interval) and
system RMS (the systems' mean predicted minus mean human answer), with the mean samples per block. Each finished cell
is written to ``--partial`` at once, so a run that is stopped loses one cell; ``--assemble`` writes the result from it.
Writes ``benchmarks/results/samples.json``: the cells, per set, protocol and method the smallest k from which every
k measured is within 0.01 pair NLL of the logprob features, the adaptive stops against fixed k at equal pair NLL
(per seed), what any stop could save on each set (``benchmarks/sample_bounds.py``) and the anchors beside them.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import re
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import sample_bounds  # noqa: E402
from common import code_version, exit_code, write_result  # noqa: E402

from llmrubric.apps.evaluate import evaluate_predicted, predicted_annotations  # noqa: E402
from llmrubric.apps.train import auto_group  # noqa: E402
from llmrubric.config import ModelConfig, compose, group, model_file  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.splits import system_folds, text_folds, text_systems  # noqa: E402
from llmrubric.evaluation.transfer import pair_scores, system_means  # noqa: E402
from llmrubric.extract.adaptive_stop import MIN_SAMPLES, needs_more, option_values  # noqa: E402
from llmrubric.extract.tolerance_weights import score_weights  # noqa: E402
from llmrubric.io.errors import InputError  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import Tables, load_tables, validate_features  # noqa: E402
from llmrubric.model.auto_settings import build_model, candidate  # noqa: E402
from llmrubric.model.core.registry import fit_questions  # noqa: E402
from llmrubric.model.core.samples import smoothed_tables  # noqa: E402
from llmrubric.model.core.threads import single_threaded  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "samples.json"
PARTIAL = ROOT / "benchmarks" / "results" / "samples.partial.jsonl"
DIALSUMM = ROOT.parent / "shared" / "data" / "dialsumm"
KS = (1, 2, 3, 5, 10, 20)
ADAPTIVE_RULES = ("t", "p", "m", "w")  # the extractor's, then two equal-precision rules (adaptive_features)
RULES = ("k", *ADAPTIVE_RULES)
DRAWS = "paired"  # the cells of one seed read prefixes of the same answers (answer_sequences)
TOLERANCES = (0.15, 0.1, 0.07, 0.05)  # the extractor's rule: answers per block ~ spread / tolerance
EQUAL_PRECISION = {"p": (0.15, 0.12, 0.1), "m": (0.5, 0.4, 0.3)}  # every option's posterior sd; the expected answer's
MAX_SAMPLES = 40
WITHIN = 0.01  # the bound on the pair NLL lost to sampling
BLOCK = ["text_id", "source", "question_id"]
ANCHORS = {
    "ridge_rater_indicators_text_cv_dialsumm": {
        "logprob_pair_nll": 0.996,
        "pair_nll_lost": {"1": 0.026, "3": 0.012, "10": 0.006, "20": 0.003},
        "source": "issue 58 (ridge on all expected answers with rater indicators, 5-fold text CV, DialSumm)",
    },
    "g_eval_samples": 20,
    "targets": {"k10_within_0.01_dialsumm_both_protocols": True, "adaptive_fewer_samples_than_fixed_k": 0.30},
}


def grid() -> list[str]:
    """The cells of the grid, in the order they run: the network's logprob reference on DialSumm; with
    ``ridge_judge`` (the candidate of the issue's anchor, a hundred times cheaper) fixed k and the extractor's stop
    on the same draws, 8 seeds by text CV, 4 leaving a system out, stops also with ``model.sample_prior`` 1 (4 and 2
    seeds), the two equal-precision rules (2 seeds) and the stop weighted by the score (4 seeds); the release
    (4 seeds); then the network and the shipped default
    (``auto``, each of its cells costs six of the network's) on the k that matter, with ``model.sample_prior`` 1
    (they ran before its default became 0; with one k for every block the prior is an affine map the models
    absorb)."""
    fixed = lambda seeds, ks=KS: [f"k{k}s{s}" for s in seeds for k in ks]  # noqa: E731
    stops = lambda seeds, tolerances=TOLERANCES: [f"t{t:g}s{s}" for s in seeds for t in tolerances]  # noqa: E731
    ridge = "dialsumm/cv/ridge_judge"
    cells = ["dialsumm/cv/network/logprob", f"{ridge}/logprob"]
    cells += [f"{ridge}/{f}" for f in (*fixed(range(8)), *stops(range(8)))]
    cells += [f"{ridge}/{f}/a1" for f in stops(range(4), (0.15, 0.07))]
    cells += [f"{ridge}/{r}{t:g}s{s}" for s in range(2) for r, ts in EQUAL_PRECISION.items() for t in ts]
    cells += [f"{ridge}/w{t:g}s{s}" for s in range(4) for t in (0.15, 0.1, 0.07)]
    ridge = "dialsumm/systems/ridge_judge"
    cells += [f"{ridge}/{f}" for f in ("logprob", *fixed(range(4)), *stops(range(4), (0.15, 0.07)))]
    cells += [f"{ridge}/{f}/a1" for f in stops((0, 1), (0.15, 0.07))]
    cells += [f"{ridge}/w{t:g}s{s}" for s in range(4) for t in (0.15, 0.1, 0.07)]
    for name in ("llm_rubric_synthetic", "llm_rubric_real"):
        cells += [f"{name}/cv/ridge_judge/{f}" for f in ("logprob", *fixed(range(4)))]
        cells += [f"{name}/cv/ridge_judge/{f}" for f in stops(range(4), (0.15, 0.07))]
        cells += [f"{name}/cv/ridge_judge/w{t:g}s{s}" for s in range(4) for t in (0.15, 0.07)]
    cells += [f"llm_rubric_synthetic/systems/ridge_judge/{f}" for f in ("logprob", "k3s0", "k10s0")]
    cells += [f"dialsumm/cv/network/{f}/a1" for f in ("k10s0", "k3s0", "k1s0")]  # one k a cell: the prior is affine
    cells += ["dialsumm/systems/network/logprob", "dialsumm/systems/network/k10s0/a1"]
    cells += ["dialsumm/cv/auto/logprob", *(f"dialsumm/cv/auto/{f}/a1" for f in ("k10s0", "k3s0"))]
    cells += ["dialsumm/systems/auto/logprob", "dialsumm/systems/auto/k10s0"]
    return cells


def block_codes(features: pd.DataFrame) -> np.ndarray:
    """Each row's block (text, source, question) as an integer, blocks numbered in order of appearance."""
    return pd.MultiIndex.from_frame(features[BLOCK]).factorize()[0]


def block_distributions(features: pd.DataFrame) -> tuple[np.ndarray, list[np.ndarray]]:
    """(each row's block, each block's row positions): the rows of every block, in table order."""
    code = block_codes(features)
    order = np.argsort(code, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(code[order]) != 0, True])
    return code, [order[a:b] for a, b in zip(starts[:-1], starts[1:])]


def seed_sequence(seed: int) -> np.random.SeedSequence:
    """One seed sequence per seed: seeds share nothing."""
    return np.random.SeedSequence([seed, 58])


def answer_sequences(features: pd.DataFrame, seed: int, length: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per block of 2+ options, its row positions and ``length`` answers drawn from its (normalised) distribution
    (as positions in the block). Every cell of one seed reads prefixes of the same answers, so that fixed k and the
    adaptive stops are compared on the same draws (paired); seeds share nothing."""
    rng = np.random.default_rng(seed_sequence(seed))
    prob = features["prob"].to_numpy(dtype=float)
    _, blocks = block_distributions(features)
    return [
        (rows, rng.choice(len(rows), size=length, p=prob[rows] / prob[rows].sum())) for rows in blocks if len(rows) > 1
    ]


def drawn_features(features: pd.DataFrame, k: int, seed: int) -> pd.DataFrame:
    """``features`` with each block of 2+ options replaced by the answer counts over its first ``k`` answers
    (:func:`answer_sequences`), ``samples`` = k; one-option blocks (values) keep their value and no ``samples``."""
    prob, samples = features["prob"].to_numpy(dtype=float).copy(), np.full(len(features), np.nan)
    for rows, answers in answer_sequences(features, seed, max(k, MAX_SAMPLES)):
        prob[rows] = np.bincount(answers[:k], minlength=len(rows)) / k
        samples[rows] = k
    return _with_samples(features, prob, samples)


def posterior_needs_more(counts: np.ndarray, tolerance: float, max_samples: int) -> bool:
    """An equal-precision rule simulated beside the extractor's: another answer while some option's posterior sd
    under Dirichlet(1 + counts) exceeds ``tolerance`` and fewer than ``max_samples`` were drawn."""
    if counts.sum() >= max_samples:
        return False
    alpha = 1.0 + counts
    total = alpha.sum()
    return bool(np.sqrt(alpha * (total - alpha) / (total**2 * (total + 1.0))).max() > tolerance)


def mean_needs_more(counts: np.ndarray, values: np.ndarray, tolerance: float, max_samples: int) -> bool:
    """An equal-precision rule simulated beside the extractor's: another answer while the posterior sd of the
    block's expected answer under Dirichlet(1 + counts) exceeds ``tolerance`` (in answer units) and fewer than
    ``max_samples`` were drawn."""
    if counts.sum() >= max_samples:
        return False
    alpha = 1.0 + counts
    total = alpha.sum()
    mean = alpha @ values / total
    return bool(np.sqrt(max(alpha @ values**2 / total - mean**2, 0.0) / (total + 1.0)) > tolerance)


def adaptive_features(
    features: pd.DataFrame,
    tolerance: float,
    max_samples: int,
    seed: int,
    rule: str = "t",
    weights: pd.Series | None = None,
) -> pd.DataFrame:
    """``features`` with each block of 2+ options replaced by the counts of its answers (:func:`answer_sequences`)
    read one at a time until the rule says stop at ``tolerance``, at most ``max_samples``, and at least one (a
    block of no answer is absent, not read). Rule ``t``: :func:`needs_more`, the extractor's (answers in proportion
    to their spread); ``p``: :func:`posterior_needs_more` and ``m``: :func:`mean_needs_more`, two equal-precision
    rules beside it. ``weights`` (per source and question, mean 1): a block's tolerance is ``tolerance / w``."""
    prob, samples = features["prob"].to_numpy(dtype=float).copy(), np.full(len(features), np.nan)
    source, question = features["source"].to_numpy(), features["question_id"].to_numpy()
    for rows, answers in answer_sequences(features, seed, max_samples):
        counts = np.zeros(len(rows), dtype=int)
        w = 1.0 if weights is None else max(float(weights.get((source[rows[0]], question[rows[0]]), 0.0)), 1e-6)
        more = stop_rule(rule, features["option"].iloc[rows].tolist(), tolerance / w, max_samples)
        for answer in answers:
            counts[answer] += 1
            if not more(counts):
                break
        prob[rows] = counts / counts.sum()
        samples[rows] = counts.sum()
    return _with_samples(features, prob, samples)


def stop_rule(rule: str, options: list, tolerance: float, max_samples: int):
    """The rule's ``counts -> another answer?`` for a block of these options (a scale's values, else categories)."""
    values = option_values(options)
    if rule == "t":
        return lambda c: needs_more(c, tolerance, max_samples, values)
    if rule == "p":
        return lambda c: posterior_needs_more(c, tolerance, max_samples)
    scale = np.arange(len(options), dtype=float) if values is None else np.asarray(values)
    return lambda c: mean_needs_more(c, scale, tolerance, max_samples)


def _with_samples(features: pd.DataFrame, prob: np.ndarray, samples: np.ndarray) -> pd.DataFrame:
    out = features.drop(columns=[c for c in ("samples",) if c in features]).assign(
        prob=prob, samples=pd.array(np.where(np.isnan(samples), 0, samples).astype(np.int64), dtype="Int64")
    )
    out.loc[np.isnan(samples), "samples"] = pd.NA
    return out


def parse_cell(cell: str) -> dict:
    """The parts of a cell name (module doc); an error naming the cell where it is not one."""
    parts = cell.split("/")
    if len(parts) not in (4, 5) or parts[0] not in SETS or parts[1] not in ("cv", "systems"):
        raise InputError(f"not a cell: {cell!r} (set/protocol/method/features[/a<prior>], --list)", setting="--cells")
    name, protocol, method, feats = parts[:4]
    prior = float(parts[4][1:]) if len(parts) == 5 else None
    if method not in (*FAMILIES, *CANDIDATES) or not (feats == "logprob" or feats[0] in RULES):
        raise InputError(f"not a cell: {cell!r}", setting="--cells")
    spec = {"set": name, "protocol": protocol, "method": method, "features": feats, "prior": prior}
    if feats != "logprob":
        value, seed = feats[1:].split("s")
        spec.update(kind=feats[0], value=float(value), seed=int(seed))
    return spec


SETS = ("dialsumm", "llm_rubric_synthetic", "llm_rubric_real")
FAMILIES = ("auto", "network")  # model.family: built as train.py builds it
CANDIDATES = ("ridge_judge",)  # a candidate of model=auto alone, fed the tables model=auto hands its members


@functools.lru_cache(maxsize=2)
def load_set(name: str, dialsumm: str, llm_root: str) -> tuple[Rubric, Tables]:
    """(rubric, tables) of a set, as the library reads them."""
    if name == "dialsumm":
        rubric = Rubric.load(Path(dialsumm) / "rubric.yaml")
        folder = Path(dialsumm)
        return rubric, load_tables(folder / "annotations.csv", folder / "features.csv", rubric, folder / "texts.csv")
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    return rubric, llm_rubric.load(llm_root, name.removeprefix("llm_rubric_"), rubric)


@functools.lru_cache(maxsize=2)
def cell_tables(cell: str, dialsumm: str, llm_root: str) -> tuple[Rubric, Tables]:
    """The set of ``cell`` with its features drawn as the cell says, validated as a features file would be."""
    spec = parse_cell(cell)
    rubric, tables = load_set(spec["set"], dialsumm, llm_root)
    if spec["features"] == "logprob":
        return rubric, tables
    feats = tables.features.reset_index(drop=True)
    if spec["kind"] == "w":  # drawn per outer fold (score_weighted)
        return rubric, tables
    if spec["kind"] == "k":
        drawn = drawn_features(feats, int(spec["value"]), spec["seed"])
    else:
        drawn = adaptive_features(feats, spec["value"], MAX_SAMPLES, spec["seed"], spec["kind"])
    drawn.index = pd.RangeIndex(1, len(drawn) + 1)
    drawn.attrs["source"] = f"<{cell}>"
    return rubric, Tables(tables.annotations, validate_features(drawn, rubric), tables.texts)


def score_weighted(tables: Tables, rubric: Rubric, train_ids, tolerance: float, seed: int) -> Tables:
    """Rule ``w``: the extractor's stop with each block's tolerance divided by its weight in the score, as
    ``llmrubric extract weights`` computes it (:func:`llmrubric.extract.tolerance_weights.score_weights`) and
    ``tolerance_weights`` reads it, from the training texts' pilot of
    :data:`llmrubric.extract.adaptive_stop.MIN_SAMPLES` answers a block (the answers every block gets anyway)
    and their labels."""
    feats = tables.features.reset_index(drop=True)
    pilot = drawn_features(feats, MIN_SAMPLES, seed)
    pilot = pilot[pilot.text_id.isin(set(train_ids))]
    nested = score_weights(Tables(tables.annotations, pilot, tables.texts), rubric)
    weights = pd.Series({(s, q): w for s, by_question in nested.items() for q, w in by_question.items()})
    drawn = adaptive_features(feats, tolerance, MAX_SAMPLES, seed, "t", weights)
    drawn.index = pd.RangeIndex(1, len(drawn) + 1)
    drawn.attrs["source"] = f"<weighted stop {tolerance:g}, seed {seed}>"
    return Tables(tables.annotations, validate_features(drawn, rubric), tables.texts)


def outer_folds(tables: Tables, protocol: str) -> pd.DataFrame:
    return text_folds(tables.text_ids, 5, 0) if protocol == "cv" else system_folds(tables)


def built(rubric: Rubric, method: str, protocol: str, prior: float | None):
    """The model ``train.py`` builds: ``conf/config.yaml`` with ``model=<method>``, the protocol, seed 0 and the prior."""
    from omegaconf import OmegaConf

    extra = [] if prior is None else [f"model.sample_prior={prior:g}"]
    cfg = compose("config", [f"model={method}", f"protocol={protocol}", "seed=0", *extra])
    model, trainer = (OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "trainer"))
    return build_model(rubric, model, trainer, cfg.seed, auto_group(cfg))


def run_fold(cell: str, fold: int, dialsumm: str, llm_root: str) -> tuple[pd.DataFrame, float, float | None]:
    """The main question's predictions of one outer fold's model on its held-out texts, its CPU seconds and, for
    rule ``w`` (drawn per fold), the fold's mean samples per block."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    single_threaded()
    spec = parse_cell(cell)
    rubric, tables = cell_tables(cell, dialsumm, llm_root)
    folds = outer_folds(tables, spec["protocol"])
    samples = None
    if spec.get("kind") == "w":
        tables = score_weighted(tables, rubric, folds.text_id[folds.fold != fold], spec["value"], spec["seed"])
        samples = mean_samples(tables.features)
    train, test = (tables.subset(folds.text_id[(folds.fold == fold) == held]) for held in (False, True))
    start = time.process_time()
    if spec["method"] in FAMILIES:
        model = built(rubric, spec["method"], spec["protocol"], spec["prior"]).fit(train)
        return model.predict(test, questions=[rubric.main.id]), time.process_time() - start, samples
    prior = ModelConfig().sample_prior if spec["prior"] is None else spec["prior"]
    train, test = smoothed_tables(train, prior), smoothed_tables(test, prior)  # as model=auto hands them to it
    model = candidate(spec["method"], rubric, model_file("auto"), group("trainer", "default"), 0)
    predictions = fit_questions(model, train, [rubric.main.id]).predict(test)
    return predictions[predictions.question_id == rubric.main.id], time.process_time() - start, samples


def mean_samples(features: pd.DataFrame) -> float | None:
    """The mean ``samples`` over the counted blocks of ``features``; None without any."""
    if "samples" not in features or not features["samples"].notna().any():
        return None
    return float(features.dropna(subset=["samples"]).drop_duplicates(BLOCK)["samples"].astype(float).mean())


def interval_width(predictions: pd.DataFrame, question, coverage: float = 0.9) -> float:
    """The mean width of each pair's central ``coverage`` interval of its predicted distribution."""
    p = predictions[[f"p_{k}" for k in question.keys]].to_numpy(float)
    cdf = np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1)
    values = np.asarray(question.values, float)
    tail = (1 - coverage) / 2
    low = values[np.minimum((cdf < tail - 1e-12).sum(axis=1), len(values) - 1)]
    high = values[np.minimum((cdf < 1 - tail - 1e-12).sum(axis=1), len(values) - 1)]
    return float(np.mean(high - low))


def cell_figures(predictions: pd.DataFrame, rubric: Rubric, tables: Tables) -> dict:
    """Pair NLL, Pearson, interval width and system RMS of the pooled out-of-fold predictions."""
    main = rubric.main
    m = evaluate_predicted(predictions, tables.annotations, main)
    out = {
        "pair_nll": m["nll"],
        "pair_pearson": m.get("pearson"),
        "interval_width90": interval_width(predictions, main),
    }
    systems = text_systems(tables) if "system_id" in (tables.texts if tables.texts is not None else {}) else None
    if systems is not None and len(systems):
        answered = predicted_annotations(predictions, tables.annotations, main)[0]
        means = system_means(pair_scores(predictions, answered, main, systems))
        out["system_rms"] = float(np.sqrt(np.mean((means.predicted - means.human) ** 2)))
    feats = tables.features
    if (samples := mean_samples(feats)) is not None:
        out["mean_samples_per_block"] = samples
    return out


def run_cell(cell: str, args) -> dict:
    """Every outer fold of ``cell`` (in ``--workers`` processes), its figures and seconds."""
    spec = parse_cell(cell)
    rubric, tables = cell_tables(cell, str(args.dialsumm), args.llm_rubric)
    folds = sorted(outer_folds(tables, spec["protocol"]).fold.unique())
    start = time.perf_counter()
    jobs = [(cell, int(f), str(args.dialsumm), args.llm_rubric) for f in folds]
    if args.workers > 1 and spec["method"] in FAMILIES:  # a candidate alone is cheaper than a second draw
        with ProcessPoolExecutor(args.workers) as pool:
            results = list(pool.map(run_fold, *zip(*jobs)))
    else:
        results = [run_fold(*job) for job in jobs]
    predictions = pd.concat([p for p, _, _ in results], ignore_index=True)
    per_fold = [n for _, _, n in results if n is not None]
    return {
        **spec,
        "cell": cell,
        **cell_figures(predictions, rubric, tables),
        **({"mean_samples_per_block": float(np.mean(per_fold))} if per_fold else {}),
        "folds": len(folds),
        **({} if spec["features"] == "logprob" else {"draws": DRAWS}),
        "cpu_seconds": float(sum(s for _, s, _ in results)),
        "wall_seconds": time.perf_counter() - start,
    }


def base_group(key: str) -> str:
    """A group's key without its prior (``dialsumm/cv/auto/a1`` → ``dialsumm/cv/auto``)."""
    return re.sub(r"/a[0-9.]+$", "", key)


def smallest_k(rows: list[dict]) -> dict:
    """Per (set, protocol, method, prior): the logprob pair NLL (of the set, protocol and method), each k's pair NLL
    lost (mean over seeds) and the smallest k of the grid from which every k measured is within :data:`WITHIN` of
    the logprob features."""
    out, groups = {}, _groups(rows)
    for key, group_ in groups.items():
        logprob = [r for r in group_ + groups.get(base_group(key), []) if r["features"] == "logprob"]
        ref = logprob[0]["pair_nll"] if logprob else None  # logprob blocks are read whatever the prior
        if ref is None:
            continue
        fixed = {}
        for r in group_:
            if r.get("kind") == "k":
                fixed.setdefault(int(r["value"]), []).append(r["pair_nll"] - ref)
        lost = {k: float(np.mean(v)) for k, v in sorted(fixed.items())}
        within = [k for k in lost if all(v <= WITHIN for j, v in lost.items() if j >= k)]
        out[key] = {
            "logprob_pair_nll": ref,
            "pair_nll_lost": {str(k): v for k, v in lost.items()},
            "seeds": {str(k): len(v) for k, v in sorted(fixed.items())},
            "smallest_k_within_0.01": min(within) if within else None,
            "k10_within_0.01": (lost[10] <= WITHIN) if 10 in lost else None,
        }
    return out


def adaptive_vs_fixed(rows: list[dict]) -> dict:
    """Per (set, protocol, method, prior), rule and tolerance, over the seeds whose fixed-k cells on the same draws
    (``draws`` paired, the shipped prior) cover three k or more: the stop's pair NLL and mean samples per block
    (means over those seeds), the fixed k of that pair NLL on the same seeds' mean fixed-k curve
    (:func:`equal_nll_k`) and the share of samples saved against it; beside them the same seed by seed (each on
    its own curve: None where it never comes down to the stop's NLL) and their spread."""
    groups, out = _groups(rows), {}
    for key, group_ in groups.items():
        curves = {}
        for r in groups.get(base_group(key), []):
            if r.get("kind") == "k" and r.get("draws") == DRAWS:
                curves.setdefault(r["seed"], {})[int(r["value"])] = r["pair_nll"]
        stops = {}
        for r in group_:
            if r.get("kind") in ADAPTIVE_RULES and r.get("draws") == DRAWS and len(curves.get(r["seed"], ())) >= 3:
                stops.setdefault(f"{r['kind']}{r['value']:g}", []).append(r)
        for name, runs in sorted(stops.items()):
            out.setdefault(key, {})[name] = stop_against_fixed(runs, curves)
    return out


def stop_against_fixed(runs: list[dict], curves: dict[int, dict[int, float]]) -> dict:
    """One stop's figures against fixed k (:func:`adaptive_vs_fixed`)."""
    nll = float(np.mean([r["pair_nll"] for r in runs]))
    samples = float(np.mean([r["mean_samples_per_block"] for r in runs]))
    ks = set.intersection(*(set(curves[r["seed"]]) for r in runs))
    pooled = equal_nll_k({k: float(np.mean([curves[r["seed"]][k] for r in runs])) for k in ks}, nll)
    by_seed = [equal_nll_k(curves[r["seed"]], r["pair_nll"]) for r in runs]
    saved = [None if k is None else 1 - r["mean_samples_per_block"] / k for r, k in zip(runs, by_seed)]
    known = [v for v in saved if v is not None]
    return {
        "pair_nll": nll,
        "mean_samples_per_block": samples,
        "seeds": len(runs),
        "fixed_k_at_equal_nll": pooled,
        "samples_saved": None if pooled is None else 1 - samples / pooled,
        "samples_saved_by_seed": saved,
        "samples_saved_sd": float(np.std(known, ddof=1)) if len(known) > 1 else None,
        "seeds_beyond_the_grid": sum(k is None for k in by_seed),  # as good as no k of that seed's grid
    }


def equal_nll_k(curve: dict[int, float], target: float) -> float | None:
    """The smallest k whose pair NLL is ``target`` on a seed's fixed-k curve (``{k: nll}``), interpolated in 1 / k
    between the grid's neighbours (sampling noise costs about in proportion to 1 / k); the first k where it is
    already below; None where no k of the grid comes down to ``target``."""
    ks = sorted(curve)
    for i, k in enumerate(ks):
        if curve[k] <= target:
            if i == 0:
                return float(k)
            k0 = ks[i - 1]
            share = (curve[k0] - target) / (curve[k0] - curve[k])
            return float(1.0 / (1.0 / k0 + share * (1.0 / k - 1.0 / k0)))
    return None


def _groups(rows: list[dict]) -> dict[str, list[dict]]:
    out = {}
    for r in rows:
        prior = "" if r.get("prior") is None else f"/a{r['prior']:g}"
        out.setdefault(f"{r['set']}/{r['protocol']}/{r['method']}{prior}", []).append(r)
    return out


def report(rows: list[dict], command: str, planned: list[str], bounds: dict) -> dict:
    done = {r["cell"] for r in rows}
    return {
        "meta": {
            "command": command,
            "planned": planned,
            "not_run": [c for c in planned if c not in done],
            "max_samples": MAX_SAMPLES,
            "interval": "central 90 % of each pair's predicted distribution",
            "shipped_sample_prior": _shipped_prior(),
        },
        "cells": {r["cell"]: r for r in rows},
        "smallest_k": smallest_k(rows),
        "adaptive": adaptive_vs_fixed(rows),
        "adaptive_bounds": bounds,
        "anchors": ANCHORS,
    }


def set_bounds(rows: list[dict], args) -> dict:
    """Per set of ``rows``: what any adaptive stop could save on it (:func:`sample_bounds.bounds`)."""
    names = sorted({r["set"] for r in rows})
    return {n: sample_bounds.bounds(*load_set(n, str(args.dialsumm), args.llm_rubric)[::-1]) for n in names}


def _shipped_prior() -> float:
    return ModelConfig().sample_prior


def read_partial(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return list({r["cell"]: r for r in rows}.values())


def print_row(r: dict) -> None:
    figures = {k: round(r[k], 4) for k in ("pair_nll", "pair_pearson", "interval_width90", "system_rms") if r.get(k)}
    samples = r.get("mean_samples_per_block")
    print(r["cell"], figures, f"samples/block {samples:.2f}" if samples else "", f"{r['wall_seconds']:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="+", default=None, help="default: the grid (--list)")
    parser.add_argument("--dialsumm", type=Path, default=DIALSUMM)
    parser.add_argument("--llm-rubric", default=llm_rubric_root())
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partial", type=Path, default=PARTIAL, help="each finished cell, one JSON line")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--assemble", type=Path, default=None, help="write --out from this partial file and stop")
    args = parser.parse_args(argv)
    planned = args.cells or grid()
    if args.list:
        print("\n".join(planned))
        return 0
    for cell in planned:
        parse_cell(cell)
    version = code_version()
    command = " ".join(["benchmarks/samples.py", *(argv if argv is not None else sys.argv[1:])])
    if args.assemble:
        rows = read_partial(args.assemble)
        write_result(report(rows, command, planned, set_bounds(rows, args)), args.out, version)
        return 0
    rows = [r for r in read_partial(args.partial) if r["cell"] in planned]
    for cell in planned:
        if any(r["cell"] == cell for r in rows):
            continue
        try:
            row = {**run_cell(cell, args), "commit": version["commit"]}
        except Exception as e:  # a cell that fails is recorded, the others still run
            print(f"{cell}: failed: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        rows.append(row)
        with args.partial.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print_row(row)
    write_result(report(rows, command, planned, set_bounds(rows, args)), args.out, version)
    return 0


def llm_rubric_root() -> str:
    from common import llm_rubric_default

    return llm_rubric_default()


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
