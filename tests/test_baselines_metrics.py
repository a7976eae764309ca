import numpy as np
import pandas as pd
import pytest
from support.settings import FAST

from llmrubric.evaluation.metrics import evaluate, nll, point_metrics, seed_sd
from llmrubric.io.errors import InputError
from llmrubric.model.families.baselines import make_method, report_methods


def test_point_metrics_against_hand_computation():
    y, yhat = np.array([1, 2, 3, 4]), np.array([1.5, 2.0, 2.5, 4.5])
    m = point_metrics(y, yhat)
    assert m["rmse"] == pytest.approx(np.sqrt((0.25 + 0 + 0.25 + 0.25) / 4))
    assert m["pearson"] == pytest.approx(np.corrcoef(y, yhat)[0, 1])
    assert m["spearman"] == pytest.approx(1.0) and m["kendall"] == pytest.approx(1.0)
    assert np.isnan(point_metrics(y, np.ones(4))["pearson"])
    assert nll(np.array([[0.5, 0.5], [0.25, 0.75]]), np.array([0, 1])) == pytest.approx(
        -(np.log(0.5) + np.log(0.75)) / 2
    )


def test_llm_baselines_match_the_reference_values_on_real(llm_rubric_data, rubric):
    synthetic, real = llm_rubric_data
    expected = {"expected_llm": (0.919, 0.177, 0.087, 0.066), "argmax_llm": (1.202, 0.140, 0.087, 0.081)}
    for name, values in expected.items():
        m = evaluate(make_method(name, rubric).fit(synthetic).predict(real), real.annotations, rubric.main)
        assert m["n"] == 223
        assert tuple(round(m[k], 3) for k in ("rmse", "pearson", "spearman", "kendall")) == values


@pytest.mark.slow
def test_ridge_and_constant_on_real(llm_rubric_data, rubric):
    synthetic, real = llm_rubric_data
    ridge = evaluate(make_method("ridge_judge", rubric).fit(synthetic).predict(real), real.annotations, rubric.main)
    assert ridge["pearson"] == pytest.approx(0.264, abs=0.002)
    const = make_method("constant", rubric).fit(synthetic)
    q0 = synthetic.annotations[synthetic.annotations.question_id == "Q0"].answer.astype(float)
    assert const.predict(real)["mean"].iloc[0] == pytest.approx(q0.mean(), abs=1e-3)


@pytest.mark.slow
def test_every_method_predicts_the_main_question(simulated, rubric):
    for name in report_methods():
        method = make_method(name, rubric, seed=1, trainer=FAST)
        pred = method.fit(simulated).predict(simulated)
        q0 = pred[pred.question_id == "Q0"]
        assert len(q0) == 900 and np.isfinite(q0["mean"]).all()
        assert np.allclose(q0[["p_1", "p_2", "p_3", "p_4"]].sum(axis=1), 1)
    with pytest.raises(InputError, match="unknown model family or method 'orcale'; known: .*'oracle'"):
        make_method("orcale", rubric)


def test_evaluate_rejects_missing_or_non_finite_predictions(simulated, rubric):
    pred = make_method("expected_llm", rubric).predict(simulated)
    with pytest.raises(InputError, match="have no prediction"):
        evaluate(pred.iloc[1:], simulated.annotations, rubric.main)
    with pytest.raises(InputError, match="non-finite"):
        evaluate(pred.assign(mean=np.nan), simulated.annotations, rubric.main)


def with_second_source(tables):
    """``tables`` plus a second LLM source whose every block is the first source's, reversed."""
    from llmrubric.io.tables import Tables

    features = tables.features
    other = features.assign(source="other")
    other["prob"] = other.groupby(["text_id", "question_id"]).prob.transform(lambda p: p.to_numpy()[::-1])
    return Tables(tables.annotations, pd.concat([features, other], ignore_index=True), tables.texts)


@pytest.mark.slow
def test_llm_baselines_with_several_sources(simulated, rubric):
    from llmrubric.model.families.baselines import expand_baselines

    both = with_second_source(simulated)
    names, skipped = expand_baselines(["expected_llm", "argmax_llm", "constant", "ridge_judge"], rubric, both.features)
    assert (
        names
        == [
            "expected_llm/other",
            "expected_llm/simulated-llm",
            "expected_llm",
            "argmax_llm/other",
            "argmax_llm/simulated-llm",
            "argmax_llm",
            "constant",
            "ridge_judge",
        ]
        and not skipped
    )
    mean = {n: make_method(n, rubric).predict(both)["mean"].to_numpy() for n in names[:3]}
    single = make_method("expected_llm", rubric).predict(simulated)["mean"].to_numpy()
    assert np.allclose(mean["expected_llm/simulated-llm"], single)
    assert not np.allclose(mean["expected_llm/other"], single)
    assert np.allclose(mean["expected_llm"], (mean["expected_llm/other"] + mean["expected_llm/simulated-llm"]) / 2)
    argmax = make_method("argmax_llm/other", rubric).predict(both)
    assert set(argmax["mean"]) <= {1.0, 2.0, 3.0, 4.0}
    ridge = make_method("ridge_judge", rubric).fit(both)
    assert len(ridge.layout_.blocks) == 18 and np.isfinite(ridge.predict(both)["mean"]).all()
    with pytest.raises(InputError, match="source 'missing'"):
        make_method("expected_llm/missing", rubric).predict(both)


def test_seed_sd_is_the_sample_standard_deviation():
    assert seed_sd([1.0, 2.0, 3.0]) == pytest.approx(1.0)  # ddof=1 (ddof=0 would give 0.816)
    assert np.isnan(seed_sd([0.5]))
