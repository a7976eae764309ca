"""Rank intervals of leaderboards on the shared multi-system generator: joint and per-system coverage of true ranks.

    .venv/bin/python benchmarks/rank_intervals.py [--seeds 100] [--model-seeds 20] [--texts 96] [--bootstrap 1000]
        [--label-k 5 10 20] [--label-draws 50]
        [--generator ../shared/generators/multisystem.py] [--out benchmarks/results/rank_intervals.json]

Every seed S runs the generator with ``--systems 8 --references 1 --texts N --seed S``: 8 systems and one
human-written reference far above them. The truth: the generator draws the systems' qualities q first from its seed
(q ~ N(0, sb²), the reference max q + gap·sb + N(0, (0.1·sb)²)), before anything that depends on ``--texts``, and a
system's population human mean rises with its q (human answers are cuts of q + text and rater noise), so the true
ranks are the ranks of q. :func:`true_quality` redraws q from the seed with the generator's defaults;
``--check-texts`` checks that order against the human means of large runs.

Two leaderboards (``llmrubric.scoring.leaderboard.build``, 95 %):

- ``human``: each text's score is the mean of its human answers (one pseudo-judge whose distribution is the text's
  answer distribution, expected answers), every seed. Its rank intervals promise the population human ranks; their
  coverage measures the guarantee itself: texts resampled by the bootstrap. For comparison, two naive rank
  intervals: from the per-system 95 % intervals (``human_per_system_intervals``), and the 2.5 and 97.5 %
  quantiles of each system's rank over the replicates (``human_replicate_rank_percentiles``).
- ``model``: ``ridge_judge`` fitted on the other 8 systems' annotations predicts each held-out system's texts for
  the 3 rating slots (leave one system out), the board built from those predictions as users build it, on the
  first ``--model-seeds`` seeds. Its rank intervals promise the model's own population ranks, which the generator
  does not give; their coverage of the human ranks measures what a user gets when the model misjudges systems. The
  same run's leave-one-system-out errors (predicted − human system mean) as ``--shift-errors`` give the shift rank
  intervals (Bonferroni), which aim at the human ranks; those errors include the ranked systems' own.

With k labelled texts of the new systems (``model_labels``): on each model board, k texts of every system (all
systems are new to the model: each was held out) drawn uniformly without replacement, ``--label-draws`` times for
each k of ``--label-k`` (draw d of seed S and k from ``default_rng([S, k, d])``, apart from everything above, so
the k = 0 figures stay as they are); their human means (:func:`llmrubric.scoring.leaderboard.human_labels`) as the
labels of ``llmrubric leaderboard build --annotations``, and the label rank intervals it adds
(``label_rank_low, label_rank_high``: Bonferroni over the K systems' PPI++ intervals at alpha / K,
:func:`llmrubric.scoring.leaderboard.label_rank_intervals`), against the true ranks. ``k=0`` repeats the board's
own and shift rank intervals (``model_vs_human``, ``model_shift``).

Writes ``benchmarks/results/rank_intervals.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import code_version, exit_code, write_result  # noqa: E402

from llmrubric.io.errors import InputError  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import load_tables  # noqa: E402
from llmrubric.model.core.registry import fit_questions, make  # noqa: E402
from llmrubric.scoring import leaderboard as lb  # noqa: E402
from llmrubric.scoring.ranks import rank_intervals  # noqa: E402

SYSTEMS, REFERENCES = 8, 1
SB, GAP = 0.6, 2.5  # the generator's --sb and --reference-gap defaults
SLOTS = ["slot1", "slot2", "slot3"]  # the generator's rating slots (--judges slots)


def true_quality(seed: int, systems: int = SYSTEMS, references: int = REFERENCES) -> pd.Series:
    """system → quality q of the generator run with ``--seed seed`` (its first draws; module doc)."""
    rng = np.random.default_rng(seed)
    q = rng.normal(0, SB, systems)
    ref = q.max() + GAP * SB + rng.normal(0, 0.1 * SB, references)
    names = [f"sys{s:02d}" for s in range(systems)] + [f"ref{r:02d}" for r in range(references)]
    return pd.Series(np.r_[q, ref], index=names)


def true_ranks(seed: int) -> pd.Series:
    q = true_quality(seed)
    return pd.Series(len(q) - stats.rankdata(q).astype(int) + 1, index=q.index)


def generate(generator: Path, out: Path, texts: int, seed: int, *extra: str) -> Path:
    args = [sys.executable, str(generator), str(out), "--systems", str(SYSTEMS), "--references", str(REFERENCES)]
    done = subprocess.run([*args, "--texts", str(texts), "--seed", str(seed), *extra], capture_output=True, text=True)
    if done.returncode != 0:
        raise InputError(f"the generator failed: {done.stderr.strip().splitlines()[-1:]}", file=str(generator))
    return out


def human_predictions(annotations: pd.DataFrame, question) -> pd.DataFrame:
    """One pseudo-judge per text whose distribution is the text's human answers to ``question``."""
    main = annotations[annotations.question_id == question.id]
    counts = pd.crosstab(main.text_id, main.answer.astype(str)).reindex(columns=list(question.keys), fill_value=0)
    p = counts.div(counts.sum(axis=1), axis=0)
    p.columns = [f"p_{k}" for k in question.keys]
    systems = main.drop_duplicates("text_id").set_index("text_id").system_id
    return p.reset_index().assign(
        judge_id="humans", question_id=question.id, system_id=lambda d: d.text_id.map(systems)
    )


