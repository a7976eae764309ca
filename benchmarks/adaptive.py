"""An adaptive rubric (issue 34): main-question quality against LLM calls per text.

    .venv/bin/python benchmarks/adaptive.py [--sets real synthetic simulated] [--folds 5] [--limit N]
                                            [--ensemble 1] [--draws 32] [--min-gains 0.005]
                                            [--extraction --chats 4] [--llm-rubric ROOT] [--out FILE]

Sets: ``real`` and ``synthetic`` (the LLM-Rubric release at ``--llm-rubric`` with its GPT-3.5 features)
and ``simulated`` (``data/simulated``). Each set: 5-fold cross-validation by text; on each fold the
calibration network (``model=default`` with ``--ensemble`` members, ``trainer=default``) is fitted on
the training texts, then the held-out texts' blocks are revealed one by one, in three orders:

- ``adaptive``: the selector (:mod:`llmrubric.model.adaptive`, ``--draws`` completions, target: the
  mean over every judge) per text;
- ``fixed``: one order for every text, greedy on the training texts (each step adds the block whose
  reveal gives the lowest training pair NLL of the main question, the rest marginalised);
- ``random``: a random order per text (seeded).

After c calls (1 to every block) the held-out pairs are predicted with the other blocks marginalised
(:func:`llmrubric.evaluation.adaptive.masked_proba`); pair NLL and Pearson of the main question are
pooled over the folds. ``stop_rule``: the adaptive rule stopped by ``min_gain`` g for a grid of g
(mean calls, figures); ``bootstrap``: at each c, the pooled pair NLL of ``adaptive`` minus ``fixed``
with a 95 % paired bootstrap interval over texts (``scipy.stats.bootstrap``);
``logistic_baseline`` (real, synthetic): the issue's check, a pooled logistic regression of the main
question on the expected answers (5-fold CV by text), blocks added greedily by CV NLL.

``--extraction``: SmolLM2-135M-Instruct (``conf/extract/smollm2.yaml``) on ``--chats`` chats of
``data/demo_llm/texts.csv`` spread over its three systems (every 12 // chats-th), with and without ``--adaptive`` (a calibrator of SmolLM2's
features of the real dialogues, ``data/real_llm/smollm2_real.csv``, one run per ``--min-gains``): calls,
seconds (wall, and in the backend), tokens computed, selection seconds and the change of the texts' main
scores (``llmrubric score texts``).

Writes ``benchmarks/results/adaptive.json``: ``{set: {rule: {calls: {pair_nll, pair_pearson}}, ...},
"extraction": {...}, "meta": {commit, dirty, runs: {part: {commit, dirty}}}}`` (parts of earlier runs kept).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, code_version, exit_code, llm_rubric_default, write_result  # noqa: E402
from llmrubric import NetworkCalibrator  # noqa: E402
from llmrubric.config import group  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.splits import text_folds  # noqa: E402
from llmrubric.evaluation.adaptive import MainQuestion, greedy_fixed_order, masked_proba, prefix_hidden  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import Tables, load_tables  # noqa: E402
from llmrubric.model.adaptive import Selector, reveal_orders  # noqa: E402
from llmrubric.model.core.absent import batch_of  # noqa: E402
from llmrubric.model.core.encoding import pairs_of  # noqa: E402

RUBRIC = ROOT / "conf" / "rubric" / "llm_rubric.yaml"
RULES = ("adaptive", "fixed", "random")
THRESHOLDS = (0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05)


def load_set(name: str, root: str, rubric: Rubric) -> Tables:
    if name == "simulated":
        d = ROOT / "data" / "simulated"
        return load_tables(d / "annotations.csv", d / "features.csv", rubric, d / "texts.csv")
    return llm_rubric.load(root, name, rubric)


class Pooled:
    """Per-text sums of main-question pair NLL and the pairs' expected and human answers, over the folds."""

    def __init__(self):
        self.nll_sum, self.count, self.expected, self.answers, self.calls = [], [], [], [], []

    def add(self, main: MainQuestion, probs: np.ndarray, n_texts: int, calls: np.ndarray) -> None:
        nll, expected = main.per_pair(probs)
        rows = main.pair_text[main.labelled]
        self.nll_sum.append(np.bincount(rows, nll, n_texts))
        self.count.append(np.bincount(rows, minlength=n_texts))
        self.expected.append(expected)
        self.answers.append(main.values[main.index[main.labelled]])
        self.calls.append(np.broadcast_to(calls, (n_texts,)).astype(float))

    def figures(self) -> dict:
        nll, count = np.concatenate(self.nll_sum), np.concatenate(self.count)
        expected, answers = np.concatenate(self.expected), np.concatenate(self.answers)
        return {
            "pair_nll": float(nll.sum() / count.sum()),
            "pair_pearson": float(np.corrcoef(expected, answers)[0, 1]),
            "mean_calls": float(np.concatenate(self.calls).mean()),
        }


