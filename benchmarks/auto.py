"""``model=auto`` as it ships against every candidate alone and the simple baselines (issues 25, 32).

    .venv/bin/python benchmarks/auto.py [--sets SET …] [--protocols systems system_groups cv]
                                        [--methods METHOD …] [--grouping-seeds N] [--folds-limit N]
                                        [--data DIR --rubric RUBRIC.yaml] [--workers 2] [--draws 1000] [--cost]

Sets and protocols (each outer fold's model sees nothing of its test texts or systems):

- ``llm_rubric_synthetic``: DS1..DS5 of the release (``--llm-rubric``), leave one system out
  (``systems``), 2 system groups (``system_groups``) and 5-fold CV by text (``cv``);
- ``simulated_shift``: the 12-system set (:func:`llmrubric.data.simulate.simulate_shift`, seed 0),
  ``systems``, 4 system groups and ``cv``;
- ``multisystem_default``, ``multisystem_stable_k3``, ``multisystem_missing``: data written at run
  time into a temporary folder by ``--generator`` (``../shared/generators/multisystem.py``, not the
  project's simulator) with the arguments of :data:`GENERATED` (its default: 11 systems; 6 systems
  with 5 stable judges on a 1..3 scale; 8 systems with a fifth of the blocks missing; 8 systems and a
  human reference far above them), ``systems``,
  system groups (3, 2, 2) and ``cv``; never written to the repository;
- ``llm_rubric_real``: trained on the synthetic dialogues, tested on the real ones (``holdout``,
  Table 1's protocol);
- ``llm_rubric_real_cv``: 5-fold CV by dialogue on the 223 real dialogues (GPT-3.5 features);
- ``--data DIR``: the canonical tables in DIR under ``--rubric``: ``systems`` and 3 system groups
  with 3+ systems, else 5-fold CV by text.

The first five are the design sets (:data:`DESIGN_SETS`): defaults are decided on them only; the
real sets are reported, never used to decide.

Methods: ``auto`` is the shipped path: :func:`shipped_model` composes the settings as ``train.py``
does (``conf/config.yaml`` with ``model=auto`` through :func:`llmrubric.config.compose`, inner folds
grouped as the protocol makes ``train.py`` group them) and fits :class:`AutoCalibrator` on each
outer fold's training data; its predictions and seconds are its own (``rule=bb_stack``, the level compared from 5
training systems). ``auto_select`` is the same with ``model.auto.rule=select`` and the level from 3 training
systems (the default before issue 49), ``auto_stack`` with ``model.auto.rule=stack``, ``auto_bb`` with
``model.auto.rule=bb_stack`` (these three and the next two with the level from 3 training systems, as when they
were first measured; ``auto_bb_nolevel`` without the system level, ``auto_bb_min5`` the default's settings named),
``auto_rule_auto`` with ``model.auto.rule=auto`` (select or stack, chosen by the inner folds), ``auto_bb_select``
with ``model.auto.rule=bb_select``, ``auto_folds3`` with ``model.auto.folds=3`` (the
cheaper inner CV), ``auto_fold_ensemble5`` with ``model.auto.fold_ensemble=null`` (every network of the ensemble in
the inner folds, the default before it). Then each candidate alone (``network`` is
``model=default``), ``mean_of_sources`` and ``raw_linear_system`` (a line through the training
systems' means of the raw LLM answers, each new system placed on it); named with ``--methods`` only,
``<candidate>-level``: the candidate alone with the system level fitted on its in-sample answers. Figures of the main question:
``pair_pearson``, ``pair_nll`` (on the pairs a method predicts; ``not_predicted`` counts the
others), ``system_rms``, ``system_kendall`` and the shift intervals' ``coverage``
(:func:`llmrubric.evaluation.transfer.system_metrics`; system protocols only), ``system_kendall_groups``
(``system_groups`` only: the Kendall within each held-out group, averaged over every group of
``--grouping-seeds`` groupings of the systems, each grouping with its own fitted models,
:func:`llmrubric.evaluation.transfer.grouped_kendall`; every other figure is the first grouping's),
``seconds`` (fit and predict time summed over the first grouping's outer folds, one thread) and
``fold_seconds`` (each of those folds').
Each set and protocol also gets the paired bootstrap (``--draws``, texts resampled within systems)
of ``auto`` minus the best single method by pair NLL (``vs_best``), and ``choices``: what ``auto``
chose in each outer fold (its weights and inner-CV table, and the stack's weights). ``rule``
compares the two rules' pair NLL on the design sets. ``--cost`` times ``auto`` (its shipped workers) against
``model=default`` fitted on the whole synthetic and simulated sets in this process, wall and process seconds (``cost``).
``--merge`` keeps the sets and protocols of ``--out`` that this run does not measure (``meta.runs``: each run).
Writes ``benchmarks/results/auto.json``: ``{"meta": {…, "auto_path": "shipped"}, SET: {PROTOCOL:
{METHOD: figures, "vs_best": …, "choices": …}}, "rule": …}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import code_version, write_result  # noqa: E402

from llmrubric import Levelled  # noqa: E402
from llmrubric.apps.evaluate import evaluate_predicted, predicted_annotations  # noqa: E402
from llmrubric.apps.train import auto_group  # noqa: E402
from llmrubric.config import compose, group, model_file  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.simulate import simulate_shift  # noqa: E402
from llmrubric.data.splits import system_folds, system_groupings, text_folds, text_systems  # noqa: E402
from llmrubric.evaluation.transfer import grouped_kendall, pair_scores, system_means, system_metrics  # noqa: E402
from llmrubric.io.errors import InputError, reports_errors  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import load_tables  # noqa: E402
from llmrubric.model.auto_settings import (  # noqa: E402
    build_model,
    candidate,
    default_candidates,  # noqa: E402
)
from llmrubric.model.core.encoding import PAIR, with_round  # noqa: E402
from llmrubric.model.core.parallel_folds import MIN_WORK, start_early  # noqa: E402
from llmrubric.model.core.registry import fit_questions, names  # noqa: E402
from llmrubric.model.core.system_level import t_interval  # noqa: E402
from llmrubric.model.core.threads import single_threaded  # noqa: E402
from llmrubric.model.families.baselines import make_method  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "auto.json"
GENERATOR = ROOT.parent / "shared" / "generators" / "multisystem.py"
GENERATED = {  # set → the generator's arguments
    "multisystem_default": [],
    "multisystem_stable_k3": ["--judges", "stable", "--scale", "3", "--systems", "6", "--texts", "60", "--seed", "1"],
    "multisystem_missing": ["--systems", "8", "--texts", "64", "--missing", "0.2", "--seed", "2"],
    **{  # issue 41: one human-written reference far above 8 systems, three seeds
        f"multisystem_references_s{seed}": ["--references", "1", "--systems", "8", "--seed", str(seed)]
        for seed in range(3)
    },
    "multisystem_few_references": ["--references", "2", "--systems", "4", "--judges", "stable", "--scale", "3"],
}
DESIGN_SETS = ("llm_rubric_synthetic", "simulated_shift", *GENERATED)
SETS = (*DESIGN_SETS, "llm_rubric_real", "llm_rubric_real_cv")
GROUPS = {
    "llm_rubric_synthetic": 2,
    "simulated_shift": 4,
    "multisystem_default": 3,
}  # system groups; others 2 (--data: 3)
PROTOCOLS = ("systems", "system_groups", "cv", "holdout")
BASELINES = ("mean_of_sources", "raw_linear_system")
AUTO_VARIANTS = {  # the shipped path with these overrides
    "auto": (),
    "auto_select": ("model.auto.rule=select", "model.auto.level_min_systems=3"),  # the default before 49
    "auto_stack": ("model.auto.rule=stack", "model.auto.level_min_systems=3"),
    "auto_bb": ("model.auto.rule=bb_stack", "model.auto.level_min_systems=3"),
    "auto_bb_nolevel": ("model.auto.rule=bb_stack", "model.auto.system_level=off"),
    "auto_rule_auto": ("model.auto.rule=auto", "model.auto.level_min_systems=3"),
    "auto_bb_select": ("model.auto.rule=bb_select", "model.auto.level_min_systems=3"),
    "auto_bb_min5": ("model.auto.rule=bb_stack", "model.auto.level_min_systems=5"),
    "auto_folds3": ("model.auto.folds=3",),
    "auto_fold_ensemble5": ("model.auto.fold_ensemble=null",),  # every network of the ensemble in the inner folds
}
SUFFIXES = (".csv", ".tsv", ".parquet", ".jsonl")


def find_table(directory: Path, stem: str) -> Path:
    found = [directory / f"{stem}{s}" for s in SUFFIXES if (directory / f"{stem}{s}").is_file()]
    if len(found) != 1:
        raise InputError(f"--data needs exactly one {stem} table, found {[p.name for p in found]}", file=str(directory))
    return found[0]


def generate(name: str, generator: str | Path, root: Path) -> Path:
    """Write set ``name`` (:data:`GENERATED`) with ``generator`` into ``root/name``; returns that folder."""
    if not Path(generator).is_file():
        raise InputError("the multi-system generator is not there (--generator)", file=str(generator))
    out = root / name
    done = subprocess.run(
        [sys.executable, str(generator), str(out), *GENERATED[name]], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise InputError(f"the generator failed: {done.stderr.strip().splitlines()[-1:]}", file=str(generator))
    return out


def folder_tables(directory: Path, rubric: Rubric):
    return load_tables(
        find_table(directory, "annotations"), find_table(directory, "features"), rubric, find_table(directory, "texts")
    )


@functools.lru_cache(maxsize=2)
def load_set(name: str, llm_root: str, data: str | None, rubric_path: str | None, generated: str | None) -> tuple:
    """(rubric, training tables, test tables or None) of a set (``generated``: the folder of the generated sets)."""
    if name in GENERATED:
        directory = Path(generated) / name
        rubric = Rubric.load(directory / "rubric.yaml")
        return rubric, folder_tables(directory, rubric), None
    rubric = Rubric.load(rubric_path or ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    if name == "simulated_shift":
        return rubric, simulate_shift(0, rubric=rubric)[0], None
    if name == "llm_rubric_synthetic":
        return rubric, llm_rubric.load(llm_root, "synthetic", rubric), None
    if name == "llm_rubric_real":
        return rubric, llm_rubric.load(llm_root, "synthetic", rubric), llm_rubric.load(llm_root, "real", rubric)
    if name == "llm_rubric_real_cv":
        return rubric, llm_rubric.load(llm_root, "real", rubric), None
    return rubric, folder_tables(Path(data), rubric), None


def protocols(name: str, tables, grouping_seeds: int = 1) -> dict[str, pd.DataFrame | None]:
    """Protocol → outer folds with their ``grouping`` (None: the set's own test split); ``system_groups``
    has ``grouping_seeds`` groupings (seeds 0, 1, …), every other protocol one."""
    if name == "llm_rubric_real":
        return {"holdout": None}
    cv = text_folds(tables.text_ids, 5, 0).assign(grouping=0)
    if name == "llm_rubric_real_cv":
        return {"cv": cv}
    try:
        systems = text_systems(tables).nunique()
    except InputError:
        systems = 0
    if systems < 3:
        return {"cv": cv}
    k = min(GROUPS.get(name, 2 if name in GENERATED else 3), systems)
    out = {
        "systems": system_folds(tables).assign(grouping=0),
        "system_groups": system_groupings(tables, k, 0, grouping_seeds),
    }
    return {**out, "cv": cv} if name in DESIGN_SETS else out


def shipped_model(rubric: Rubric, protocol: str, overrides: tuple[str, ...] = (), seed: int = 0):
    """``model=auto`` as ``train.py`` builds it under ``protocol``: the settings composed from ``conf/``
    (``conf/config.yaml``, ``model=auto``, ``overrides``) and the inner folds grouped as the protocol
    makes ``train.py`` group them (:func:`llmrubric.apps.train.auto_group`)."""
    from omegaconf import OmegaConf

    cfg = compose("config", ["model=auto", f"protocol={protocol}", f"seed={seed}", *overrides])
    model, trainer = (OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "trainer"))
    return build_model(rubric, model, trainer, cfg.seed, auto_group(cfg))


def methods(selected: tuple[str, ...] | None = None) -> list[str]:
    """Every method, or those of ``selected``: with no selection the ``<candidate>-level`` ones and the
    registered candidates outside the default list are left out (named with ``--methods``)."""
    candidates = default_candidates()
    every = [*AUTO_VARIANTS, *candidates, *BASELINES]
    if not selected:
        return every
    others = [c for c in names(candidate=True) if c not in candidates]
    return [m for m in [*every, *others, *levelled_methods()] if m in selected]


def levelled_methods() -> dict[str, str]:
    """``<candidate>-level`` → the candidate: each candidate with the system level (:class:`llmrubric.Levelled`)."""
    return {f"{c}-level": c for c in names(candidate=True)}


def run_fold(job: tuple, args_tuple: tuple, selected: tuple[str, ...] | None) -> dict:
    """Predictions of every method on one outer fold: {method: (predictions, seconds)}, plus auto's choices."""
    set_name, protocol, grouping, fold = job
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    single_threaded()
    rubric, tables, test = load_set(set_name, *args_tuple[:4])
    if fold is None:
        train = tables
    else:
        folds = protocols(set_name, tables, args_tuple[4])[protocol]
        folds = folds[folds.grouping == grouping]
        train, test = (tables.subset(folds.text_id[(folds.fold == fold) == held]) for held in (False, True))
    trainer = group("trainer", "default")
    main = [rubric.main.id]
    out, choice, fitted, levels = {}, {}, {}, {}
    for name in methods(selected):
        start = time.process_time()
        if name in AUTO_VARIANTS:
            model = shipped_model(rubric, protocol, AUTO_VARIANTS[name])
            model.fit(train)
            choice[name] = model.choice()
            predictions = model.predict(test, questions=main)
            table = model.system_levels(test, predictions[["text_id", "judge_id", "round"]])
            if table is not None:
                levels[name] = table[~table.known].set_index("system_id")[["level", "level_sd", "level_df"]]
        elif name in BASELINES:
            predictions = make_method(name, rubric, 0).fit(train).predict(test)
        elif name in levelled_methods():
            base = levelled_methods()[name]
            if base not in fitted:
                fitted[base] = fit_questions(candidate(base, rubric, model_file("auto"), trainer, 0), train, main)
                out.setdefault(base, (_main(fitted[base].predict(test), rubric), time.process_time() - start))
            predictions = with_system_level(fitted[base], base, out[base][0], rubric, train, test)
            if predictions is None:
                continue
            predictions, levels[name] = predictions
            start -= out[base][1]  # its seconds include the text model's
        else:
            model = candidate(name, rubric, model_file("auto"), trainer, 0)
            fitted[name] = fit_questions(model, train, main)  # the main question only where the family fits some
            predictions = fitted[name].predict(test)
        out[name] = (_main(predictions, rubric), time.process_time() - start)
    return {"job": job, "predictions": out, "choice": choice, "levels": levels}


def with_system_level(model, name: str, predictions: pd.DataFrame, rubric: Rubric, train, test):
    """``predictions`` (the main question's, of ``model``, fitted as ``name``) with the system level fitted on
    ``train`` from the model's in-sample expected answers (:class:`llmrubric.Levelled`, as ``model=auto`` fits
    ``<candidate>-level``); None where the training data cannot fit one (fewer than 3 systems)."""
    main = rubric.main
    values = np.asarray(main.values, float)
    try:
        levelled = Levelled(model, base_name=name).fit_level(train)
    except InputError:
        return None
    columns = [f"p_{k}" for k in main.keys]
    main_probs = predictions[columns].to_numpy(float)
    table = levelled.level_.levels(test, predictions, main_probs @ values)
    probs, _ = levelled.applied_main(test, predictions, main_probs, table)
    table = table[~table.known].rename(columns={"mean": "level"})
    table = table.assign(level_sd=np.sqrt(table["var"]), level_df=table["df"])[["level", "level_sd", "level_df"]]
    predicted = predictions.assign(
        **dict(zip(columns, probs.T)), mean=probs @ values, var=probs @ values**2 - (probs @ values) ** 2
    )
    return predicted, table


def _main(predictions: pd.DataFrame, rubric: Rubric) -> pd.DataFrame:
    return predictions[predictions.question_id == rubric.main.id]


def figures(
    predictions: pd.DataFrame, seconds: float, rubric: Rubric, test_tables, systems, groups, levels=None
) -> dict:
    """Pair and system figures of one method's out-of-fold predictions."""
    annotations = test_tables.annotations
    m = evaluate_predicted(predictions, annotations, rubric.main)
    out = {
        "pair_pearson": m.get("pearson"),
        "pair_nll": m["nll"],
        "not_predicted": m["not_predicted"],
        "seconds": seconds,
        "per_judge": per_judge(predictions, annotations, rubric.main),
    }
    if groups is not None and predictions.text_id.map(systems).nunique() >= 2:  # fewer: --folds-limit
        answered = predicted_annotations(predictions, annotations, rubric.main)[0]
        s = system_metrics(predictions, answered, rubric.main, systems, groups)
        out.update(system_rms=s["rms_error"], system_kendall=s["kendall"], coverage=s["coverage"])
        means = system_means(pair_scores(predictions, answered, rubric.main, systems))
        out["system_errors"] = {str(k): float(v) for k, v in (means.predicted - means.human).items()}
        if levels is not None and len(levels):
            low, high = t_interval(levels.level, levels.level_sd**2, levels.level_df, 0.8)
            human = means.human.reindex(levels.index)
            covered = (low <= human.to_numpy()) & (human.to_numpy() <= high)
            out["level_coverage80"] = float(np.mean(covered))
            out["level_systems"] = int(len(levels))
            out["level_intervals80"] = {
                str(k): [float(a), float(b), float(h)] for k, a, b, h in zip(levels.index, low, high, human)
            }
    else:
        out.update(system_rms=None, system_kendall=None, coverage=None)
    out["system_kendall_groups"] = None
    return out


def per_judge(predictions: pd.DataFrame, annotations: pd.DataFrame, question) -> dict:
    """Per rater: pair NLL, the mean predicted (expected) and observed answer and the pairs, so that a gain on
    one rater that costs another, or a rater's offset the model misses, shows."""
    pairs = pair_log_likelihood(predictions, annotations, question)
    pairs["judge"] = [str(key[1]) for key in pairs.key]
    return {
        judge: {
            "pair_nll": float(-part.log_p.mean()),
            "predicted_mean": float(part.expected.mean()),
            "observed_mean": float(part.observed.mean()),
            "pairs": int(len(part)),
        }
        for judge, part in pairs.groupby("judge")
    }


def kendall_groups(runs: list[dict], name: str, folds: pd.DataFrame, rubric: Rubric, tables) -> float | None:
    """:func:`grouped_kendall` of method ``name`` over the groupings of ``folds`` (``system_groups``)."""
    means, groups = [], []
    systems = text_systems(tables)
    for g in sorted(folds.grouping.unique()):
        mine = [r["predictions"][name][0] for r in runs if r["job"][2] == g]
        predictions = pd.concat(mine, ignore_index=True)
        annotations = predicted_annotations(predictions, tables.annotations, rubric.main)[0]
        held = annotations.text_id.unique()
        means.append(system_means(pair_scores(predictions, annotations, rubric.main, systems.reindex(held))))
        part = folds[folds.grouping == g].drop_duplicates("system_id")
        groups.append(part.set_index("system_id").fold.astype(str))
    value = grouped_kendall(means, groups)["kendall_groups"]
    return None if not np.isfinite(value) else float(value)


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
    rubric, tables, test = load_set(set_name, *_args_tuple(args)[:4])
    test_tables = test if test is not None else tables
    system_protocol = protocol in ("systems", "system_groups")
    systems = text_systems(test_tables) if system_protocol else None
    groups, folds = None, None
    if test is None:
        folds = protocols(set_name, tables, args.grouping_seeds)[protocol]
    if system_protocol:
        first = folds[folds.grouping == 0]
        groups = first.drop_duplicates("system_id").set_index("system_id").fold.astype(str)
    first_runs = [r for r in results if r["job"][2] == 0]
    out, per_pair = {}, {}
    names = methods(args.methods)
    skipped = [n for n in names if any(n not in r["predictions"] for r in results)]
    if skipped:
        out["skipped"] = {n: "no system level in some outer fold (fewer than 3 training systems)" for n in skipped}
    names = [n for n in names if n not in skipped]
    for name in names:
        parts = [r["predictions"][name] for r in first_runs]
        predictions = pd.concat([p for p, _ in parts], ignore_index=True)
        level_parts = [r.get("levels", {}).get(name) for r in first_runs]
        level_parts = [t for t in level_parts if t is not None and len(t)]
        level_table = pd.concat(level_parts) if level_parts else None
        fold_seconds = [float(s) for _, s in parts]
        out[name] = figures(predictions, sum(fold_seconds), rubric, test_tables, systems, groups, level_table)
        out[name]["fold_seconds"] = fold_seconds
        if protocol == "system_groups":
            out[name]["system_kendall_groups"] = kendall_groups(results, name, folds, rubric, tables)
        per_pair[name] = pair_log_likelihood(predictions, test_tables.annotations, rubric.main)
    singles = [n for n in names if n not in AUTO_VARIANTS]  # the candidates and baselines alone
    if "auto" in out and singles:
        best = min(singles, key=lambda n: out[n]["pair_nll"])
        try:
            strata = text_systems(test_tables)
        except InputError:
            strata = pd.Series(dtype=object)
        out["vs_best"] = {"best": best, **paired_bootstrap(per_pair["auto"], per_pair[best], strata, args.draws)}
    out["choices"] = {f"{r['job'][2]}/{r['job'][3]}": r["choice"] for r in results}
    return out


def targets(figures_: dict, protocol: str) -> dict:
    """Issue 32's targets on one set and protocol: each ``{met, auto, bound, against}`` (``met`` None
    where a figure is missing). System protocols: pair NLL below every candidate's, Pearson at least
    the best candidate's and ``mean_of_sources``', system RMS at most 0.9 × ``raw_linear_system``'s,
    within-group Kendall (``system_groups``) at least ``mean_of_sources``'; ``cv``: pair NLL at most
    the best candidate's + 0.005."""
    auto = figures_.get("auto")
    candidates = [n for n in default_candidates() if n in figures_]
    if auto is None or not candidates:
        return {}

    def check(key: str, bound_of: dict, rule, strict: bool = False) -> dict:
        values = {n: v for n, v in bound_of.items() if v is not None and np.isfinite(v)}
        if auto.get(key) is None or not values:
            return {"met": None}
        against, bound = rule(values)
        return {
            "met": bool(_holds(key, auto[key], bound, strict)),
            "auto": auto[key],
            "bound": bound,
            "against": against,
        }

    best = lambda values: min(values.items(), key=lambda kv: kv[1])
    if protocol == "cv":
        nll = {n: figures_[n]["pair_nll"] for n in candidates}
        return {"pair_nll_within_0.005": check("pair_nll", nll, lambda v: (best(v)[0], best(v)[1] + 0.005))}
    out = {
        "pair_nll_below_every_candidate": check(
            "pair_nll", {n: figures_[n]["pair_nll"] for n in candidates}, best, strict=True
        )
    }
    pearson = {n: figures_[n]["pair_pearson"] for n in [*candidates, "mean_of_sources"] if n in figures_}
    out["pair_pearson_at_least"] = check("pair_pearson", pearson, lambda v: max(v.items(), key=lambda kv: kv[1]))
    if "raw_linear_system" in figures_:
        rms = {"raw_linear_system": figures_["raw_linear_system"]["system_rms"]}
        out["system_rms_at_most_0.9_line"] = check(
            "system_rms", rms, lambda v: ("raw_linear_system", 0.9 * v["raw_linear_system"])
        )
    if protocol == "system_groups" and "mean_of_sources" in figures_:
        kendall = {"mean_of_sources": figures_["mean_of_sources"]["system_kendall_groups"]}
        out["kendall_groups_at_least_mean"] = check("system_kendall_groups", kendall, lambda v: next(iter(v.items())))
    return out


def _holds(key: str, value: float, bound: float, strict: bool) -> bool:
    """Pearson and Kendall at least the bound; NLL and RMS at most it (below it when ``strict``)."""
    if key in ("pair_pearson", "system_kendall_groups"):
        return value >= bound
    return value < bound if strict else value <= bound


def rule_decision(report: dict) -> dict:
    """Pair NLL of the shipped ``auto`` and of ``auto_select`` (the default before issue 49) on every design set
    and protocol measured, and on how many the shipped rule was lower or equal."""
    rows = {
        f"{s}/{p}": {"default": figures_["auto"]["pair_nll"], "select": figures_["auto_select"]["pair_nll"]}
        for s in DESIGN_SETS
        for p, figures_ in report.get(s, {}).items()
        if "auto" in figures_ and "auto_select" in figures_
    }
    wins = sum(r["default"] <= r["select"] for r in rows.values())
    return {"protocols": rows, "default_lower_or_equal": wins, "of": len(rows)}


def _args_tuple(args) -> tuple:
    return (str(args.llm_rubric), args.data, args.rubric, args.generated, args.grouping_seeds)


COST_RUNS = 3  # fits of the network alone, and of each variant of the default, in --cost: the median taken


def cost(args) -> dict:
    """Fit seconds of model=auto (the shipped path with its ``model.auto.workers``, 5 and 3 inner folds) and of
    model=default (the network alone, one process) on whole sets, inner folds by system, each the median of
    :data:`COST_RUNS` fits in this process (each fit's in ``<variant>_seconds_runs``: one fit's wall seconds moved
    by 15 % between runs; the figures below are the median fit's). ``<variant>_seconds``: wall
    seconds (what a user waits; on 2 idle cores for the shipped figures), ``<variant>_ratio`` against the network's
    wall seconds; ``<variant>_process_seconds``: CPU seconds of this process plus those of the workers' fits
    (``decision.worker_cpu_seconds``; the workers' start is not counted), ``<variant>_process_ratio`` against the
    network's; ``<variant>_workers``: the workers that ran (``decision.workers``); ``<variant>_phases``: the wall
    seconds of each phase of the fit and of each candidate's inner CV (its decision record),
    ``<variant>_network_inner_ratio``: the network candidate's inner folds and refit (summed over its groups)
    against model=default alone. The pool's forkserver is started first (a process's first pooled fit starts it at its
    top), so every fit finds it running and no variant pays its start alone; ``pool_start_seconds``: that start,
    until a worker ran."""
    single_threaded()
    import lightning_fabric  # noqa: F401  imported by the first network fit: not charged to either model

    start = time.perf_counter()
    started = start_early(2, MIN_WORK, 1, wait=True)  # as the first pooled fit does: every fit finds it running
    out = {"pool_start_seconds": time.perf_counter() - start if started else None}
    for set_name in ("llm_rubric_synthetic", "simulated_shift"):
        rubric, tables, _ = load_set(set_name, *_args_tuple(args)[:4])
        trainer = group("trainer", "default")
        runs = []
        for _ in range(COST_RUNS):
            wall, cpu = time.perf_counter(), time.process_time()
            candidate("network", rubric, model_file("default"), trainer, 0).fit(tables)
            runs.append((time.perf_counter() - wall, time.process_time() - cpu))
        network, network_cpu = (float(np.median(column)) for column in zip(*runs))
        out[set_name] = {
            "default_seconds": network,
            "default_process_seconds": network_cpu,
            "default_seconds_runs": [r[0] for r in runs],
        }
        for name in ("auto", "auto_folds3", "auto_fold_ensemble5"):
            fits = []
            for _ in range(COST_RUNS):
                wall, cpu = time.perf_counter(), time.process_time()
                choice = shipped_model(rubric, "systems", AUTO_VARIANTS[name]).fit(tables).choice()
                process = time.process_time() - cpu + choice["decision"]["worker_cpu_seconds"]
                fits.append((time.perf_counter() - wall, process, choice))
            seconds, process, choice = sorted(fits, key=lambda fit: fit[0])[len(fits) // 2]
            inner = {n: r["seconds"] for n, r in choice["inner_cv"].items() if "seconds" in r}
            out[set_name].update(
                {
                    f"{name}_seconds": seconds,
                    f"{name}_seconds_runs": [fit[0] for fit in fits],
                    f"{name}_ratio": seconds / network,
                    f"{name}_process_seconds": process,
                    f"{name}_process_ratio": process / network_cpu,
                    f"{name}_workers": choice["decision"]["workers"],
                    f"{name}_phases": {**choice["decision"]["seconds"], "candidates": inner},
                    f"{name}_network_inner_ratio": inner["network"] / network,
                }
            )
            print(
                f"cost {set_name}: default {network:.1f} s wall ({network_cpu:.1f} s process), {name} on "
                f"{choice['decision']['workers']} worker(s) {seconds:.1f} s wall ({seconds / network:.1f}x), "
                f"{process:.1f} s process ({process / network_cpu:.1f}x)",
                flush=True,
            )
    return out


def default_grouping_seeds() -> int:
    return int(compose("config").grouping_seeds)


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    parser.add_argument("--methods", nargs="+", default=None, help="a subset of the methods (default: all)")
    parser.add_argument("--grouping-seeds", type=int, default=None, help="default: conf/config.yaml grouping_seeds")
    parser.add_argument("--folds-limit", type=int, default=None, help="only the first N outer folds of each protocol")
    parser.add_argument("--data", default=None, help="a folder of canonical tables (annotations, features, texts)")
    parser.add_argument("--rubric", default=None, help="the rubric YAML of --data")
    parser.add_argument(
        "--llm-rubric", default=os.environ.get("LLM_RUBRIC_DATA", ROOT.parent / "shared/data/llm-rubric")
    )
    parser.add_argument("--generator", default=GENERATOR, help="the multi-system data generator")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--cost", action="store_true", help="also time auto against model=default on whole sets")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--merge", action="store_true", help="keep the other sets already in --out")
    args = parser.parse_args(argv)
    if args.data and not args.rubric:
        raise InputError("--data needs --rubric (the rubric YAML of those tables)")
    args.grouping_seeds = args.grouping_seeds or default_grouping_seeds()
    if args.grouping_seeds < 1:
        raise InputError("--grouping-seeds must be 1 or more")
    known = methods(tuple(args.methods or ())) if args.methods else methods()
    unknown = sorted(set(args.methods or ()) - set(known))
    if unknown:
        levels = list(levelled_methods())
        others = [c for c in names(candidate=True) if c not in methods()]
        raise InputError(f"unknown method(s) {unknown}; known: {methods() + others + levels}")
    args.methods = tuple(args.methods) if args.methods else None
    with tempfile.TemporaryDirectory(prefix="llmrubric-auto-") as generated:
        args.generated = generated
        sets = ["data"] if args.data else args.sets
        for set_name in set(sets) & set(GENERATED):
            generate(set_name, args.generator, Path(generated))
        return run(args, sets)


def outer_jobs(args, sets: list[str]) -> list[tuple]:
    """(set, protocol, grouping, fold) of every outer fold to fit (fold None: the set's own test split)."""
    jobs = []
    for set_name in sets:
        _, tables, _ = load_set(set_name, *_args_tuple(args)[:4])
        for protocol, folds in protocols(set_name, tables, args.grouping_seeds).items():
            if protocol not in args.protocols:
                continue
            if folds is None:
                jobs.append((set_name, protocol, 0, None))
                continue
            for g in sorted(folds.grouping.unique()):
                ks = sorted(folds.fold[folds.grouping == g].unique())[: args.folds_limit]
                jobs.extend((set_name, protocol, int(g), int(k)) for k in ks)
    return jobs


def run(args, sets: list[str]) -> int:
    jobs = outer_jobs(args, sets)
    started, version = time.time(), code_version()  # the code this run measures (HEAD may move while it runs)
    print(f"{len(jobs)} outer folds on {args.workers} workers", flush=True)
    n = len(jobs)
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(run_fold, jobs, [_args_tuple(args)] * n, [args.methods] * n))
    report = {
        "meta": {
            "seconds": time.time() - started,
            "draws": args.draws,
            **version,
            "auto_path": "shipped",
            "grouping_seeds": args.grouping_seeds,
            "folds_limit": args.folds_limit,
            "generated": {name: GENERATED[name] for name in sets if name in GENERATED},
        }
    }
    for set_name in sets:
        report[set_name] = {}
        for protocol in dict.fromkeys(j[1] for j in jobs if j[0] == set_name):
            mine = [r for r in results if r["job"][:2] == (set_name, protocol)]
            report[set_name][protocol] = summarise(set_name, protocol, mine, args)
            print_table(set_name, protocol, report[set_name][protocol])
    if args.merge:
        report = merged(report, Path(args.out), sets)
    report["rule"] = rule_decision(report)
    report["targets"] = {
        f"{name}/{protocol}": targets(figures_, protocol)
        for name in DESIGN_SETS
        for protocol, figures_ in report.get(name, {}).items()
    }
    print(
        f"rule: the default had the lower or equal pair NLL on {report['rule']['default_lower_or_equal']} of {report['rule']['of']}"
    )
    report["targets_issue41"] = {
        f"{name}/systems": level_targets(report[name]["systems"])
        for name in GENERATED
        if "references" in name and "systems" in report.get(name, {})
    }
    for where, checks in {**report["targets"], **report["targets_issue41"]}.items():
        print(f"targets {where}: " + ", ".join(f"{k} {c['met']}" for k, c in checks.items()), flush=True)
    if args.cost:
        report["cost"] = cost(args)
        report["meta"].setdefault("runs", {})["cost"] = {k: v for k, v in report["meta"].items() if k != "runs"}
    write_result(report, args.out, version)
    print(f"written to {args.out}")
    return 0


