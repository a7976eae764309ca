"""Every registered model family fits on a small table (three of the rubric's questions), saves, loads with
``load_model`` and predicts the same; a family added as one module in ``llmrubric/model/families/`` that registers itself
is a candidate of ``model=auto`` and a method of ``evaluate.py`` with no other edit."""

from __future__ import annotations

import importlib
import inspect
import logging
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.settings import FAST, MAIN_INTERVALS

from llmrubric.config import model_file
from llmrubric.io.errors import InputError
from llmrubric.io.predictions import predictions_frame
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.core import registry
from llmrubric.model.core.checkpoints import load_model, read_checkpoint, save_model, write_checkpoint
from llmrubric.model.core.encoding import pairs_of
from llmrubric.model.families.baselines import expand_baselines, make_method, questions_proba

SMALL_AUTO = {**model_file("auto"), "ensemble": 1, "auto": {**model_file("auto")["auto"], "folds": 2, **MAIN_INTERVALS}}
SMALL_AUTO["auto"]["candidates"] = ["network", "ridge_judge"]


# The main question, one asked only of texts with references (applicable_if) and one of three options read from the
# LLM's four (llm_options): each family fits every question of the rubric, so three questions, not nine, each a kind
QUESTIONS = ("Q0", "Q2", "Q8")


@pytest.fixture(scope="module")
def small_rubric(rubric) -> Rubric:
    """The rubric's questions :data:`QUESTIONS`, the main one first."""
    data = rubric.to_dict()
    data["questions"] = [q for q in data["questions"] if q["id"] in QUESTIONS]
    return Rubric.from_dict(data)


@pytest.fixture(scope="module")
def small(simulated, small_rubric):
    """60 texts of the simulated data, their answers and LLM features of :data:`QUESTIONS`: 45 to fit on, 15 to
    predict."""
    assert small_rubric.ids == list(QUESTIONS)
    keep = lambda table: table[table.question_id.isin(QUESTIONS)].reset_index(drop=True)
    tables = Tables(keep(simulated.annotations), keep(simulated.features), simulated.texts)
    texts = tables.text_ids[:60]
    return tables.subset(texts[:45]), tables.subset(texts[45:])


def settings(name: str) -> dict:
    """Small settings: one network per ensemble, model=auto with two candidates, two inner folds and the main
    question's intervals only."""
    return SMALL_AUTO if name == "auto" else {"ensemble": 1}


def round_trip(name: str, rubric, small, tmp_path) -> None:
    """Fit, save, load with load_model: the same class, distributions and predictions table."""
    train, test = small
    model = registry.make(name, rubric, settings(name), FAST, seed=0)
    assert isinstance(model, registry.Family)  # the protocol's methods and FORMAT
    model = model.fit(train)
    loaded = load_model(save_model(model, tmp_path / f"{name}.safetensors"))
    assert type(loaded) is type(model)
    before, after = model.predict_proba(test), loaded.predict_proba(test)
    width = max(len(q.options) for q in rubric.questions)
    assert before.shape == (len(pairs_of(test.annotations)), len(rubric.questions), width)
    assert np.isfinite(before[:, rubric.ids.index(rubric.main.id), :]).all()
    np.testing.assert_array_equal(after, before)
    pd.testing.assert_frame_equal(loaded.predict(test), model.predict(test))


SLOW = ("ordinal", "combined")  # conf/model/<name>.yaml: five members fitted one after another


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in registry.names()]
)
def test_every_family_fits_saves_loads_and_predicts_the_same(name, small_rubric, small, tmp_path):
    round_trip(name, small_rubric, small, tmp_path)


