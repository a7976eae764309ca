"""The calibrated autograder on the real relevance split (issue 42, item 5): the LLMJudge test split's
RUBRIC workbench grades (``../shared/data/llmjudge-test``, 25 queries, 4,423 passages, labels 0..3).

    .venv/bin/python benchmarks/ir_real.py [--protocols query_groups5 leave_one_query_out] [--methods METHOD …]
                                           [--folds-limit N] [--seed 0] [--data DIR] [--merge] [--override K=V …]

Protocols (every method sees the same outer folds; a query's passages are never on both sides):
``query_groups5``, the queries dealt into 5 groups (:func:`llmrubric.data.splits.system_group_folds`
with system id = query id, ``--seed``), and ``leave_one_query_out``
(:func:`llmrubric.data.splits.system_folds`). ``--folds-limit N`` runs the first N folds only.

Methods: ``llm_rubric`` is the user path: ``llmrubric import workbench … --summaries`` once, then per
outer fold ``train.py`` and ``evaluate.py`` (subprocesses, ``rubric=relevance``, the shipped
``model=auto``) on the fold's tables written as files, with ``protocol=holdout``, ``data.test`` = the
held-out queries and ``model.auto.group=system`` (what ``protocol=system_groups`` sets): the same
training texts, seed and inner folds as ``train.py protocol=system_groups system_groups=5
grouping_seeds=1``, whose folds are these, one fold at a time. Its labels are predictions.csv's
``label`` column where evaluate.py writes one, else the argmax (``label_source``). The cheap rows
(:data:`CHEAP`), fitted on the imported tables in this process: ``label_frequencies`` (the training
labels' frequencies), ``multinomial_lr`` (every summary block's probabilities, L2, C = 0.1),
``mean_rating_lr`` (one feature: the mean question self-rating, C = 1), ``extratrees`` (the grade
features: each self-rated prompt class's ratings sorted, the answered count of every prompt class),
and ``heuristic_rule`` (the workbench's label rule on the 2nd-best question self-rating: ≥ 5 → 3,
≥ 4 → 1, else 0; labels only). Labels of the others: the argmax of their distribution.

Figures over the pooled held-out pairs of the folds run (``per_fold``: each fold's): ``pair_nll``,
``spearman`` (expected grade vs label), ``kappa`` and ``qwk`` (Cohen's κ, plain and quadratic, of the
labels), ``alpha`` (Krippendorff's ordinal α of labels vs assessor; null without the
``krippendorff`` package), ``seconds`` (fit and predict over the folds; ``llm_rubric``: the
train.py and evaluate.py runs). Writes ``benchmarks/results/ir_real.json``: ``{"meta": …, PROTOCOL:
{METHOD: figures}}``; ``--merge`` keeps the methods of ``--out`` this run does not measure (``meta.runs``: the command of each).
``llm_rubric`` with ``--override`` settings is stored as ``llm_rubric[K=V …]``, beside the default.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr
from sklearn.ensemble import ExtraTreesClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import cohen_kappa_score

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import code_version, exit_code, write_result  # noqa: E402
from llmrubric.data.splits import system_folds, system_group_folds  # noqa: E402
from llmrubric.io.errors import InputError  # noqa: E402
from llmrubric.io.files import write_table  # noqa: E402
from llmrubric.io.tables import Tables, read_table  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "ir_real.json"
DATA = ROOT.parent / "shared" / "data" / "llmjudge-test"
PROTOCOLS = ("query_groups5", "leave_one_query_out")
QUERY_GROUPS = 5
LABELS = np.arange(4)  # relevance 0..3
QUESTION = "QuestionSelfRatedUnanswerablePromptWithChoices"  # the exam questions' self-rating prompt class
ET_TREES, ET_MIN_LEAF, ET_FLOOR = 300, 5, 1e-3  # ExtraTrees: trees, leaf size, probability floor (finite NLL)


@dataclass
class Split:
    """The relevance split as arrays, one row per text: ``y`` the assessor's label, ``summary`` every
    summary block's probabilities, ``mean_rating`` the mean question self-rating, ``grades`` the
    ExtraTrees grade features, ``second_best`` the 2nd-best question self-rating; ``tables`` for the folds."""

    text_ids: np.ndarray
    y: np.ndarray
    summary: np.ndarray
    mean_rating: np.ndarray
    grades: np.ndarray
    second_best: np.ndarray
    tables: Tables


def _ratings(features: pd.DataFrame) -> pd.DataFrame:
    """Each (text, source, self-rated item)'s expected rating (a point mass: the rating)."""
    f = features[features.question_id.str.startswith("self_rating:")]
    return (
        f.assign(v=f.option.astype(float) * f.prob)
        .groupby(["text_id", "source", "question_id"], sort=False)
        .v.sum()
        .reset_index()
    )


