"""Side by side inside MLflow (issue 59): one majority label per trace, as MLflow's judge alignment uses, against
per-rater calibration, on the DialSummEval set loaded into MLflow as traces.

    .venv/bin/python benchmarks/mlflow_majority.py [--dialsumm DIR] [--dialogues 40] [--folds 5] [--seed 0]
                                                   [--family clmm_own] [--out FILE]

The shared DialSumm set (``--dialsumm``, default ``../shared/data/dialsumm``: 14 systems x 100 dialogues, three
raters, three LLM sources) is cut to its first ``--dialogues`` dialogues (all 14 systems' summaries of each) and
written into a fresh SQLite MLflow store in a temporary folder by :func:`llmrubric.mlflow_genai.write.log_tables`
(a trace per summary, a ``HUMAN`` feedback per rating, an ``LLM_JUDGE`` feedback per LLM answer distribution),
then read back by ``llmrubric import mlflow``'s reader (:func:`llmrubric.mlflow_genai.read.read_traces`); the
round trip must return the same tables. Two targets, each fitted by the same model family (``--family``, a
registry name: ``llmrubric models list``) on the same features under ``--folds``-fold text CV:

- ``per_rater``: every rater's own answers, each rater a judge (what llmrubric trains on);
- ``majority``: one label per (trace, question) by MLflow's rule for conflicting human feedback
  (``mlflow.genai.judges.optimizers.dspy_utils._resolve_assessment_conflicts``, MLflow 3.17: the label given most
  often, a tie to the group with the latest feedback), one judge.

Both are scored against every held-out (summary, rater) pair of every question: pair NLL (-log of the predicted
probability of the rater's answer; the majority model predicts one distribution per summary for all raters),
RMSE, each rater's mean error (predicted mean - the rater's answer: the offset a majority target cannot carry),
and each rater's kappa / quadratic kappa / alpha of the predicted label (:func:`llmrubric.evaluation.metrics.evaluate`,
``judges``); the majority model also against the majority label it was fitted to. MLflow's own ``judge.align``
(SIMBA, GEPA, MemAlign through DSPy and an LLM endpoint) is not run: it rewrites the judge's prompt for exact
agreement with the majority label; see ``mlflow_align`` in the result.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import code_version, exit_code, write_result  # noqa: E402

from llmrubric.data.splits import text_folds  # noqa: E402
from llmrubric.evaluation.metrics import evaluate, nll  # noqa: E402
from llmrubric.io.errors import InputError  # noqa: E402
from llmrubric.io.predictions import probabilities  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import Tables, load_tables, validate_annotations, validate_features  # noqa: E402
from llmrubric.model.core.registry import make  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "dialsumm"
OUT = ROOT / "benchmarks" / "results" / "mlflow_majority.json"
MAJORITY = "majority"
MLFLOW_ALIGN = (
    "not run: judge.align (MLflow 3.17: SIMBA, GEPA, MemAlign) needs DSPy and an LLM endpoint, and would rewrite the "
    "judge's prompt (instructions and few-shot demonstrations) to maximise exact agreement of the judge's one "
    "answer with the one majority label per trace (_resolve_assessment_conflicts); it yields a prompt, no answer "
    "distribution and no per-rater model, so neither the pair NLL nor a rater's offset is defined for it"
)


def majority_labels(traces, rubric: Rubric, text_of: dict[str, str]) -> pd.DataFrame:
    """One label per (trace, question) from its HUMAN feedback by MLflow's conflict rule: the most frequent
    value, a tie to the group holding the latest feedback (``create_time_ms``)."""
    rows = []
    for trace in traces:
        groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for a in trace.info.assessments:
            if a.feedback is not None and a.source.source_type == "HUMAN" and a.name in rubric:
                groups[a.name][str(a.feedback.value).lower()].append(a.create_time_ms or 0)
        for qid, by_label in groups.items():
            label = max(by_label, key=lambda v: (len(by_label[v]), max(by_label[v])))
            rows.append((text_of[trace.info.trace_id], MAJORITY, qid, label))
    return pd.DataFrame(rows, columns=["text_id", "judge_id", "question_id", "answer"])


def through_mlflow(tables: Tables, rubric: Rubric) -> tuple[Tables, pd.DataFrame, dict]:
    """``tables`` written to a fresh SQLite MLflow store as traces and read back: the tables read, the majority
    labels and the timings / round-trip checks."""
    import mlflow

    from llmrubric.mlflow_genai.read import read_traces, search_traces
    from llmrubric.mlflow_genai.write import log_tables

    with tempfile.TemporaryDirectory() as tmp:
        mlflow.set_tracking_uri(f"sqlite:///{Path(tmp) / 'mlflow.db'}")
        experiment_id = mlflow.MlflowClient().create_experiment("dialsumm")
        start = time.perf_counter()
        log_tables(experiment_id, tables, rubric, system_tag="system_id", progress=True)
        logged = time.perf_counter() - start
        start = time.perf_counter()
        traces = search_traces(mlflow.MlflowClient(), "dialsumm")
        got = read_traces(traces, rubric, system_tag="system_id")
        read = time.perf_counter() - start
        text_of = dict(zip(got.texts.trace_id, got.texts.text_id))
        majority = majority_labels(traces, rubric, text_of)
    got.annotations.attrs["source"] = got.features.attrs["source"] = "MLflow traces"
    back = Tables(
        validate_annotations(got.annotations, rubric),
        validate_features(got.features, rubric),
        got.texts.drop(columns="text"),
    )
    key = ["text_id", "judge_id", "question_id", "answer"]
    same_annotations = (
        back.annotations[key]
        .sort_values(key)
        .reset_index(drop=True)
        .equals(tables.annotations[key].sort_values(key).reset_index(drop=True))
    )
    fkey = ["text_id", "source", "question_id", "option"]
    merged = back.features.merge(tables.features, on=fkey, how="outer", suffixes=("", "_given"))
    worst = float((merged.prob - merged.prob_given).abs().max())
    if not same_annotations or merged.prob.isna().any() or worst > 1e-9:
        raise InputError(
            f"the MLflow round trip changed the tables (annotations same: {same_annotations}, worst {worst})"
        )
    store = {
        "traces": len(traces),
        "feedback_logged": int(len(tables.annotations) + tables.features.groupby(fkey[:3]).ngroups),
        "log_seconds": logged,
        "read_seconds": read,
        "round_trip": "identical annotations; features within 1e-9",
        "counts": got.counts,
    }
    return back, validate_annotations(majority, rubric), store


def fold_predictions(
    family: str, rubric: Rubric, tables: Tables, majority: pd.DataFrame, folds: pd.DataFrame, seed: int
):
    """Held-out predictions of both targets over the text folds: (per-rater predictions of the rater pairs,
    majority predictions of one pair per text)."""
    per_rater, by_majority = [], []
    for k in sorted(folds.fold.unique()):
        test_ids = set(folds.text_id[folds.fold == k])
        train_ids = set(folds.text_id) - test_ids
        train, test = tables.subset(train_ids), tables.subset(test_ids)
        per_rater.append(make(family, rubric, seed=seed).fit(train).predict(test))
        target = Tables(majority[majority.text_id.isin(train_ids)], train.features, train.texts)
        pairs = pd.DataFrame({"text_id": sorted(test_ids), "judge_id": MAJORITY, "round": "1"})
        by_majority.append(make(family, rubric, seed=seed).fit(target).predict(test, pairs))
        print(f"fold {k}: {len(train_ids)} training texts, {len(test_ids)} held out", flush=True)
    return pd.concat(per_rater, ignore_index=True), pd.concat(by_majority, ignore_index=True)


def figures(predictions: pd.DataFrame, annotations: pd.DataFrame, question) -> dict:
    """Pair NLL, RMSE, each rater's mean error and agreement of ``predictions`` against ``annotations``."""
    got = evaluate(predictions, annotations, question)
    merged = predictions[predictions.question_id == question.id].merge(
        annotations[annotations.question_id == question.id][["text_id", "judge_id", "round", "answer"]],
        on=["text_id", "judge_id", "round"],
    )
    error = merged["mean"].to_numpy(float) - merged.answer.astype(float).to_numpy()
    mean_error = pd.Series(error).groupby(merged.judge_id.to_numpy()).mean()
    return {
        "pairs": got["n"],
        "pair_nll": got["nll"],
        "rmse": got["rmse"],
        "pearson": got["pearson"],
        "rater_mean_error": {j: float(v) for j, v in mean_error.items()},
        "rater_mean_abs_error": float(mean_error.abs().mean()),
        "raters": got["judges"],
    }


