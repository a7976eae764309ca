"""benchmarks/ir_real.py: its folds, methods and figures on 3 queries of the shared LLMJudge test split."""

import dataclasses
import gzip
import sys

import numpy as np
import pandas as pd
import pytest
from support.paths import ROOT

from llmrubric.extract.summaries import summarise
from llmrubric.ir.autograder import read_qrels
from llmrubric.ir.judgments import add_qrels
from llmrubric.ir.workbench import read_workbench

sys.path.insert(0, str(ROOT / "benchmarks"))
import ir_real as bench  # noqa: E402

LLMJUDGE = ROOT.parent / "shared" / "data" / "llmjudge-test"


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """The first 3 queries of the shared file, as ``llmrubric import workbench --summaries`` reads them."""
    if not (LLMJUDGE / "rubric-grades.jsonl.gz").is_file():
        pytest.skip(f"shared LLMJudge data not found at {LLMJUDGE}")
    path = tmp_path_factory.mktemp("ir_real") / "three.jsonl.gz"
    with gzip.open(LLMJUDGE / "rubric-grades.jsonl.gz", "rt") as lines:
        head = [next(lines) for _ in range(3)]
    with gzip.open(path, "wt") as out:
        out.writelines(head)
    got = read_workbench(path)
    annotations, _ = add_qrels(got.annotations, got.texts, read_qrels(LLMJUDGE / "qrels.txt"), "assessor", "relevance")
    return bench.assemble(got.features, summarise(got.features, "self_rating"), got.texts, annotations)


@pytest.mark.slow
def test_the_split_has_one_row_per_passage_with_its_assessor_label(split):
    assert len(set(split.tables.texts.system_id)) == 3
    assert len(split.y) == len(split.text_ids) == split.summary.shape[0] == split.grades.shape[0]
    assert set(split.y) <= {0, 1, 2, 3} and len(set(split.y)) > 1
    assert np.all((split.second_best >= 0) & (split.second_best <= 5))
    assert np.all((split.mean_rating >= 0) & (split.mean_rating <= 5))


@pytest.mark.slow
def test_leave_one_query_out_holds_out_each_query_whole(split):
    folds = bench.outer_folds(split, "leave_one_query_out", 0)
    queries = split.tables.texts.set_index("text_id").system_id.reindex(split.text_ids).to_numpy()
    assert sorted(set(folds)) == [0, 1, 2]
    for k in range(3):
        assert len(set(queries[folds == k])) == 1 and set(queries[folds == k]).isdisjoint(queries[folds != k])


@pytest.mark.slow
def test_label_frequencies_in_sample_nll_is_the_labels_entropy(split):
    everything = np.arange(len(split.y))
    probs, labels = bench.label_frequencies(split, everything, everything, 0)
    counts = np.bincount(split.y, minlength=4)
    p = counts[counts > 0] / len(split.y)
    by_hand = -np.sum(p * np.log(p))
    got = bench.figures(split.y, probs, labels, ranks=False)
    assert labels is None and got["pair_nll"] == pytest.approx(by_hand) == pytest.approx(bench.entropy(split.y))
    assert got["kappa"] == 0 and got["spearman"] is None