def _sorted_ratings(ratings: pd.DataFrame, source: str, text_ids, width: int) -> np.ndarray:
    """(texts, width): ``source``'s ratings of each text in descending order, padded with -1."""
    out = np.full((len(text_ids), width), -1.0)
    row = {t: i for i, t in enumerate(text_ids)}
    for text, values in ratings[ratings.source == source].groupby("text_id").v:
        v = np.sort(values.to_numpy())[::-1][:width]
        out[row[text], : len(v)] = v
    return out


def assemble(features: pd.DataFrame, summaries: pd.DataFrame, texts: pd.DataFrame, annotations: pd.DataFrame) -> Split:
    """The arrays of :class:`Split` from the tables ``llmrubric import workbench --summaries`` writes."""
    text_ids = np.array(sorted(annotations.text_id.unique()))
    y = annotations.drop_duplicates("text_id").set_index("text_id").answer.astype(int).reindex(text_ids).to_numpy()
    wide = summaries.pivot_table(
        index="text_id", columns=["source", "question_id", "option"], values="prob", aggfunc="first"
    )
    wide = wide.reindex(text_ids).fillna(0.0)
    mean = summaries[(summaries.source == QUESTION) & (summaries.question_id == "self_rating.mean")]
    mean_rating = (
        mean.assign(v=mean.option.astype(float) * mean.prob).groupby("text_id").v.sum().reindex(text_ids).to_numpy()
    )
    ratings = _ratings(features)
    width = int(ratings.groupby(["text_id", "source"]).size().max())
    rated = sorted(ratings.source.unique())
    answered = features[features.question_id.str.startswith("answered:") & (features.option == "yes")]
    counts = answered.pivot_table(index="text_id", columns="source", values="prob", aggfunc="sum")
    counts = counts.reindex(index=text_ids, columns=sorted(features.source.unique())).fillna(0.0)
    by_source = {s: _sorted_ratings(ratings, s, text_ids, width) for s in rated}
    grades = np.hstack([*by_source.values(), counts.to_numpy()])
    tables = Tables(annotations, summaries, texts)
    return Split(text_ids, y, wide.to_numpy(), mean_rating, grades, by_source[QUESTION][:, 1], tables)


def outer_folds(split: Split, protocol: str, seed: int) -> np.ndarray:
    """Each text's outer fold under ``protocol`` (system id = query id), in ``split.text_ids`` order."""
    if protocol == "query_groups5":
        folds = system_group_folds(split.tables, QUERY_GROUPS, seed)
    elif protocol == "leave_one_query_out":
        folds = system_folds(split.tables)
    else:
        raise InputError(f"unknown protocol {protocol!r} (use {', '.join(PROTOCOLS)})", setting="protocols")
    return folds.set_index("text_id").fold.reindex(split.text_ids).to_numpy()


def label_frequencies(split: Split, train, test, seed: int):
    p = np.bincount(split.y[train], minlength=len(LABELS)) / len(train)
    return np.tile(p, (len(test), 1)), None


def _logistic(x: np.ndarray, y: np.ndarray, train, test, c: float) -> np.ndarray:
    model = LogisticRegression(C=c, max_iter=5000).fit(x[train], y[train])
    p = np.zeros((len(test), len(LABELS)))
    p[:, model.classes_] = model.predict_proba(x[test])
    return p


def multinomial_lr(split: Split, train, test, seed: int):
    return _logistic(split.summary, split.y, train, test, 0.1), None


def mean_rating_lr(split: Split, train, test, seed: int):
    return _logistic(split.mean_rating[:, None], split.y, train, test, 1.0), None


