"""``model=auto`` against every candidate alone and the simple baselines (issue 25).

    .venv/bin/python benchmarks/auto.py [--sets llm_rubric_synthetic simulated_shift llm_rubric_real llm_rubric_real_cv]
                                        [--data DIR --rubric RUBRIC.yaml] [--workers 2] [--draws 1000] [--cost]

Sets and protocols (each outer fold's model sees nothing of its test texts or systems):

- ``llm_rubric_synthetic``: DS1..DS5 of the release (``--llm-rubric``), leave one system out
  (``systems``) and 2 system groups (``system_groups``);
- ``simulated_shift``: the 12-system set (:func:`llmrubric.data.simulate.simulate_shift`, seed 0),
  ``systems`` and 4 system groups;
- ``llm_rubric_real``: trained on the synthetic dialogues, tested on the real ones (``holdout``,
  Table 1's protocol);
- ``llm_rubric_real_cv``: 5-fold CV by dialogue on the 223 real dialogues (GPT-3.5 features);
- ``--data DIR``: the canonical tables in DIR under ``--rubric``: ``systems`` and 3 system groups
  with 3+ systems, else 5-fold CV by text.

Methods: ``auto`` (the shipped ``conf/model/auto.yaml``, ``rule=select``: the candidate with the lowest
inner-CV NLL, fitted on the outer training data; inner folds by system under the system protocols,
by text otherwise), ``auto_stack`` (``rule=stack`` on the same inner CV: the weighted mixture of the
candidates, the other rule), each candidate alone (``network`` is ``model=default``), ``mean_of_sources`` and
``raw_linear_system``. Figures of the main question: ``pair_pearson``, ``pair_nll`` (on the pairs a
method predicts; ``not_predicted`` counts the others), ``system_rms``, ``system_kendall`` and the
shift intervals' ``coverage`` (:func:`llmrubric.evaluation.transfer.system_metrics`; system
protocols only) and ``seconds`` (fit time summed over outer folds, one thread). Each set and
protocol also gets the paired bootstrap (``--draws``, texts resampled within systems) of ``auto``
minus the best single method by pair NLL (``vs_best``), and ``choices``: the weights ``auto``
gave each candidate in each outer fold. ``--cost`` times ``auto`` against ``model=default`` fitted
on the whole synthetic and simulated sets in this process (``cost``). Writes
``benchmarks/results/auto.json``: ``{SET: {PROTOCOL: {METHOD: figures, "vs_best": …, "choices": …}}}``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmrubric.apps.evaluate import evaluate_predicted, predicted_annotations  # noqa: E402
from llmrubric.config import group, model_file  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.simulate import simulate_shift  # noqa: E402
from llmrubric.data.splits import system_folds, system_group_folds, text_folds, text_systems  # noqa: E402
from llmrubric.evaluation.transfer import system_metrics  # noqa: E402
from llmrubric.io.errors import InputError, reports_errors  # noqa: E402
from llmrubric.io.files import write_json  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import load_tables  # noqa: E402
from llmrubric.model.auto import AutoCalibrator, candidate  # noqa: E402
from llmrubric.model.baselines import make_method  # noqa: E402
from llmrubric.model.encoding import PAIR, with_round  # noqa: E402
from llmrubric.model.registry import fit_questions  # noqa: E402
from llmrubric.model.threads import single_threaded  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "auto.json"
SETS = ("llm_rubric_synthetic", "simulated_shift", "llm_rubric_real", "llm_rubric_real_cv")
BASELINES = ("mean_of_sources", "raw_linear_system")
SUFFIXES = (".csv", ".tsv", ".parquet", ".jsonl")


def find_table(directory: Path, stem: str) -> Path:
    found = [directory / f"{stem}{s}" for s in SUFFIXES if (directory / f"{stem}{s}").is_file()]
    if len(found) != 1:
        raise InputError(f"--data needs exactly one {stem} table, found {[p.name for p in found]}", file=str(directory))
    return found[0]


@functools.lru_cache(maxsize=2)
def load_set(name: str, llm_root: str, data: str | None, rubric_path: str | None) -> tuple:
    """(rubric, training tables, test tables or None) of a set."""
    rubric = Rubric.load(rubric_path or ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    if name == "simulated_shift":
        return rubric, simulate_shift(0, rubric=rubric)[0], None
    if name == "llm_rubric_synthetic":
        return rubric, llm_rubric.load(llm_root, "synthetic", rubric), None
    if name == "llm_rubric_real":
        return rubric, llm_rubric.load(llm_root, "synthetic", rubric), llm_rubric.load(llm_root, "real", rubric)
    if name == "llm_rubric_real_cv":
        return rubric, llm_rubric.load(llm_root, "real", rubric), None
    directory = Path(data)
    tables = load_tables(*(find_table(directory, s) for s in ("annotations", "features", "texts")), rubric)
    return rubric, tables, None


def protocols(name: str, tables) -> dict[str, pd.DataFrame | None]:
    """Protocol → outer folds (None: the set's own test split)."""
    if name == "llm_rubric_real":
        return {"holdout": None}
    if name == "llm_rubric_real_cv":
        return {"cv": text_folds(tables.text_ids, 5, 0)}
    groups = {"llm_rubric_synthetic": 2, "simulated_shift": 4}.get(name, 3)
    try:
        systems = text_systems(tables).nunique()
    except InputError:
        systems = 0
    if systems < 3:
        return {"cv": text_folds(tables.text_ids, 5, 0)}
    return {"systems": system_folds(tables), "system_groups": system_group_folds(tables, min(groups, systems), 0)}


def methods() -> list[str]:
    return ["auto", "auto_stack", *model_file("auto")["auto"]["candidates"], *BASELINES]


def run_fold(job: tuple, args_tuple: tuple) -> dict:
    """Predictions of every method on one outer fold: {method: (predictions, seconds)}, plus auto's choice."""
    set_name, protocol, fold = job
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    single_threaded()
    rubric, tables, test = load_set(set_name, *args_tuple)
    if fold is None:
        train = tables
    else:
        folds = protocols(set_name, tables)[protocol]
        train, test = (tables.subset(folds.text_id[(folds.fold == fold) == held]) for held in (False, True))
    trainer = group("trainer", "default")
    main = [rubric.main.id]
    out, choice = {}, {}
    start = time.process_time()
    settings = model_file("auto")
    shipped = settings["auto"]["rule"]
    stack = {**settings, "auto": {**settings["auto"], "rule": "stack"}}
    auto = AutoCalibrator(rubric, stack, trainer, 0, "system" if "system" in protocol else "text")
    auto.fit(train)
    out["auto_stack"] = (auto.predict(test, questions=main), time.process_time() - start)
    choice = {"stack_weights": auto.weights_, "inner_folds_by": auto.group, "inner_cv": auto.table_}
    for name in methods()[2:]:
        start = time.process_time()
        if name in BASELINES:
            model = make_method(name, rubric, 0).fit(train)
        else:
            model = candidate(name, rubric, model_file("auto"), trainer, 0)
            model = fit_questions(model, train, main)  # the main question only where the family fits some
        out[name] = (_main(model.predict(test), rubric), time.process_time() - start)
    best = min((n for n, r in auto.table_.items() if "nll" in r), key=lambda n: auto.table_[n]["nll"])
    if shipped != "select":
        raise InputError(f"the benchmark derives rule=select from the stack's inner CV; the shipped rule is {shipped}")
    out["auto"] = (out[best][0], out["auto_stack"][1])  # rule=select: the lowest inner NLL, refitted alone
    choice["select"] = best
    return {"job": job, "predictions": out, "choice": choice}


def _main(predictions: pd.DataFrame, rubric: Rubric) -> pd.DataFrame:
    return predictions[predictions.question_id == rubric.main.id]


def figures(predictions: pd.DataFrame, seconds: float, rubric: Rubric, test_tables, systems, groups) -> dict:
    """Pair and system figures of one method's out-of-fold predictions."""
    annotations = test_tables.annotations
    m = evaluate_predicted(predictions, annotations, rubric.main)
    out = {
        "pair_pearson": m.get("pearson"),
        "pair_nll": m["nll"],
        "not_predicted": m["not_predicted"],
        "seconds": seconds,
    }
    if groups is not None:
        s = system_metrics(
            predictions, predicted_annotations(predictions, annotations, rubric.main)[0], rubric.main, systems, groups
        )
        out.update(system_rms=s["rms_error"], system_kendall=s["kendall"], coverage=s["coverage"])
    else:
        out.update(system_rms=None, system_kendall=None, coverage=None)
    return out


def pair_log_likelihood(predictions: pd.DataFrame, annotations: pd.DataFrame, question) -> pd.DataFrame:
    """Per annotated pair: text, log p(observed answer) and the expected and observed values."""
    ann = with_round(annotations[annotations.question_id == question.id])
    pred = with_round(predictions).drop(columns=["system_id"], errors="ignore").merge(ann[[*PAIR, "answer"]], on=PAIR)
    index = pd.Index(question.keys).get_indexer(pred.answer)
    p = pred[[f"p_{k}" for k in question.keys]].to_numpy(float)[np.arange(len(pred)), index]
    values = np.asarray(question.values, float)
    return pd.DataFrame(
        {
            "key": list(zip(*(pred[c] for c in PAIR))),
            "text_id": pred.text_id,
            "log_p": np.log(np.clip(p, 1e-12, 1)),
            "expected": pred["mean"].to_numpy(float),
            "observed": values[index],
        }
    )


def paired_bootstrap(a: pd.DataFrame, b: pd.DataFrame, strata: pd.Series, draws: int, seed: int = 0) -> dict:
    """NLL and Pearson of ``a`` minus ``b`` on their common pairs, with a 95 % interval from resampling
    texts within their stratum (system)."""
    both = a.merge(b, on="key", suffixes=("_a", "_b"))
    texts = both.text_id_a.to_numpy()
    unique, inverse = np.unique(texts, return_inverse=True)
    stratum = strata.reindex(unique).fillna("all").to_numpy()
    rng = np.random.default_rng(seed)
    by_text = [np.flatnonzero(inverse == t) for t in range(len(unique))]

    def stats(rows):
        nll = -(both.log_p_a.to_numpy()[rows].mean() - both.log_p_b.to_numpy()[rows].mean())
        pa = np.corrcoef(both.expected_a.to_numpy()[rows], both.observed_a.to_numpy()[rows])[0, 1]
        pb = np.corrcoef(both.expected_b.to_numpy()[rows], both.observed_b.to_numpy()[rows])[0, 1]
        return nll, pa - pb

    point = stats(np.arange(len(both)))
    samples = []
    for _ in range(draws):
        picked = np.concatenate(
            [rng.choice(np.flatnonzero(stratum == s), size=int((stratum == s).sum())) for s in np.unique(stratum)]
        )
        samples.append(stats(np.concatenate([by_text[t] for t in picked])))
    samples = np.array(samples)
    interval = lambda col: [
        float(np.nanpercentile(samples[:, col], 2.5)),
        float(np.nanpercentile(samples[:, col], 97.5)),
    ]
    return {
        "nll_difference": float(point[0]),
        "nll_interval": interval(0),
        "pearson_difference": float(point[1]),
        "pearson_interval": interval(1),
        "pairs": int(len(both)),
    }


def summarise(set_name: str, protocol: str, results: list[dict], args) -> dict:
    rubric, tables, test = load_set(set_name, *_args_tuple(args))
    test_tables = test if test is not None else tables
    system_protocol = protocol in ("systems", "system_groups")
    systems = text_systems(test_tables) if system_protocol else None
    groups = None
    if system_protocol:
        folds = protocols(set_name, tables)[protocol]
        groups = folds.drop_duplicates("system_id").set_index("system_id").fold.astype(str)
    out, per_pair = {}, {}
    for name in methods():
        parts = [r["predictions"][name] for r in results]
        predictions = pd.concat([p for p, _ in parts], ignore_index=True)
        out[name] = figures(predictions, float(sum(s for _, s in parts)), rubric, test_tables, systems, groups)
        per_pair[name] = pair_log_likelihood(predictions, test_tables.annotations, rubric.main)
    singles = [n for n in methods() if not n.startswith("auto")]  # the candidates and baselines alone
    best = min(singles, key=lambda n: out[n]["pair_nll"])
    try:
        strata = text_systems(test_tables)
    except InputError:
        strata = pd.Series(dtype=object)
    out["vs_best"] = {"best": best, **paired_bootstrap(per_pair["auto"], per_pair[best], strata, args.draws)}
    out["choices"] = {str(r["job"][2]): r["choice"] for r in results}
    return out


def _args_tuple(args) -> tuple:
    return (str(args.llm_rubric), args.data, args.rubric)


def cost(args) -> dict:
    """Fit seconds (process time, one thread) of model=auto and model=default on whole sets."""
    single_threaded()
    out = {}
    for set_name in ("llm_rubric_synthetic", "simulated_shift"):
        rubric, tables, _ = load_set(set_name, *_args_tuple(args))
        trainer = group("trainer", "default")
        start = time.process_time()
        candidate("network", rubric, model_file("default"), trainer, 0).fit(tables)
        network = time.process_time() - start
        start = time.process_time()
        group_by = "system"
        AutoCalibrator(rubric, model_file("auto"), trainer, 0, group_by).fit(tables)
        auto = time.process_time() - start
        out[set_name] = {"default_seconds": network, "auto_seconds": auto, "ratio": auto / network}
        print(f"cost {set_name}: default {network:.1f} s, auto {auto:.1f} s ({auto / network:.1f}x)", flush=True)
    return out


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    parser.add_argument("--data", default=None, help="a folder of canonical tables (annotations, features, texts)")
    parser.add_argument("--rubric", default=None, help="the rubric YAML of --data")
    parser.add_argument(
        "--llm-rubric", default=os.environ.get("LLM_RUBRIC_DATA", ROOT.parent / "shared/data/llm-rubric")
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--cost", action="store_true", help="also time auto against model=default on whole sets")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    if args.data and not args.rubric:
        raise InputError("--data needs --rubric (the rubric YAML of those tables)")
    sets = ["data"] if args.data else args.sets
    jobs = []
    for set_name in sets:
        _, tables, _ = load_set(set_name, *_args_tuple(args))
        for protocol, folds in protocols(set_name, tables).items():
            for fold in [None] if folds is None else sorted(folds.fold.unique()):
                jobs.append((set_name, protocol, None if fold is None else int(fold)))
    started = time.time()
    print(f"{len(jobs)} outer folds on {args.workers} workers", flush=True)
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(run_fold, jobs, [_args_tuple(args)] * len(jobs)))
    report = {"meta": {"seconds": time.time() - started, "draws": args.draws, "commit": _commit()}}
    for set_name in sets:
        report[set_name] = {}
        for protocol in dict.fromkeys(j[1] for j in jobs if j[0] == set_name):
            mine = [r for r in results if r["job"][:2] == (set_name, protocol)]
            report[set_name][protocol] = summarise(set_name, protocol, mine, args)
            print_table(set_name, protocol, report[set_name][protocol])
    if args.cost:
        report["cost"] = cost(args)
    write_json(report, args.out)
    print(f"written to {args.out}")
    return 0


def print_table(set_name: str, protocol: str, figures_: dict) -> None:
    keys = ("pair_pearson", "pair_nll", "system_rms", "system_kendall", "coverage", "seconds")
    print(f"\n{set_name} / {protocol}\n| method | " + " | ".join(keys) + " |")
    for name, row in figures_.items():
        if name in ("vs_best", "choices"):
            continue
        cells = ["—" if row.get(k) is None or row.get(k) != row.get(k) else f"{row[k]:.3f}" for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")
    vs = figures_["vs_best"]
    print(
        f"auto − {vs['best']}: NLL {vs['nll_difference']:+.4f} {vs['nll_interval']}, "
        f"Pearson {vs['pearson_difference']:+.4f} {vs['pearson_interval']}",
        flush=True,
    )


def _commit() -> str:
    import subprocess

    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
