"""Optuna on a real PostgreSQL server (started on 127.0.0.1 by the fixture): two workers (a process and the test's
own) and a third killed mid-trial share one study; the outcome equals the one-worker SQLite search."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from support.paths import ROOT
from support.postgres_server import PostgresServer, unavailable
from support.search import BASE, search_config

from llmrubric.experiments.search import create_study, finished_trials, run_search
from llmrubric.io.errors import InputError

N_TRIALS = 4

WORKER = """
import os, sys, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from test_scale_search import config
from support.search import BASE, search_tables
from llmrubric.io.rubric import Rubric
from llmrubric.experiments.search import run_search
rubric = Rubric.load({root!r} + "/conf/rubric/llm_rubric.yaml")
tables = search_tables()
if {stall}:  # the worker to kill stalls in its second trial, so that it dies mid-trial however fast trials run
    from llmrubric.model.core.registry import entry
    calls, train = [], entry("network").family.fit_many
    def stalling(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            open({go!r} + ".stalled", "w").close()  # its trial is running, with its configuration
            time.sleep(600)
        return train(*args, **kwargs)
    entry("network").family.fit_many = staticmethod(stalling)
while not os.path.exists({go!r}):  # imported; wait for the signal to start
    time.sleep(0.05)
run_search(rubric, tables, BASE, config({storage!r}), "shared", seed=0)
"""


def config(storage: str):
    """Random start-up trials only, one per batch, two folds, beating every second."""
    c = search_config(storage, N_TRIALS)
    c.batch, c.startup_trials, c.heartbeat_seconds, c.inner_folds = 1, N_TRIALS, 1, 2
    return c


@pytest.fixture(scope="module")
def postgres():
    reason = unavailable()
    if reason:
        pytest.skip(f"no PostgreSQL server can be started: {reason}")
    with PostgresServer() as server:
        yield server


def worker(storage: str, go: Path, stall: bool = False) -> subprocess.Popen:
    code = WORKER.format(root=str(ROOT), tests=str(ROOT / "tests"), storage=storage, go=str(go), stall=stall)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def outcome(study: optuna.Study) -> dict:
    """{configuration: held-out NLL} of the trials that count."""
    return {tuple(sorted(t.params.items())): t.value for t in finished_trials(study)}


@pytest.mark.postgres
def test_two_workers_and_a_killed_one_on_postgres_equal_the_sqlite_search(postgres, tmp_path, rubric, search_data):
    storage = postgres.create_database("shared")
    polled = optuna.storages.RDBStorage(storage)  # one storage for the test's reads (its pool closed after)
    (tmp_path / "go-first").touch()
    killed = worker(storage, tmp_path / "go-first", stall=True)
    other = worker(storage, tmp_path / "go")  # with this process, the two workers; they start once the first is killed
    try:
        stalled = tmp_path / "go-first.stalled"
        while not stalled.exists():  # however long a loaded machine takes to get there (pytest's timeout bounds it)
            assert killed.poll() is None, killed.communicate()[1][-2000:]
            time.sleep(0.1)
        killed.kill()
        assert killed.wait() != 0, "the worker finished before it could be killed"
        interrupted = [
            t
            for t in optuna.load_study(study_name="shared", storage=polled).trials
            if t.state == optuna.trial.TrialState.RUNNING
        ]
        assert len(interrupted) == 1
        (tmp_path / "go").touch()
        run_search(rubric, search_data, BASE, config(storage), "shared", seed=0)
        _, err = other.communicate(timeout=240)
    finally:
        for w in (killed, other):
            w.kill()
        polled.engine.dispose()
    assert other.returncode == 0, err[-2000:]
    shared = optuna.load_study(study_name="shared", storage=storage)
    numbers = [t.number for t in shared.trials]
    assert numbers == list(range(len(numbers))) and all(t.state.is_finished() for t in shared.trials)
    assert shared.trials[interrupted[0].number].state == optuna.trial.TrialState.FAIL
    [rerun] = [t for t in shared.trials if t.user_attrs.get("requeued_from") == interrupted[0].number]
    assert rerun.params == interrupted[0].params and rerun.state == optuna.trial.TrialState.COMPLETE
    assert len(finished_trials(shared)) == N_TRIALS  # none lost, none run twice
    _, alone = run_search(rubric, search_data, BASE, config(f"sqlite:///{tmp_path / 'alone.db'}"), "alone", seed=0)
    assert outcome(shared) == pytest.approx(outcome(alone), rel=1e-6)
    assert shared.best_trial.params == alone.best_trial.params


@pytest.mark.postgres
def test_unreachable_database_and_wrong_credentials_are_one_line_errors(postgres):
    postgres.create_database("creds")
    with pytest.raises(
        InputError,
        match=r"search.storage 'postgresql\+psycopg2://llmrubric:\*\*\*@127.0.0.1:\d+/creds' cannot be opened: .*password authentication failed",
    ) as e:
        create_study(config(postgres.url("creds", password="wrong")), "s")
    assert "wrong" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(
        InputError, match=r"search.storage .*127.0.0.1:1/x' cannot be opened: .*(refused|could not connect)"
    ):
        create_study(config("postgresql+psycopg2://llmrubric:pw@127.0.0.1:1/x"), "s")
    with pytest.raises(InputError, match="cannot be opened"):
        create_study(config("notadb://x"), "s")