def extratrees(split: Split, train, test, seed: int):
    model = ExtraTreesClassifier(n_estimators=ET_TREES, min_samples_leaf=ET_MIN_LEAF, random_state=seed, n_jobs=1)
    model.fit(split.grades[train], split.y[train])
    p = np.zeros((len(test), len(LABELS)))
    p[:, model.classes_] = model.predict_proba(split.grades[test])
    p = np.maximum(p, ET_FLOOR)
    return p / p.sum(axis=1, keepdims=True), None


def rule_labels(second_best: np.ndarray) -> np.ndarray:
    """The workbench's heuristic label: 2nd-best question self-rating ≥ 5 → 3, ≥ 4 → 1, else 0."""
    return np.where(second_best >= 5, 3, np.where(second_best >= 4, 1, 0))


def heuristic_rule(split: Split, train, test, seed: int):
    return None, rule_labels(split.second_best[test])


CHEAP = {
    "label_frequencies": label_frequencies,
    "multinomial_lr": multinomial_lr,
    "mean_rating_lr": mean_rating_lr,
    "extratrees": extratrees,
    "heuristic_rule": heuristic_rule,
}
METHODS = ("llm_rubric", *CHEAP)
TEXT_BLIND = {"label_frequencies"}  # one prediction for every text of a fold: no Spearman


def krippendorff_alpha(y: np.ndarray, labels: np.ndarray) -> float | None:
    """Krippendorff's ordinal α of the labels against the assessor's; None without the package."""
    try:
        import krippendorff
    except ImportError:
        return None
    return float(
        krippendorff.alpha(
            reliability_data=np.vstack([y, labels]).astype(float),
            level_of_measurement="ordinal",
            value_domain=LABELS.tolist(),
        )
    )


def entropy(y: np.ndarray) -> float:
    """The entropy (nats) of the labels' frequencies: label frequencies' in-sample pair NLL."""
    p = np.bincount(y, minlength=len(LABELS)) / len(y)
    return float(-np.sum(p[p > 0] * np.log(p[p > 0])))


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def figures(y: np.ndarray, probs: np.ndarray | None, labels: np.ndarray | None, ranks: bool = True) -> dict:
    """The figures of one method on held-out pairs: ``probs`` (pairs × 4) or None (a rule), ``labels``
    (None: the argmax of ``probs``); ``ranks`` False: no Spearman (a method blind to the text)."""
    if labels is None:
        labels = probs.argmax(axis=1)
    out = {"n": len(y), "pair_nll": None, "spearman": None}
    if probs is not None:
        out["pair_nll"] = float(-np.mean(np.log(probs[np.arange(len(y)), y])))
        expected = probs @ LABELS
        if ranks and np.ptp(expected) > 0:
            out["spearman"] = _finite(spearmanr(expected, y).statistic)
    out["kappa"] = _finite(cohen_kappa_score(y, labels, labels=LABELS))
    out["qwk"] = _finite(cohen_kappa_score(y, labels, labels=LABELS, weights="quadratic"))
    out["alpha"] = krippendorff_alpha(y, labels)
    return out


def run_cheap(name: str, split: Split, folds: np.ndarray, run: list[int], seed: int) -> dict:
    """``name`` fitted on each outer fold in ``run`` of ``folds``: pooled and per-fold figures, seconds."""
    fit = CHEAP[name]
    parts, seconds = [], 0.0
    for k in run:
        train, test = np.flatnonzero(folds != k), np.flatnonzero(folds == k)
        start = time.process_time()
        probs, labels = fit(split, train, test, seed)
        seconds += time.process_time() - start
        parts.append((test, probs, labels))
    return pooled(split.y, parts, run, name not in TEXT_BLIND) | {"seconds": round(seconds, 2)}


def pooled(y: np.ndarray, parts: list, run: list[int], ranks: bool = True) -> dict:
    """Figures over every part's held-out pairs together, and per fold (``per_fold``)."""
    test = np.concatenate([t for t, _, _ in parts])
    stack = lambda i: None if parts[0][i] is None else np.concatenate([p[i] for p in parts])
    return {
        **figures(y[test], stack(1), stack(2), ranks),
        "folds_run": run,
        "per_fold": {str(k): figures(y[t], p, lab, ranks) for k, (t, p, lab) in zip(run, parts)},
    }


