"""Scoring new texts: judge-free aggregates, masks, chunking, streaming, bad input."""

import numpy as np
import pandas as pd
import pytest
from support.settings import FAST

from llmrubric.cli import main
from llmrubric.data.splits import holdout_texts
from llmrubric.io.errors import InputError
from llmrubric.io.tables import Tables
from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.scoring.ranks import by_score
from llmrubric.scoring.scores import score_texts

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("scoring")


@pytest.fixture(scope="module")
def split(simulated):
    train, test = holdout_texts(simulated.text_ids, 0.1, seed=1)
    return simulated.subset(train), simulated.subset(test)


@pytest.fixture(scope="module")
def model(rubric, split):
    return NetworkCalibrator(rubric, trainer=FAST, seed=0).fit(split[0])


def _reference(model, test, judges, questions=None):
    pairs = pd.DataFrame(
        {"text_id": np.repeat(test.text_ids, len(judges)), "judge_id": np.tile(judges, len(test.text_ids))}
    )
    empty = pd.DataFrame(columns=["text_id", "judge_id", "question_id", "answer"])
    return model.predict(Tables(empty, test.features), pairs, questions)


@pytest.mark.slow
def test_judge_free_scores_match_the_public_predictions(model, split):
    test = split[1]
    judges = ["J01", "J03", "J07"]
    result = score_texts(model, test.features, test.texts, judges=judges, quantile=0.5, keep_predictions=True)
    ref = _reference(model, test, judges)
    means = ref.pivot_table(index=["question_id", "text_id"], columns="judge_id", values="mean")
    scores = result.scores.set_index(["question_id", "text_id"]).loc[means.index]
    assert np.allclose(scores["mean"], means.mean(axis=1), atol=1e-5)
    assert np.allclose(scores["max"], means.max(axis=1), atol=1e-5)
    assert np.allclose(scores["quantile"], means.median(axis=1), atol=1e-5)
    assert (result.scores.system_id == result.scores.text_id.map(test.texts.set_index("text_id").system_id)).all()
    assert result.summary["fast_path"] and result.summary["pairs"] == len(test.text_ids) * 3
    p = result.predictions.merge(ref, on=["text_id", "judge_id", "question_id"], suffixes=("", "_ref"))
    assert len(p) == len(ref) and np.allclose(p["p_1"], p["p_1_ref"], atol=1e-5)


@pytest.mark.slow
def test_an_ensemble_with_judge_input_personalization_scores_on_the_fast_path(rubric, split):
    train, test = split
    model = NetworkCalibrator(
        rubric,
        {"personalize": "input", "inputs": "expected", "input_dropout": 0.2, "ensemble": 2},
        trainer=FAST,
        seed=0,
    ).fit(train)
    judges = ["J02", "J05"]
    result = score_texts(model, test.features, test.texts, judges=judges, keep_predictions=True)
    ref = _reference(model, test, judges)
    assert result.summary["fast_path"]
    p = result.predictions.merge(ref, on=["text_id", "judge_id", "question_id"], suffixes=("", "_ref"))
    assert len(p) == len(ref) and np.allclose(
        p[["p_1", "p_2", "mean"]], p[["p_1_ref", "p_2_ref", "mean_ref"]], atol=1e-5
    )


@pytest.mark.slow
def test_missing_blocks_are_masked_and_flagged_and_featureless_texts_are_not_scored(model, split):
    test = split[1]
    masked_text, dropped_text = test.text_ids[0], test.text_ids[1]
    feats = test.features[~((test.features.text_id == masked_text) & test.features.question_id.isin(["Q3", "Q4"]))]
    feats = feats[feats.text_id != dropped_text]
    feats.attrs["source"] = "features.csv"
    result = score_texts(model, feats, test.texts, judges=["J02"], chunk_texts=1)
    q0 = result.scores[result.scores.question_id == "Q0"].set_index("text_id")
    assert q0.at[masked_text, "status"] == "masked"
    assert q0.at[masked_text, "missing_blocks"] == "simulated-llm/Q3;simulated-llm/Q4"
    assert q0.at[dropped_text, "status"] == "no_features" and np.isnan(q0.at[dropped_text, "mean"])
    assert (q0.drop([masked_text, dropped_text]).status == "ok").all()
    kept = test.subset([t for t in test.text_ids if t != dropped_text])
    ref = _reference(model, Tables(kept.annotations, feats), ["J02"], ["Q0"]).set_index("text_id")
    assert q0.at[masked_text, "mean"] == pytest.approx(ref.at[masked_text, "mean"], abs=1e-5)
    full = score_texts(model, test.features, test.texts, judges=["J02"]).scores.set_index(["question_id", "text_id"])
    assert abs(full.at[("Q0", masked_text), "mean"] - q0.at[masked_text, "mean"]) > 1e-4


