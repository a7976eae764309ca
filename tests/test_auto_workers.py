"""model.auto.workers: the inner-CV fits spread over a process pool give the figures of one process."""

import multiprocessing
import os
import sys
from concurrent.futures import Future, ProcessPoolExecutor

import numpy as np
import pytest
import torch
from support.settings import FAST, MAIN_INTERVALS

from llmrubric.config import model_file
from llmrubric.data.simulate import SHIFT_SOURCES, shift_systems, simulate
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.core import parallel_folds
from llmrubric.model.core.registry import fit_questions

SETTINGS = {**model_file("auto"), "ensemble": 1}
# the network (its program split over the workers) and a candidate fitted fold by fold; no level: what is checked
# is that the pool changes no fold model
SETTINGS["auto"] = {
    **SETTINGS["auto"],
    **MAIN_INTERVALS,
    "folds": 3,
    "candidates": ["network", "ridge_judge"],
    "system_level": "off",
}


def test_workers_are_one_on_small_data_in_another_pool_or_when_set_and_at_most_the_cpus():
    big = parallel_folds.MIN_WORK
    assert parallel_folds.pool_workers(2, big, 1) == min(2, os.cpu_count())
    assert parallel_folds.pool_workers(1, big, 1) == 1 and parallel_folds.pool_workers(2, big - 1, 1) == 1
    assert parallel_folds.pool_workers(10_000, big, 1) == len(os.sched_getaffinity(0))
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:  # a pool's worker
        assert pool.submit(parallel_folds.pool_workers, 2, big, 1).result() == 1
        assert pool.submit(parallel_folds.start_early, 2, big, 1).result() is False  # nor a forkserver there
    assert parallel_folds.start_early(1, big, 1) is False and parallel_folds.start_early(2, big - 1, 1) is False


def _modules_an_optimizer_imports() -> list[str]:
    before = set(sys.modules)
    torch.optim.Adam([torch.zeros(1, requires_grad=True)], fused=True)
    return sorted(set(sys.modules) - before)


def test_a_worker_started_from_the_forkserver_imports_nothing_when_its_first_optimizer_is_built():
    """The forkserver preloads what each new worker's first fit would import (torch._dynamo, by the first optimizer:
    0.7 s a worker, every fit), so that no worker pays it; where the platform has no forkserver, nothing to check."""
    if parallel_folds._start_method() != "forkserver":
        pytest.skip("no forkserver on this platform")
    context = multiprocessing.get_context("forkserver")
    parallel_folds._preload(context)
    with parallel_folds._without_main(), ProcessPoolExecutor(1, mp_context=context) as pool:
        assert pool.submit(_modules_an_optimizer_imports).result() == []


@pytest.mark.slow
def test_two_workers_fit_the_weights_and_predictions_of_one_process(rubric, monkeypatch):
    """The network's program split over two processes and the other candidates' fold models fitted beside it: the
    weights, inner-CV figures and predictions of one process (equal to every digit when measured; the tolerances
    leave room for another order of float sums in the smaller stacks)."""
    tables = simulate(0, 80, 4, 2, rubric, systems=shift_systems(6, 0), sources=SHIFT_SOURCES)[0]
    train, test = tables.subset(tables.text_ids[:60]), tables.subset(tables.text_ids[60:])
    fit = lambda workers: AutoCalibrator(  # noqa: E731
        rubric, {**SETTINGS, "auto": {**SETTINGS["auto"], "workers": workers}}, FAST, seed=0
    ).fit(train)
    one = fit(1)
    monkeypatch.setattr(parallel_folds, "MIN_WORK", 0)  # these data are below the size from which a pool pays
    assert parallel_folds.start_early(2, len(train.annotations), 2) is (len(os.sched_getaffinity(0)) > 1)
    two = fit(2)
    assert (one.decision_["workers"], one.decision_["worker_cpu_seconds"]) == (1, 0.0)
    assert two.decision_["workers"] == 2 and two.decision_["worker_cpu_seconds"] > 0
    # the other candidate refitted on all the data before the weights where the worker took it before this process
    # read the fold models (else after them): the same figures either way
    assert one.decision_["refitted_early"] == [] and set(two.decision_["refitted_early"]) <= {"ridge_judge"}
    assert one.weights_.keys() == two.weights_.keys()
    np.testing.assert_allclose(list(two.weights_.values()), list(one.weights_.values()), rtol=1e-6, atol=1e-9)
    nll = {n: r["nll"] for n, r in one.table_.items() if "nll" in r}
    assert nll == pytest.approx({n: r["nll"] for n, r in two.table_.items() if "nll" in r}, rel=1e-6)
    np.testing.assert_allclose(two.predict_proba(test), one.predict_proba(test), atol=1e-4)


def test_the_refits_a_worker_took_come_back_and_those_none_took_are_withdrawn(rubric, monkeypatch):
    """The refits on all the data before the weights: one a worker claimed comes back once it is fitted, after its
    share's results; one no worker had taken when they are collected is withdrawn (no worker starts it) and left to
    the fit after the weights; a collection without a pool has none."""
    tables = simulate(0, 40, 4, 2, rubric, systems=shift_systems(6, 0), sources=SHIFT_SOURCES)[0]
    auto = AutoCalibrator(rubric, SETTINGS, FAST, seed=0)
    alone = fit_questions(auto._candidate("ridge_judge"), tables)
    fits = parallel_folds.FoldFits([tables.subset(tables.text_ids[:20]), tables], rubric.main.id, 2)
    assert fits.collect_refits() == {}
    for name in ("ridge_judge", "clmm_own"):
        fits.add_refit(name, auto._candidate(name))
    fits.claims = multiprocessing.get_context("spawn").Array("b", [1, 0])  # a worker took the first
    worker = Future()
    worker.set_result({"ridge_judge": parallel_folds.Outcome([alone], None, 1.0, 2.5)})
    fits.refit_futures = [worker]
    refitted = fits.collect_refits()
    assert list(refitted) == ["ridge_judge"] and list(fits.claims) == [1, 1]
    assert refitted["ridge_judge"] is alone and fits.worker_cpu_seconds == 2.5
    monkeypatch.setitem(parallel_folds._WORKER, "claims", fits.claims)  # a worker asked now takes none
    assert parallel_folds._run_refits(list(enumerate(fits.refits.items()))) == {}