class Prior:
    """A family in one module: each question's training marginal, whatever the text and judge."""

    FORMAT = "llmrubric-test_prior/1"

    def __init__(self, rubric, seed: int = 0):
        self.rubric = rubric

    def get_params(self):
        return {}

    def set_params(self, **params):
        return self

    def fit(self, tables):
        answers = tables.annotations
        self.marginals_ = {}
        for q in self.rubric.questions:
            counts = answers[answers.question_id == q.id].answer.value_counts().reindex(q.keys, fill_value=0)
            self.marginals_[q.id] = (counts.to_numpy(float) + 1) / (counts.sum() + len(q.keys))
        return self

    def predict_proba(self, tables, pairs=None):
        pairs = pairs_of(tables.annotations) if pairs is None else pairs
        return questions_proba(
            self.rubric, {q: np.tile(p, (len(pairs), 1)) for q, p in self.marginals_.items()}, len(pairs)
        )

    def predict(self, tables, pairs=None):
        pairs = pairs_of(tables.annotations) if pairs is None else pairs.reset_index(drop=True)
        return predictions_frame(pairs, self.rubric.questions, self.predict_proba(tables, pairs))

    def state(self):
        return {"format": self.FORMAT}, {q: torch.from_numpy(p) for q, p in self.marginals_.items()}

    @classmethod
    def from_state(cls, rubric, meta, tensors, source="<checkpoint>"):
        self = cls(rubric)
        self.marginals_ = {q.id: tensors[q.id].numpy() for q in rubric.questions}
        return self


@pytest.fixture
def prior_registered(monkeypatch):
    """``Prior`` registered as a candidate, as its module would (undone after the test)."""
    monkeypatch.setattr(registry, "_CLASSES", dict(registry._CLASSES))
    monkeypatch.setattr(registry, "_FORMATS", dict(registry._FORMATS))
    monkeypatch.setattr(registry, "_NAMES", None)
    registry.register("test_prior", lambda rubric, setup: Prior(rubric, setup.seed), Prior, candidate=True)


@pytest.mark.slow
def test_a_new_family_is_an_auto_candidate_an_evaluate_method_and_round_trips(
    prior_registered, small_rubric, small, tmp_path
):
    rubric, (train, test) = small_rubric, small
    assert "test_prior" in registry.names(candidate=True)
    round_trip("test_prior", rubric, small, tmp_path)
    assert isinstance(make_method("test_prior", rubric), Prior)
    assert expand_baselines(["test_prior"], rubric, train.features) == (["test_prior"], {})
    chosen = {"candidates": ["test_prior", "ridge_judge"], "level_min_systems": 3}
    auto = AutoCalibrator(rubric, {**SMALL_AUTO, "auto": {**SMALL_AUTO["auto"], **chosen}}, FAST).fit(train)
    assert auto.level_record_["compared"], auto.level_record_  # 4 training systems: each also with a level
    assert set(auto.table_) == {f"{n}{s}" for n in ("test_prior", "ridge_judge") for s in ("", "-level", "-beyond")}
    assert auto.table_["test_prior"]["nll"] > 0
    auto.weights_ = {"test_prior": 1.0}  # the member loads through the registry whatever the inner CV chose
    auto.members_ = {"test_prior": Prior(rubric).fit(train)}
    loaded = load_model(save_model(auto, tmp_path / "auto.safetensors"))
    np.testing.assert_array_equal(loaded.predict_proba(test), auto.predict_proba(test))


def test_a_misspelt_candidate_names_the_setting_and_lists_the_registry(rubric):
    wrong = {**SMALL_AUTO, "auto": {**SMALL_AUTO["auto"], "candidates": ["network", "clmm_owm"]}}
    with pytest.raises(InputError, match=r"model\.auto\.candidates.*clmm_owm.*known: .*clmm_own") as error:
        AutoCalibrator(rubric, wrong, FAST)
    assert "\n" not in str(error.value)


def test_an_unknown_family_version_or_missing_key_is_one_error_naming_the_file(small_rubric, small, tmp_path):
    rubric = small_rubric
    model = registry.make("constant", rubric).fit(small[0])
    meta, tensors = model.state()
    meta = {**meta, "rubric": rubric.to_dict(), "main_question": rubric.main.id}
    cases = {
        "family": ({**meta, "format": "llmrubric-unheard_of/1"}, tensors, "unknown model family"),
        "version": ({**meta, "format": "llmrubric-constant/9"}, tensors, "retrain"),
        "key": (meta, {}, "lacks 'marginal_'"),
    }
    for case, (bad_meta, bad_tensors, message) in cases.items():
        path = write_checkpoint(tmp_path / f"{case}.safetensors", bad_meta, bad_tensors)
        with pytest.raises(InputError, match=message) as error:
            load_model(path)
        assert str(path) in str(error.value) and "\n" not in str(error.value)
    assert read_checkpoint(save_model(model, tmp_path / "ok.safetensors"))[0]["format"] == "llmrubric-constant/1"