def as_rater_predictions(by_majority: pd.DataFrame, annotations: pd.DataFrame) -> pd.DataFrame:
    """The majority model's one prediction per (text, question) copied to each rater who rated it."""
    pairs = annotations[["text_id", "judge_id", "round"]].drop_duplicates()
    return by_majority.drop(columns=["judge_id", "round"]).merge(pairs, on="text_id")


def question_figures(question, tables: Tables, majority: pd.DataFrame, per_rater, by_majority) -> dict:
    ann = tables.annotations
    held = by_majority[by_majority.question_id == question.id]
    fitted = majority[majority.question_id == question.id].merge(held, on=["text_id", "judge_id", "question_id"])
    index = pd.Index(question.keys).get_indexer(fitted.answer)
    return {
        "per_rater": figures(per_rater, ann, question),
        "majority": figures(as_rater_predictions(by_majority, ann), ann, question),
        "majority_vs_its_label": {"pairs": int(len(fitted)), "nll": nll(probabilities(fitted, question), index)},
    }


def data_subset(path: Path, dialogues: int) -> tuple[Rubric, Tables, dict]:
    rubric = Rubric.load(path / "rubric.yaml").with_main("coherence")
    tables = load_tables(path / "annotations.csv", path / "features.csv", rubric, texts=path / "texts.csv")
    queries = sorted(tables.texts.query_id.astype(str).unique())
    if not 0 < dialogues <= len(queries):
        raise InputError(f"--dialogues {dialogues} is not in 1..{len(queries)}", setting="--dialogues")
    keep = tables.texts.text_id[tables.texts.query_id.astype(str).isin(queries[:dialogues])]
    part = tables.subset(keep)
    part = Tables(part.annotations, part.features, part.texts[["text_id", "system_id", "query_id", "text"]])
    data = {
        "path": str(path),
        "dialogues": dialogues,
        "of_dialogues": len(queries),
        "texts": int(len(part.texts)),
        "systems": int(part.texts.system_id.nunique()),
        "raters": sorted(part.annotations.judge_id.unique()),
        "sources": sorted(part.features.source.unique()),
    }
    return rubric, part, data