def level_targets(figures_: dict) -> dict:
    """Issue 41's targets under leave one system out on a set with references (systems ``ref*``):
    each reference's |error| at most ``raw_linear_system``'s + 0.05 and, when ``auto`` used a level
    in its fold, its 80 % interval covering the human mean; system RMS at most ``raw_linear_system``'s
    (1.1 × with 4 systems or fewer: few systems); pair NLL at most every candidate's − 0.005."""
    auto, raw = figures_.get("auto"), figures_.get("raw_linear_system")
    if auto is None or raw is None or "system_errors" not in auto:
        return {}
    out = {}
    for system, error in auto["system_errors"].items():
        if system.startswith("ref"):
            bound = abs(raw["system_errors"][system]) + 0.05
            out[f"{system}_error"] = {"met": abs(error) <= bound, "auto": abs(error), "bound": bound}
            interval = auto.get("level_intervals80", {}).get(system)
            out[f"{system}_covered80"] = {
                "met": None if interval is None else interval[0] <= interval[2] <= interval[1]
            }
    factor = 1.1 if len(auto["system_errors"]) <= 6 else 1.0
    bound = factor * raw["system_rms"]
    out["system_rms"] = {"met": auto["system_rms"] <= bound, "auto": auto["system_rms"], "bound": bound}
    candidates = {n: figures_[n]["pair_nll"] for n in default_candidates() if n in figures_}
    if candidates:
        against = min(candidates, key=candidates.get)
        bound = candidates[against] - 0.005
        out["pair_nll"] = {
            "met": auto["pair_nll"] <= bound,
            "auto": auto["pair_nll"],
            "bound": bound,
            "against": against,
        }
    return out