def test_a_baseline_under_a_second_name_is_listed_once(rubric, simulated):
    methods, skipped = expand_baselines(["expected_llm", "mean_of_sources", "constant"], rubric, simulated.features)
    assert methods == ["expected_llm", "constant"] and not skipped
    assert expand_baselines(["mean_of_sources"], rubric, simulated.features)[0] == ["mean_of_sources"]


@pytest.mark.slow
def test_a_candidate_equal_to_another_is_not_applicable_not_a_failure(small_rubric, small, caplog):
    """One LLM source per question: clmm_mean is clmm_own, recorded as not applicable at info level."""
    settings = {**SMALL_AUTO, "auto": {**SMALL_AUTO["auto"], "candidates": ["clmm_own", "clmm_mean"]}}
    with caplog.at_level(logging.INFO, logger="llmrubric"):
        auto = AutoCalibrator(small_rubric, settings, FAST).fit(small[0])
    row = auto.table_["clmm_mean"]
    assert row["not_applicable"].startswith("identical to clmm_own") and "error" not in row
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r for r in caplog.records if "clmm_mean not applicable" in r.getMessage() and r.levelno == logging.INFO]


@contextmanager
def imported_from(folder: Path, package: str = "llmrubric"):
    """``package`` imported afresh from ``folder``, as a new process started there imports it: ``folder`` first on
    ``sys.path`` and this process's modules of ``package`` set aside (put back on leaving, the copy's dropped), so the
    test costs no second start-up of torch."""
    ours = lambda name: name == package or name.startswith(f"{package}.")
    saved = {name: module for name, module in sys.modules.items() if ours(name)}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        for name in [name for name in sys.modules if ours(name)]:
            del sys.modules[name]
        sys.modules.update(saved)
        importlib.invalidate_caches()


@pytest.mark.slow
def test_a_module_dropped_in_the_families_folder_is_registered(tmp_path):
    """A new family is one module in ``llmrubric/model/families/``: in a copy of the package with ``Prior``'s
    module dropped there, imported afresh (:func:`imported_from`), the registry lists it as a candidate, with no
    other file edited; this process's own package, put back, does not."""
    package = Path(registry.__file__).resolve().parents[2]
    shutil.copytree(package, tmp_path / "llmrubric", ignore=shutil.ignore_patterns("__pycache__"))
    module = "\n".join(
        [
            "import numpy as np",
            "import torch",
            "from llmrubric.io.predictions import predictions_frame",
            "from llmrubric.model.families.baselines import questions_proba",
            "from llmrubric.model.core.encoding import pairs_of",
            "from llmrubric.model.core.registry import register",
            inspect.getsource(Prior),
            "register('dropped_prior', lambda rubric, setup: Prior(rubric, setup.seed), Prior, candidate=True)",
        ]
    )
    (tmp_path / "llmrubric" / "model" / "families" / "dropped_prior.py").write_text(module)
    with imported_from(tmp_path):
        copy = importlib.import_module("llmrubric.model.core.registry")
        entry = copy.entry("dropped_prior")
        where, family_file = Path(copy.__file__), Path(inspect.getfile(entry.family))
        found = (entry.candidate, entry.family.__module__, "dropped_prior" in copy.names(candidate=True))
    assert copy is not registry and where.is_relative_to(tmp_path) and family_file.is_relative_to(tmp_path)
    assert found == (True, "llmrubric.model.families.dropped_prior", True)
    assert importlib.import_module("llmrubric.model.core.registry") is registry  # this process's package is back
    assert "dropped_prior" not in registry.names() and "llmrubric.model.families.dropped_prior" not in sys.modules
