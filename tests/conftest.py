"""Shared fixtures: the real rubric, the embedded simulated data and the shared LLM-Rubric release."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from support.xdist import several_workers

# `pytest -n N`: one thread for each worker and its children (set before torch and numpy load)
if several_workers():
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[_var] = "1"

import pytest
from support.paths import ROOT, SHARED

from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import load_tables

logging.getLogger("llmrubric").setLevel(logging.INFO)


def pytest_configure(config):
    """Under ``pytest -n N`` torch and the BLAS pools get one thread per worker: N workers share N cores
    (two threads each on two cores made every test of the other worker wait)."""
    if several_workers():
        from llmrubric.model.core.threads import single_threaded

        single_threaded()


SERVICES = ("llm", "llama_server", "postgres", "mlflow_server", "chromium")  # markers of pyproject.toml


def pytest_collection_modifyitems(items):
    """The modules with costly tests first (one starting a service, then one ``slow``; each module's tests kept
    together and in order, so its module fixtures are built once): ``pytest -n 2 --dist loadgroup`` hands the tests
    out in this order (its groups first, largest first), so the cheap ones fill the end and no worker waits alone
    on a long test there."""

    def cost_rank(item) -> int:
        marks = {mark.name for mark in item.iter_markers()}
        return 0 if marks.intersection(SERVICES) else 1 if "slow" in marks else 2

    rank: dict[Path, int] = {}
    for item in items:
        rank[item.path] = min(rank.get(item.path, 2), cost_rank(item))
    items.sort(key=lambda item: rank[item.path])


@pytest.fixture(autouse=True)
def root_log_handlers():
    """Handlers a test adds to the root logger (``llmrubric.cli.main`` calls ``logging.basicConfig``
    with the test's captured stderr) leave with the test, so no later test logs into a closed stream."""
    root = logging.getLogger()
    before = list(root.handlers)
    yield
    for handler in set(root.handlers) - set(before):
        root.removeHandler(handler)


@pytest.fixture(scope="session", autouse=True)
def mlflow_store(tmp_path_factory):
    """Runs of the test session (and their subprocesses) log to a temporary MLflow store, never the project's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlruns.db'}")
        yield os.environ["MLFLOW_TRACKING_URI"]


@pytest.fixture(scope="session")
def rubric() -> Rubric:
    return Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")


@pytest.fixture(scope="session")
def simulated(rubric):
    d = ROOT / "data" / "simulated"
    return load_tables(d / "annotations.csv", d / "features.csv", rubric, d / "texts.csv")


@pytest.fixture(scope="session")
def search_data():
    """What the search tests train on (``support.search.search_tables``)."""
    from support.search import search_tables

    return search_tables()


@pytest.fixture(scope="session")
def shared_root() -> Path:
    if not (SHARED / "SHA256SUMS").is_file():
        pytest.skip(f"shared LLM-Rubric data not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def llm_rubric_data(shared_root, rubric):
    from llmrubric.data import llm_rubric

    return llm_rubric.load(shared_root, "synthetic", rubric), llm_rubric.load(shared_root, "real", rubric)


@pytest.fixture(scope="session")
def tok():
    """A tiny BPE tokenizer built locally (no download)."""
    from support.tiny_models import make_tokenizer

    return make_tokenizer()


@pytest.fixture(scope="session")
def llama(tok):
    """A tiny Llama-style causal LM built from a config."""
    from support.tiny_models import make_llama

    return make_llama(tok, max_positions=2048)


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (GGUF de-quantised to float32): (model, tokenizer), converted once into the
    transformers backend's ``gguf_cache`` as ``llmrubric extract`` loads it (the tests of this group compare its
    tokens and answers with llama.cpp's)."""
    import torch

    from llmrubric.config import load_file
    from llmrubric.extract import models

    path = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make setup` (llmrubric models fetch smollm2 models)")
    cache = load_file(ROOT / "conf" / "extract" / "transformers.yaml")["gguf_cache"]
    return models.load(models.resolve(path), torch.float32, cache)