def import_split(data: Path, out: Path) -> None:
    """``llmrubric import workbench`` as a user runs it: features, texts, annotations and summaries in ``out``."""
    command = [sys.executable, "-m", "llmrubric.cli", "import", "workbench", str(data / "rubric-grades.jsonl.gz")]
    command += ["--qrels", str(data / "qrels.txt"), "--summaries", "--no-progress", "--out-dir", str(out)]
    subprocess.run(command, check=True, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL)


def read_split(folder: Path) -> Split:
    read = lambda name, kind: read_table(folder / f"{name}.parquet", kind)
    return assemble(
        read("features", "features"),
        read("summaries", "features"),
        read("texts", "texts"),
        read("annotations", "annotations"),
    )


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _tables_args(side: str, folder: Path) -> list[str]:
    names = {"annotations": "annotations", "features": "summaries", "texts": "texts"}
    return [f"{side}.{key}={folder / f'{name}.parquet'}" for key, name in names.items()]


def fold_commands(run_dir: Path, train_dir: Path, test_dir: Path, seed: int, overrides: list[str]) -> list[list[str]]:
    """The train.py and evaluate.py commands of one outer fold (its tables in ``train_dir``, ``test_dir``)."""
    test = ",".join(
        ["_target_:llmrubric.io.tables.load_tables"]
        + [a.split(".", 1)[1].replace("=", ":", 1) for a in _tables_args("t", test_dir)]
    )
    settings = [
        "rubric=relevance",
        "name=ir_real",
        f"run_dir={run_dir}",
        "protocol=holdout",
        "model.auto.group=system",
        f"seed={seed}",
        "logger=none",
        "baselines=[]",
        *_tables_args("data.train", train_dir),
        f"data.test={{{test}}}",
        *overrides,
    ]
    return [[sys.executable, str(ROOT / app), *settings] for app in ("train.py", "evaluate.py")]


def _write_fold(folder: Path, imported: Path, text_ids) -> None:
    keep = set(text_ids)
    for name, kind in (("annotations", "annotations"), ("summaries", "features"), ("texts", "texts")):
        table = read_table(imported / f"{name}.parquet", kind)
        write_table(table[table.text_id.isin(keep)].reset_index(drop=True), folder / f"{name}.parquet")


def held_out(predictions: pd.DataFrame, text_ids) -> tuple[np.ndarray, np.ndarray | None, str]:
    """Probabilities (texts × 4, in ``text_ids`` order) of the relevance predictions, and their labels:
    the ``label`` column if there is one, else None (the argmax)."""
    rows = predictions[predictions.question_id == "relevance"].drop_duplicates("text_id").set_index("text_id")
    rows = rows.reindex(text_ids)
    probs = rows[[f"p_{k}" for k in LABELS]].to_numpy(float)
    if "label" in rows:
        return probs, rows["label"].astype(int).to_numpy(), "label column"
    return probs, None, "argmax"


def run_llm_rubric(
    split: Split, folds: np.ndarray, run: list[int], imported: Path, work: Path, seed: int, overrides
) -> dict:
    """The user path on each outer fold in ``run``: train.py and evaluate.py (see the module docstring)."""
    parts, seconds, sources, choices = [], 0.0, set(), {}
    for k in run:
        fold = work / f"fold{k}"
        train_ids, test_ids = split.text_ids[folds != k], split.text_ids[folds == k]
        _write_fold(fold / "train", imported, train_ids)
        _write_fold(fold / "test", imported, test_ids)
        start = time.perf_counter()
        for command in fold_commands(fold / "run", fold / "train", fold / "test", seed, overrides):
            subprocess.run(command, check=True, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL)
        seconds += time.perf_counter() - start
        probs, labels, source = held_out(pd.read_csv(fold / "run" / "predictions.csv"), test_ids)
        sources.add(source)
        metrics = json.loads((fold / "run" / "metrics.json").read_text())
        choices[str(k)] = {
            n: round(w, 3) for n, w in metrics.get("auto", {}).get("model", {}).get("weights", {}).items()
        }
        parts.append((np.flatnonzero(folds == k), probs, labels))
    return pooled(split.y, parts, run) | {
        "seconds": round(seconds, 1),
        "label_source": " / ".join(sorted(sources)),
        "auto_weights": choices,
    }