def run_fold(model, train: Tables, test: Tables, draws: int, seed: int) -> dict:
    """Every rule's pooled-ready results on one held-out fold: {(rule, calls): (main, probs, n_texts, calls)}."""
    selector = Selector(model, {"draws": draws, "seed": seed})
    start = time.perf_counter()
    reveal = reveal_orders(selector, selector.batch_of(test))
    select_seconds = time.perf_counter() - start
    labelled = batch_of(model, test, pairs_of(test.annotations))
    main = MainQuestion(model, test, labelled)
    text_row = pd.Index(selector.batch_of(test).texts).get_indexer(labelled.texts)
    n_blocks, n_texts = labelled.absent.shape[1], len(labelled.texts)
    fixed = greedy_fixed_order(model, train)
    rng = np.random.default_rng(seed)
    orders = {
        "adaptive": reveal.order[text_row],
        "fixed": np.tile(fixed, (n_texts, 1)),
        "random": np.stack([rng.permutation(n_blocks) for _ in range(n_texts)]),
    }
    out = {}
    for rule, order in orders.items():
        for calls in range(0, n_blocks + 1):
            probs = masked_proba(model, labelled, prefix_hidden(order, calls, n_blocks))
            out[(rule, calls)] = (main, probs, n_texts, np.full(n_texts, calls))
    for g in THRESHOLDS:
        calls = reveal.calls(g)[text_row]
        probs = masked_proba(model, labelled, prefix_hidden(orders["adaptive"], calls, n_blocks))
        out[("stop_rule", g)] = (main, probs, n_texts, calls)
    return {
        "results": out,
        "fixed_order": [model.layout_.blocks[b].name for b in fixed],
        "select_seconds": select_seconds,
    }


def bootstrap_difference(a: Pooled, b: Pooled, seed: int) -> dict:
    """Pooled pair NLL of ``a`` minus ``b`` and its 95 % paired bootstrap interval over texts."""
    da, db, n = (np.concatenate(p) for p in (a.nll_sum, b.nll_sum, a.count))
    keep = n > 0
    diff, n = (da - db)[keep], n[keep]
    result = stats.bootstrap(
        (diff, n),
        lambda d, k: d.sum() / k.sum(),
        paired=True,
        vectorized=False,
        n_resamples=2000,
        method="percentile",
        random_state=seed,
    )
    ci = result.confidence_interval
    return {"difference": float(diff.sum() / n.sum()), "low": float(ci.low), "high": float(ci.high)}