def model_predictions(tables, rubric: Rubric) -> tuple[pd.DataFrame, pd.Series]:
    """ridge_judge's predictions of every system's texts, fitted on the other systems; and each system's shift
    error (mean predicted judge-free score − human mean)."""
    main = rubric.main
    system_of = tables.texts.set_index("text_id").system_id
    parts, errors = [], {}
    for system in sorted(system_of.unique()):
        train, test = (
            tables.subset(system_of.index[system_of != system]),
            tables.subset(system_of.index[system_of == system]),
        )
        model = fit_questions(make("ridge_judge", rubric), train, [main.id])
        pairs = pd.DataFrame([(t, j) for t in test.texts.text_id for j in SLOTS], columns=["text_id", "judge_id"])
        pred = model.predict(test, pairs)
        pred = pred[pred.question_id == main.id]
        parts.append(pred)
        ann = test.annotations[test.annotations.question_id == main.id]
        errors[system] = float(pred["mean"].mean() - ann.answer.astype(float).mean())
    return pd.concat(parts, ignore_index=True), pd.Series(errors, name="error")


def coverage(board: pd.DataFrame, truth: pd.Series, low: str, high: str) -> dict:
    """Whether every true rank is inside its interval, each system's, and the mean width (ranks spanned − 1)."""
    b = board.set_index("system").reindex(truth.index)
    inside = (b[low] <= truth) & (truth <= b[high])
    return {"joint": bool(inside.all()), "per_system": inside.to_dict(), "width": float((b[high] - b[low]).mean())}


def replicate_rank_percentiles(boot: dict, systems, alpha: float) -> pd.DataFrame:
    """Per system, the alpha/2 and 1 − alpha/2 quantiles of its rank over the replicates (a common naive rank
    interval, for comparison)."""
    means = np.stack([boot["means"][s] for s in systems])
    ranks = len(means) - stats.rankdata(means, axis=0) + 1
    low, high = np.quantile(ranks, [alpha / 2, 1 - alpha / 2], axis=1)
    return pd.DataFrame({"system": list(systems), "low": low, "high": high})


def draw_labels(systems, human_means: pd.Series, k: int, rng: np.random.Generator) -> pd.Series:
    """The human means of ``k`` texts of every system, drawn uniformly without replacement."""
    chosen = [rng.choice(s.text_ids, size=min(k, len(s.text_ids)), replace=False) for s in systems]
    return human_means.reindex(np.concatenate(chosen))


def summary(runs: list[dict]) -> dict:
    per_system = [v for r in runs for v in r["per_system"].values()]
    return {
        "boards": len(runs),
        "joint_coverage": float(np.mean([r["joint"] for r in runs])),
        "per_system_coverage": float(np.mean(per_system)),
        "worst_system_coverage": float(
            pd.DataFrame([r["per_system"] for r in runs]).mean().min() if runs else float("nan")
        ),
        "mean_width": float(np.mean([r["width"] for r in runs])),
    }