@pytest.mark.slow
def test_chunks_and_streamed_predictions_agree(model, split, tmp_path):
    test = split[1]
    one = score_texts(model, test.features, test.texts, chunk_texts=4, predictions_out=tmp_path / "pred.parquet")
    whole = score_texts(model, test.features, test.texts, chunk_texts=10_000)
    pd.testing.assert_frame_equal(one.scores, whole.scores)
    pred = pd.read_parquet(tmp_path / "pred.parquet")
    assert len(pred) == len(test.text_ids) * len(model.judges_.judges) * len(model.rubric.ids)
    assert not pred.duplicated(["text_id", "judge_id", "question_id"]).any()


@pytest.mark.slow
def test_a_fast_path_that_disagrees_falls_back_to_the_public_predictions(model, split, monkeypatch):
    import llmrubric.scoring.scores as scoring

    test = split[1]
    good = score_texts(model, test.features, test.texts, judges=["J04", "J05"], questions=["Q0"])
    wrong = lambda calibrator, judges: lambda x: np.full((len(x), len(judges), len(calibrator.rubric.ids), 4), 0.25)
    monkeypatch.setattr(scoring, "_judge_predictor", wrong)
    fallback = score_texts(model, test.features, test.texts, judges=["J04", "J05"], questions=["Q0"], chunk_texts=3)
    assert not fallback.summary["fast_path"] and good.summary["fast_path"]
    assert np.allclose(fallback.scores["mean"], good.scores["mean"], atol=1e-5)


def test_bad_input_is_an_error_and_writes_nothing(model, split, tmp_path):
    test = split[1]
    with pytest.raises(InputError, match="not in the checkpoint"):
        score_texts(model, test.features, judges=["J01", "nobody"])
    with pytest.raises(InputError, match="quantile"):
        score_texts(model, test.features, quantile=1.5)
    with pytest.raises(InputError, match="Q99"):
        score_texts(model, test.features, questions=["Q99"])
    bad = test.features.assign(source="other-llm")
    bad.attrs["source"] = "new.csv"
    with pytest.raises(InputError, match="share no block") as info:
        score_texts(model, bad, predictions_out=tmp_path / "pred.csv")
    assert info.value.file == "new.csv" and not (tmp_path / "pred.csv").exists()
    with pytest.raises(InputError, match="table format"):
        score_texts(model, test.features, predictions_out=tmp_path / "pred.xls")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_score_command(model, split, tmp_path):
    test = split[1]
    checkpoint = model.save(tmp_path / "model.safetensors")
    test.features.to_csv(tmp_path / "features.csv", index=False)
    test.texts.to_csv(tmp_path / "texts.csv", index=False)
    code = main(
        [
            "score",
            "texts",
            str(checkpoint),
            str(tmp_path / "features.csv"),
            "--texts",
            str(tmp_path / "texts.csv"),
            "--out",
            str(tmp_path / "scores.csv"),
            "--predictions",
            str(tmp_path / "pred.csv"),
            "--trusted-judges",
            "J01",
            "J02",
            "--questions",
            "Q0",
            "--no-progress",
        ]
    )
    assert code == 0
    scores = pd.read_csv(tmp_path / "scores.csv")
    assert len(scores) == len(test.text_ids) and set(scores.columns) >= {"mean", "max", "quantile", "status"}
    assert len(pd.read_csv(tmp_path / "pred.csv")) == 2 * len(test.text_ids)
    assert (
        main(
            [
                "score",
                "texts",
                str(checkpoint),
                str(tmp_path / "features.csv"),
                "--out",
                str(tmp_path / "x.csv"),
                "--trusted-judges",
                "ghost",
            ]
        )
        == 2
    )
    assert not (tmp_path / "x.csv").exists()


def test_scores_equal_to_nine_decimals_share_a_rank_and_the_rest_keep_their_order():
    """New systems whose levels are equal get text scores equal up to float noise (the 11th decimal): one rank."""
    board = pd.DataFrame(
        {"system": ["c", "a", "b", "d", "e"], "score": [2.83323550974, 2.83323550980, 2.83323550975, 3.0, 2.8332346]}
    )
    out = by_score(board, "score")
    assert out.system.tolist() == ["d", "a", "b", "c", "e"]
    assert out["rank"].tolist() == [1.0, 3.0, 3.0, 3.0, 5.0]
