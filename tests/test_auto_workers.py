"""model.auto.workers: the inner-CV fits spread over a process pool give the figures of one process."""

import numpy as np
import pytest
from support.settings import FAST, MAIN_INTERVALS

from llmrubric.config import model_file
from llmrubric.data.simulate import SHIFT_SOURCES, shift_systems, simulate
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.core import parallel_folds

SETTINGS = {**model_file("auto"), "ensemble": 1}
SETTINGS["auto"] = {**SETTINGS["auto"], **MAIN_INTERVALS, "folds": 3}


@pytest.mark.slow
def test_two_workers_fit_the_weights_and_predictions_of_one_process(rubric, monkeypatch):
    """The network's program split over two processes and the other candidates' folds beside it: the same weights
    (the stacking weights' optimiser amplifies the 1e-6 differences of the networks' float sums) and predictions."""
    tables = simulate(0, 90, 4, 2, rubric, systems=shift_systems(6, 0), sources=SHIFT_SOURCES)[0]
    train, test = tables.subset(tables.text_ids[:70]), tables.subset(tables.text_ids[70:])
    fit = lambda workers: AutoCalibrator(  # noqa: E731
        rubric, {**SETTINGS, "auto": {**SETTINGS["auto"], "workers": workers}}, FAST, seed=0
    ).fit(train)
    one = fit(1)
    monkeypatch.setattr(parallel_folds, "MIN_WORK", 0)  # these data are below the size from which a pool pays
    two = fit(2)
    assert one.decision_["workers"] == 1 and two.decision_["workers"] == 2
    assert one.weights_.keys() == two.weights_.keys()
    np.testing.assert_allclose(list(two.weights_.values()), list(one.weights_.values()), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(two.predict_proba(test), one.predict_proba(test), atol=1e-4)
    nll = {n: r["nll"] for n, r in one.table_.items() if "nll" in r}
    assert nll == pytest.approx({n: r["nll"] for n, r in two.table_.items() if "nll" in r}, abs=1e-5)