def run_set(name: str, args, rubric: Rubric) -> dict:
    tables = load_set(name, args.llm_rubric, rubric)
    texts = sorted(tables.annotations.text_id.unique())
    if args.limit:
        texts = texts[: args.limit]
        tables = tables.subset(texts)
    folds = text_folds(texts, args.folds, args.seed)
    pooled: dict = {}
    fixed_orders, seconds = [], {"fit": 0.0, "select": 0.0}
    for k in range(args.folds):
        test_ids = folds.text_id[folds.fold == k].tolist()
        train, test = tables.subset(sorted(set(texts) - set(test_ids))), tables.subset(test_ids)
        start = time.perf_counter()
        model = NetworkCalibrator(rubric, {"ensemble": args.ensemble}, group("trainer", args.trainer), seed=k).fit(
            train
        )
        seconds["fit"] += time.perf_counter() - start
        fold = run_fold(model, train, test, args.draws, args.seed)
        fixed_orders.append(fold["fixed_order"])
        seconds["select"] += fold["select_seconds"]
        for key, value in fold["results"].items():
            pooled.setdefault(key, Pooled()).add(*value)
        print(f"{name} fold {k}: fixed order {fold['fixed_order']}", flush=True)
    out: dict = {rule: {} for rule in RULES}
    for (rule, calls), p in pooled.items():
        if rule in RULES:
            figures = p.figures()
            out[rule][str(calls)] = {"pair_nll": figures["pair_nll"], "pair_pearson": figures["pair_pearson"]}
    out["stop_rule"] = {f"{g:g}": pooled[("stop_rule", g)].figures() for g in THRESHOLDS}
    n_blocks = max(c for r, c in pooled if r == "adaptive")
    out["bootstrap"] = {
        str(c): bootstrap_difference(pooled[("adaptive", c)], pooled[("fixed", c)], args.seed)
        for c in range(1, n_blocks)
    }
    out["fixed_orders"] = fixed_orders
    out["seconds"] = seconds
    out["texts"] = len(texts)
    if name in ("real", "synthetic"):
        out["logistic_baseline"] = logistic_baseline(tables, rubric, args.folds, args.seed)
    return out


def logistic_baseline(tables: Tables, rubric: Rubric, n_folds: int, seed: int) -> dict:
    """The issue's check: pooled multinomial logistic regression of the main question on the expected
    answers (CV by text), blocks added greedily by CV pair NLL."""
    from sklearn.linear_model import LogisticRegression

    from llmrubric.model.core.columns import text_columns
    from llmrubric.model.core.encoding import FeatureLayout

    layout = FeatureLayout.from_features(tables.features, rubric)
    ids = sorted(tables.features.text_id.unique())
    x = pd.DataFrame(text_columns(layout, rubric, tables.features, ids), index=ids)
    ann = tables.annotations[tables.annotations.question_id == rubric.main.id]
    y = np.array([rubric.main.index_of(a) for a in ann.answer])
    xa = x.loc[ann.text_id].to_numpy()
    fold = text_folds(ann.text_id, n_folds, seed).set_index("text_id").fold.loc[ann.text_id].to_numpy()

    def cv_nll(cols: list[int]) -> float:
        nll = np.zeros(len(y))
        for k in range(n_folds):
            train, test = fold != k, fold == k
            m = LogisticRegression(max_iter=2000).fit(xa[train][:, cols], y[train])
            p = m.predict_proba(xa[test][:, cols])
            col = np.searchsorted(m.classes_, y[test])
            seen = np.isin(y[test], m.classes_)
            nll[test] = -np.log(
                np.clip(np.where(seen, p[np.arange(test.sum()), np.minimum(col, p.shape[1] - 1)], 0), 1e-12, 1)
            )
        return float(nll.mean())

    chosen, left, path = [], list(range(x.shape[1])), []
    while left:
        scores = {c: cv_nll([*chosen, c]) for c in left}
        best = min(scores, key=scores.get)
        chosen.append(best)
        left.remove(best)
        path.append({"added": layout.blocks[best].question_id, "pair_nll": scores[best]})
    return {"path": path, "all_blocks": path[-1]["pair_nll"], "best": min(path, key=lambda s: s["pair_nll"])}