@pytest.mark.slow
def test_every_cheap_method_sees_only_its_training_queries(split, monkeypatch):
    """Each fit ``run_cheap`` makes gets one held-out query and the training rows of the others only, and
    its predictions are the same when every held-out label is changed (it never reads them)."""
    folds = bench.outer_folds(split, "leave_one_query_out", 0)
    queries = split.tables.texts.set_index("text_id").system_id.reindex(split.text_ids).to_numpy()
    everything = np.arange(len(split.y))
    for name, fit in list(bench.CHEAP.items()):
        calls = []

        def spy(data, train, test, seed, fit=fit, calls=calls):
            calls.append((train, test))
            flipped = dataclasses.replace(data, y=data.y.copy())
            flipped.y[test] = 3 - data.y[test]  # every held-out label changed
            got = fit(data, train, test, seed)
            for ours, blind in zip(got, fit(flipped, train, test, seed)):
                assert (ours is None and blind is None) or np.array_equal(ours, blind), name
            return got

        monkeypatch.setitem(bench.CHEAP, name, spy)
        got = bench.run_cheap(name, split, folds, [0, 1, 2], 0)
        assert len(calls) == 3 and {queries[test][0] for _, test in calls} == set(queries)
        for train, test in calls:
            assert len(set(queries[test])) == 1 and set(queries[train]).isdisjoint(queries[test])
            assert np.array_equal(np.sort(np.concatenate([train, test])), everything)
        assert got["folds_run"] == [0, 1, 2] and got["n"] == len(split.y)
        assert -1 <= got["kappa"] <= 1 and sum(f["n"] for f in got["per_fold"].values()) == len(split.y)
        if name != "heuristic_rule":
            assert 0 < got["pair_nll"] < 5
        if name == "multinomial_lr":
            assert got["spearman"] > 0  # the summaries rank passages better than chance on these queries


def test_the_heuristic_rule_is_its_definition():
    second = np.array([5, 4.5, 4, 3.99, 0, 5])
    assert bench.rule_labels(second).tolist() == [3, 1, 1, 0, 0, 3]
    ratings = pd.DataFrame(
        {
            "text_id": ["a"] * 3 + ["b"] * 3,
            "source": [bench.QUESTION] * 6,
            "question_id": [f"self_rating:{i}" for i in "xyzxyz"],
            "v": [5, 4, 1, 5, 5, 0],
        }
    )
    best = bench._sorted_ratings(ratings, bench.QUESTION, ["a", "b"], 4)
    assert best.tolist() == [[5, 4, 1, -1], [5, 5, 0, -1]]
    assert bench.rule_labels(best[:, 1]).tolist() == [1, 3]


def test_figures_are_the_textbook_ones_on_a_constructed_case():
    y = np.array([0, 1, 2, 3, 0, 1])
    probs = np.full((6, 4), 0.1)
    probs[np.arange(6), [0, 1, 2, 3, 1, 1]] = 0.7
    got = bench.figures(y, probs, None)
    assert got["pair_nll"] == pytest.approx(-(5 * np.log(0.7) + np.log(0.1)) / 6)
    # labels 0,1,2,3,1,1: 5 of 6 agree; expected agreement from the marginals (2,2,1,1) and (1,3,1,1)
    pe = (2 * 1 + 2 * 3 + 1 * 1 + 1 * 1) / 36
    assert got["kappa"] == pytest.approx((5 / 6 - pe) / (1 - pe))
    assert got["qwk"] > got["kappa"]  # the one miss is one step off
    assert bench.figures(y, None, y)["kappa"] == 1 and bench.figures(y, None, y)["pair_nll"] is None


def test_predictions_give_probabilities_and_the_label_column_when_written():
    predictions = pd.DataFrame(
        {
            "text_id": ["b", "a"],
            "question_id": "relevance",
            **{f"p_{k}": [0.1, 0.4, 0.3, 0.2][k : k + 1] * 2 for k in range(4)},
        }
    )
    probs, labels, source = bench.held_out(predictions, ["a", "b"])
    assert probs.shape == (2, 4) and labels is None and source == "argmax"
    probs, labels, source = bench.held_out(predictions.assign(label=[2, 3]), ["a", "b"])
    assert labels.tolist() == [3, 2] and source == "label column"


def test_a_run_with_overrides_is_kept_beside_the_default():
    assert bench.result_key("llm_rubric", []) == "llm_rubric"
    assert bench.result_key("llm_rubric", ["model.auto.rule=stack"]) == "llm_rubric[model.auto.rule=stack]"
    assert bench.result_key("mean_rating_lr", ["model.auto.rule=stack"]) == "mean_rating_lr"