def merged(report: dict, path: Path, sets: list[str]) -> dict:
    """``report``'s protocols written over those of the shipped-path results already at ``path``
    (``--merge``): other sets and a set's other protocols are kept, and ``meta.runs`` records each
    run (``SET`` for a whole set, ``SET/PROTOCOL`` for a protocol measured apart)."""
    measured = {s: dict(report.get(s, {})) for s in sets}
    if not path.is_file():
        return {**report, "meta": {**report["meta"], "runs": {s: report["meta"] for s in sets}}}
    old = json.loads(path.read_text())
    if old.get("meta", {}).get("auto_path") != "shipped":
        raise InputError("--merge: the results there were not measured on the shipped path", file=str(path))
    runs = dict(old["meta"].get("runs") or {s: old["meta"] for s in old if s in SETS or s == "data"})
    out = {k: v for k, v in old.items() if k not in ("meta", "rule", "targets")}
    for s, protocols_ in measured.items():
        kept = {p: v for p, v in old.get(s, {}).items() if p not in protocols_}
        out[s] = {**kept, **protocols_}
        if kept:
            runs.update({f"{s}/{p}": report["meta"] for p in protocols_})
        else:
            runs = {k: v for k, v in runs.items() if not k.startswith(f"{s}/")}
            runs[s] = report["meta"]
    runs = {k: v for k, v in runs.items() if "/" not in k or k.split("/")[1] in out.get(k.split("/")[0], {})}
    return {**out, **{k: v for k, v in report.items() if k not in measured}, "meta": {**report["meta"], "runs": runs}}


def print_table(set_name: str, protocol: str, figures_: dict) -> None:
    keys = ("pair_pearson", "pair_nll", "system_rms", "system_kendall", "system_kendall_groups", "coverage", "seconds")
    print(f"\n{set_name} / {protocol}\n| method | " + " | ".join(keys) + " |")
    for name, row in figures_.items():
        if name in ("vs_best", "choices", "skipped"):
            continue
        cells = ["—" if row.get(k) is None or row.get(k) != row.get(k) else f"{row[k]:.3f}" for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for fold, choice in figures_["choices"].items():
        print(f"fold {fold}: " + "; ".join(f"{n} {_rounded(c['weights'])}" for n, c in choice.items()))
    vs = figures_.get("vs_best")
    if vs:
        print(
            f"auto − {vs['best']}: NLL {vs['nll_difference']:+.4f} {vs['nll_interval']}, "
            f"Pearson {vs['pearson_difference']:+.4f} {vs['pearson_interval']}",
            flush=True,
        )


def _rounded(weights: dict) -> dict:
    return {name: round(w, 3) for name, w in weights.items()}


if __name__ == "__main__":
    sys.exit(main())