def run_extraction(args, rubric: Rubric) -> dict:
    """SmolLM2 on ``--chats`` demo chats, without and with ``--adaptive`` (each ``--min-gains`` threshold)."""
    model_file = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not model_file.is_file():
        model_file = Path(args.models) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        real = llm_rubric.load(
            args.llm_rubric, "real", rubric, features=ROOT / "data" / "real_llm" / "smollm2_real.csv"
        )
        calibrator = NetworkCalibrator(rubric, {"ensemble": args.ensemble}, group("trainer", args.trainer)).fit(real)
        checkpoint = calibrator.save(tmp / "smollm2.safetensors")
        texts = pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv")
        texts = texts.iloc[:: max(1, len(texts) // args.chats)].head(args.chats)  # spread over the systems
        texts.to_csv(tmp / "texts.csv", index=False)
        plain = _extract(tmp, "all", model_file, checkpoint, [], rubric)
        out = {"chats": texts.text_id.tolist(), "all": _run_figures(plain), "adaptive": {}}
        for g in args.min_gains:
            extra = ["--adaptive", "--calibrator", str(checkpoint), "--min-gain", str(g)]
            run = _extract(tmp, f"adaptive_{g:g}", model_file, checkpoint, extra, rubric)
            change = run["scores"] - plain["scores"]
            saved = plain["summary"]["llm_seconds"] - run["summary"]["llm_seconds"]
            out["adaptive"][f"{g:g}"] = {
                **_run_figures(run),
                "asked_blocks": run["summary"]["asked_blocks"],
                "saved_blocks": run["summary"]["saved_blocks"],
                "select_seconds": run["summary"]["select_seconds"],
                "llm_seconds_saved": saved,
                "selection_overhead_share_of_saved_llm_time": run["summary"]["select_seconds"] / saved
                if saved > 0
                else None,
                "main_score_change_mean_abs": float(change.abs().mean()),
                "main_score_change_max_abs": float(change.abs().max()),
            }
    return out


def _extract(tmp: Path, name: str, model_file: Path, checkpoint: Path, extra: list[str], rubric: Rubric) -> dict:
    """One ``extract features`` run and ``score texts`` of its features: wall seconds, summary, main scores by text."""
    out, cli = tmp / f"{name}.csv", [sys.executable, "-m", "llmrubric.cli"]
    argv = ["extract", "features", str(tmp / "texts.csv"), "--config", str(ROOT / "conf/extract/smollm2.yaml")]
    argv += ["--model", str(model_file), "--out", str(out), "--no-progress", "--threads", "1", *extra]
    start = time.perf_counter()
    subprocess.run([*cli, *argv], check=True, cwd=ROOT)
    wall = time.perf_counter() - start
    scores = tmp / f"{name}.scores.csv"
    subprocess.run(
        [*cli, "score", "texts", str(checkpoint), str(out), "--out", str(scores), "--no-progress"], check=True, cwd=ROOT
    )
    main = pd.read_csv(scores)
    main = main[main.question_id == rubric.main.id].set_index("text_id")["mean"]
    return {"wall_seconds": wall, "summary": json.loads((tmp / f"{name}.summary.json").read_text()), "scores": main}


def _run_figures(run: dict) -> dict:
    s = run["summary"]
    return {
        "calls": s["computed"],
        "wall_seconds": run["wall_seconds"],
        "llm_seconds": s["llm_seconds"],
        "computed_tokens": s["computed_tokens"],
        "main_scores": run["scores"].to_dict(),
    }


def run(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="*", default=["synthetic", "simulated", "real"])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--limit", type=int, help="only the first N annotated texts of each set (quick looks)")
    parser.add_argument("--ensemble", type=int, default=1)
    parser.add_argument("--trainer", default="default")
    parser.add_argument("--draws", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--min-gains", type=float, nargs="+", default=[0.005], help="the stop rules of the adaptive extraction runs"
    )
    parser.add_argument("--extraction", action="store_true")
    parser.add_argument("--chats", type=int, default=4)
    parser.add_argument("--models", default=str(ROOT.parent / "main" / "models"), help="folder of the SmolLM2 GGUF")
    parser.add_argument("--llm-rubric", default=llm_rubric_default())
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "adaptive.json"))
    args = parser.parse_args(argv)
    rubric = Rubric.load(RUBRIC)
    out = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    version = code_version()
    runs = out.setdefault("meta", {}).setdefault("runs", {})  # each part's commit: parts merge from several runs
    for name in args.sets:
        out[name] = run_set(name, args, rubric)
        out[name]["settings"] = {
            k: getattr(args, k) for k in ("folds", "limit", "ensemble", "trainer", "draws", "seed")
        }
        runs[name] = version
        write_result(out, args.out, version)
    if args.extraction:
        out["extraction"] = run_extraction(args, rubric)
        runs["extraction"] = version
        write_result(out, args.out, version)
    print(
        json.dumps(
            {k: {r: v.get(r) for r in ("stop_rule",)} for k, v in out.items() if isinstance(v, dict) and k != "meta"},
            indent=1,
        )[:4000]
    )
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(run, None))