def run(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dialsumm", default=str(DATA), help="the DialSummEval folder")
    parser.add_argument("--dialogues", type=int, default=40, help="first dialogues kept (x 14 systems' summaries)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", default="clmm_own", help="the model family both targets are fitted with")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    version, started = code_version(), time.perf_counter()
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    rubric, tables, data = data_subset(Path(args.dialsumm), args.dialogues)
    back, majority, store = through_mlflow(tables, rubric)
    folds = text_folds(back.texts.text_id, args.folds, args.seed)
    per_rater, by_majority = fold_predictions(args.family, rubric, back, majority, folds, args.seed)
    questions = {q.id: question_figures(q, back, majority, per_rater, by_majority) for q in rubric.questions}
    report = {
        "question": "What does one majority label per trace (MLflow's alignment target) keep and lose against per-rater calibration?",
        "data": data,
        "store": store,
        "protocol": {"cv": f"{args.folds}-fold text CV", "seed": args.seed, "family": args.family},
        "questions": questions,
        "mlflow_align": MLFLOW_ALIGN,
        "meta": {"seconds": time.perf_counter() - started, "cpus": os.cpu_count()},
    }
    write_result(report, args.out, version)
    for qid, q in questions.items():
        a, b = q["per_rater"], q["majority"]
        print(
            f"{qid}: pair NLL per-rater {a['pair_nll']:.3f} vs majority {b['pair_nll']:.3f}; rater |mean error| "
            f"{a['rater_mean_abs_error']:.3f} vs {b['rater_mean_abs_error']:.3f}; RMSE {a['rmse']:.3f} vs {b['rmse']:.3f}"
        )
    print(f"written: {args.out} ({report['meta']['seconds']:.0f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; bad input is one line on stderr and exit code 2."""
    return exit_code(run, argv)


if __name__ == "__main__":
    sys.exit(main())