def check_truth(generator: Path, texts: int, seeds: int, work: Path) -> list[dict]:
    """Spearman ρ and pairs out of order between :func:`true_quality` and the human means of large runs (the
    generator with 1 source and 1 question: the same qualities, drawn first)."""
    out = []
    for seed in range(seeds):
        d = generate(generator, work / f"check{seed}", texts, seed, "--sources", "1", "--questions", "1")
        ann = pd.read_csv(d / "annotations.csv")
        human = ann.answer.astype(float).groupby(ann.system_id).mean()
        q = true_quality(seed).reindex(human.index)
        wrong = [
            (a, b, round(float(q[a] - q[b]), 3))
            for a in q.index
            for b in q.index
            if q[a] > q[b] and human[a] <= human[b]
        ]
        out.append(
            {"seed": seed, "texts": texts, "spearman": float(stats.spearmanr(q, human)[0]), "out_of_order": wrong}
        )
    return out


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100, help="generator seeds of the human boards")
    parser.add_argument("--model-seeds", type=int, default=20, help="the first seeds also get a model board")
    parser.add_argument("--texts", type=int, default=96, help="texts per system")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--label-k", type=int, nargs="+", default=[5, 10, 20], help="labelled texts per system")
    parser.add_argument("--label-draws", type=int, default=50, help="draws of the labelled texts per k and seed")
    parser.add_argument("--check-texts", type=int, default=4000, help="texts per system of the truth check runs")
    parser.add_argument("--check-seeds", type=int, default=2)
    parser.add_argument("--generator", default=str(ROOT.parent / "shared" / "generators" / "multisystem.py"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rank_intervals.json"))
    args = parser.parse_args(argv)
    start, version = time.perf_counter(), code_version()
    generator = Path(args.generator)
    if not generator.is_file():
        raise InputError("the multi-system generator is not there (--generator)", file=str(generator))
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    names = ("human", "human_per_system_intervals", "human_replicate_rank_percentiles", "model_vs_human", "model_shift")
    found: dict[str, list] = {name: [] for name in names}
    spearman = []
    labelled: dict[int, list] = {k: [] for k in args.label_k}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        truth_check = check_truth(generator, args.check_texts, args.check_seeds, work)
        for seed in range(args.seeds):
            d = generate(generator, work / f"s{seed}", args.texts, seed)
            rubric, truth = Rubric.load(d / "rubric.yaml"), true_ranks(seed)
            human = lb.build(
                human_predictions(pd.read_csv(d / "annotations.csv"), rubric.main),
                rubric.main,
                n_boot=args.bootstrap,
                seed=seed,
                alpha=args.alpha,
                sample_answers=False,
            )
            board = human.board
            found["human"].append(coverage(board, truth, "rank_low", "rank_high"))
            naive = board.assign(**dict(zip(("naive_low", "naive_high"), rank_intervals(board.low, board.high))))
            found["human_per_system_intervals"].append(coverage(naive, truth, "naive_low", "naive_high"))
            percentiles = replicate_rank_percentiles(human.boot, board.system, args.alpha)
            found["human_replicate_rank_percentiles"].append(coverage(percentiles, truth, "low", "high"))
            if seed < args.model_seeds:
                tables = load_tables(d / "annotations.csv", d / "features.csv", rubric, d / "texts.csv")
                pred, errors = model_predictions(tables, rubric)
                res = lb.build(
                    pred,
                    rubric.main,
                    tables.texts,
                    n_boot=args.bootstrap,
                    seed=seed,
                    alpha=args.alpha,
                    shift_errors=errors,
                )
                found["model_vs_human"].append(coverage(res.board, truth, "rank_low", "rank_high"))
                found["model_shift"].append(coverage(res.board, truth, "shift_rank_low", "shift_rank_high"))
                human_means = lb.human_labels(tables.annotations, rubric.main)
                for k in args.label_k:
                    for draw in range(args.label_draws):
                        labels = draw_labels(res.systems, human_means, k, np.random.default_rng([seed, k, draw]))
                        ranks = lb.label_rank_intervals(res.systems, labels, alpha=args.alpha)
                        labelled[k].append(coverage(ranks, truth, "label_rank_low", "label_rank_high"))
                scores = res.board.set_index("system").score.reindex(truth.index)
                spearman.append(float(stats.spearmanr(-truth, scores)[0]))
            shown = {k: round(summary(v)["joint_coverage"], 3) for k, v in found.items() if v}
            print(f"seed {seed}: joint coverage so far {shown}", flush=True)
    report = {
        "meta": {"seconds": round(time.perf_counter() - start, 1)},
        "settings": {
            "generator": f"--systems {SYSTEMS} --references {REFERENCES} --texts {args.texts} --seed S",
            "seeds": args.seeds,
            "model_seeds": args.model_seeds,
            "bootstrap": args.bootstrap,
            "alpha": args.alpha,
        },
        "truth_check": truth_check,
        **{name: summary(runs) for name, runs in found.items()},
        "model_spearman_vs_truth": float(np.mean(spearman)) if spearman else None,
        "model_labels": {
            "settings": {
                "k": args.label_k,
                "draws": args.label_draws,
                "sampling": "k texts of every system, uniformly without replacement",
                "rank_intervals": "label_rank_low/high: Bonferroni over the systems' PPI++ intervals at alpha / K",
            },
            "k=0": {"rank": summary(found["model_vs_human"]), "shift_rank": summary(found["model_shift"])},
            **{f"k={k}": {"label_rank": summary(runs)} for k, runs in labelled.items()},
        },
    }
    for name in found:
        print(f"{name}: {report[name]}")
    for k, runs in labelled.items():
        print(f"model, {k} labelled texts per system: label ranks {summary(runs)}")
    print(f"model: mean Spearman of its scores with the true order {report['model_spearman_vs_truth']}")
    print(f"truth check: {truth_check}")
    print(f"written: {write_result(report, args.out, version)}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(run, None))