def result_key(method: str, overrides: list[str]) -> str:
    """The results' name of ``method``: ``llm_rubric`` run with ``--override`` settings is a variant,
    ``llm_rubric[K=V …]``, kept beside the shipped default."""
    return f"{method}[{' '.join(overrides)}]" if method == "llm_rubric" and overrides else method


def table(results: dict) -> str:
    keys = ("pair_nll", "spearman", "kappa", "qwk", "alpha", "seconds")
    lines = [f"{'protocol':22} {'method':18} " + " ".join(f"{k:>9}" for k in keys) + "  folds"]
    for protocol, methods in results.items():
        for name, f in methods.items():
            cells = " ".join(f"{'—':>9}" if f[k] is None else f"{f[k]:9.3f}" for k in keys)
            lines.append(f"{protocol:22} {name:18} {cells}  {len(f['folds_run'])}")
    return "\n".join(lines)


def commit() -> str:
    got = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return got.stdout.strip() or "unknown"


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--folds-limit", type=int, default=None, help="run the first N outer folds only")
    parser.add_argument("--seed", type=int, default=0, help="the grouping of the queries, and every model's seed")
    parser.add_argument("--data", type=Path, default=DATA, help="rubric-grades.jsonl.gz and qrels.txt")
    parser.add_argument("--override", nargs="*", default=[], help="extra train.py/evaluate.py settings (llm_rubric)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--merge", action="store_true", help="keep the methods of --out this run does not measure")
    args = parser.parse_args(argv)
    version = code_version()
    for name in ("rubric-grades.jsonl.gz", "qrels.txt"):
        if not (args.data / name).is_file():
            raise InputError(f"{name} not found in {args.data}", setting="--data")
    if args.folds_limit is not None and args.folds_limit < 1:
        raise InputError(f"--folds-limit {args.folds_limit} (use 1 or more)", setting="--folds-limit")
    old = json.loads(args.out.read_text()) if args.merge and args.out.is_file() else {}
    results: dict = {p: dict(old.get(p, {})) for p in PROTOCOLS if p in old or p in args.protocols}
    with tempfile.TemporaryDirectory(prefix="ir_real-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        import_split(args.data, work / "imported")
        import_seconds = time.perf_counter() - start
        split = read_split(work / "imported")
        for protocol in args.protocols:
            folds = outer_folds(split, protocol, args.seed)
            run_folds = sorted(set(folds))[: args.folds_limit]
            for name in args.methods:
                if name == "llm_rubric":
                    got = run_llm_rubric(
                        split, folds, run_folds, work / "imported", work / protocol, args.seed, args.override
                    )
                else:
                    got = run_cheap(name, split, folds, run_folds, args.seed)
                key = result_key(name, args.override)
                results[protocol][key] = got
                print(
                    f"{protocol} {key}: pair NLL {got['pair_nll']}, κ {got['kappa']:.3f} ({got['seconds']}s)",
                    flush=True,
                )
    command = "benchmarks/ir_real.py " + " ".join(argv if argv is not None else sys.argv[1:])
    runs = old.get("meta", {}).get("runs", {})
    meta = {
        **old.get("meta", {}),
        "commit": commit(),
        "command": command,
        "runs": {
            **runs,
            **{
                f"{p}/{result_key(m, args.override)}": f"{command} (commit {commit()})"
                for p in args.protocols
                for m in args.methods
            },
        },
        "data": str(args.data),
        "seed": args.seed,
        "folds": f"query_groups5: system_group_folds(k={QUERY_GROUPS}, seed={args.seed}), system id = query id;"
        " leave_one_query_out: system_folds",
        "import_seconds": round(import_seconds, 1),
        "texts": len(split.text_ids),
        "label_entropy": round(entropy(split.y), 4),
        "queries": int(pd.Series(split.tables.texts.system_id).nunique()),
        "threads": 1,
    }
    write_result({"meta": meta, **results}, args.out, version)
    print(table(results))
    print(f"written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return exit_code(run, argv)


if __name__ == "__main__":
    sys.exit(main())
