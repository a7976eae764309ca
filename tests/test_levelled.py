"""The system level as a wrapper around any model (issue 48): ``Levelled(base)`` fits, saves, loads and scores
like any model, ``model=auto`` combines its parts by member and level (never by a name's suffix), and the
wrapper around one name per class keeps the base's other questions and moves only the main one."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from support.settings import FAST, MAIN_INTERVALS

import llmrubric.model  # noqa: F401  (registers every class)
from llmrubric import Levelled, make_model
from llmrubric.config import model_file
from llmrubric.data.simulate import SHIFT_SOURCES, shift_systems, simulate
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.auto_checkpoint import legacy_parts
from llmrubric.model.core import registry
from llmrubric.model.core.checkpoints import load_model, save_model
from llmrubric.model.core.system_level import Part

SMALL = {"ensemble": 1, "auto": {"candidates": ["ridge_judge"], "folds": 2, **MAIN_INTERVALS}}


@pytest.fixture(scope="module")
def six(rubric):
    """120 texts of 6 systems answered by 3 LLM sources, 4 judges; one system held out."""
    tables = simulate(0, 120, 4, 2, rubric, systems=shift_systems(6, 0), sources=SHIFT_SOURCES)[0]
    systems = tables.texts.set_index("text_id").system_id
    new = sorted(systems.unique())[0]
    return tables.subset(systems.index[systems != new]), tables.subset(systems.index[systems == new]), tables


def one_name_per_class() -> list[str]:
    """The first name of each class whose models predict an ordered main question from the features (not the
    wrapper itself, ``model=auto`` or the configured model, which carry levels of their own)."""
    seen, out = set(), []
    for name in registry.names():
        family = registry.entry(name).family
        caps = registry.capabilities(name)
        if family in seen or caps.system_level or caps.needs_llm_answers or name in ("random", "constant"):
            continue
        seen.add(family)
        out.append(name)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", one_name_per_class())
def test_the_level_wraps_every_class_moves_the_main_question_only_and_round_trips(rubric, six, tmp_path, name):
    train, test, _ = six
    model = make_model("levelled", rubric, SMALL, FAST, params={"base": name}).fit(train)
    assert isinstance(model, Levelled) and model.get_params() == {"base": name, "where": "all"}
    probs, base = model.predict_proba(test), model.base.predict_proba(test)
    main = rubric.ids.index(rubric.main.id)
    others = [i for i in range(len(rubric.ids)) if i != main]
    np.testing.assert_array_equal(probs[:, others], base[:, others])
    assert np.abs(probs[:, main] - base[:, main]).max() > 1e-3  # the new system gets the level's prior
    np.testing.assert_allclose(np.nansum(probs[:, main], axis=1), 1.0, atol=1e-9)
    loaded = load_model(save_model(model, tmp_path / "levelled.safetensors"))
    assert isinstance(loaded, Levelled) and type(loaded.base) is type(model.base)
    np.testing.assert_array_equal(loaded.predict_proba(test), probs)


def test_beyond_leaves_systems_inside_the_range_as_the_base_predicts(rubric, six):
    train, test, _ = six
    model = make_model("levelled", rubric, SMALL, FAST, params={"base": "ridge_judge", "where": "beyond"}).fit(train)
    pairs = model.predict(test)[["text_id", "judge_id", "round"]].drop_duplicates()
    table = model.levels(test, pairs)
    probs, base = model.predict_proba(test, pairs), model.base.predict_proba(test, pairs)
    if table.beyond.any():
        assert not np.array_equal(probs, base)
    else:
        np.testing.assert_array_equal(probs, base)
    levels = model.system_levels(test, pairs)
    assert list(levels.applied) == list(table.beyond)


def test_another_base_on_a_built_wrapper_is_refused_naming_the_setting(rubric):
    model = make_model("levelled", rubric, SMALL, FAST, params={"base": "ridge_judge"})
    with pytest.raises(Exception, match="base") as error:
        model.set_params(base="clmm_own")
    assert getattr(error.value, "setting", None) == "base"
    with pytest.raises(Exception, match="'sometimes' is not one of"):
        model.set_params(where="sometimes")


@pytest.mark.slow
def test_score_texts_reads_a_levelled_checkpoints_levels(rubric, six, tmp_path):
    from llmrubric.cli import main as cli

    train, _, whole = six
    model = make_model("levelled", rubric, SMALL, FAST, params={"base": "ridge_judge"}).fit(train)
    save_model(model, tmp_path / "levelled.safetensors")
    whole.features.to_csv(tmp_path / "features.csv", index=False)
    whole.texts.to_csv(tmp_path / "texts.csv", index=False)
    args = ["score", "texts", str(tmp_path / "levelled.safetensors"), str(tmp_path / "features.csv")]
    args += ["--texts", str(tmp_path / "texts.csv"), "--out", str(tmp_path / "scores.csv"), "--no-progress"]
    assert cli(args) == 0
    levels = pd.read_csv(tmp_path / "scores.levels.csv").set_index("system_id")
    assert (~levels.known).sum() == 1 and levels.applied.all() and (levels.level_sd > 0).all()
    assert "beyond_training_range" in json.loads((tmp_path / "scores.summary.json").read_text())


@pytest.mark.slow
def test_auto_reads_its_parts_by_member_and_level_and_saves_them(rubric, six, tmp_path):
    train, test, _ = six
    settings = {**model_file("auto"), "ensemble": 1, "auto": {**SMALL["auto"], "rule": "stack", "folds": 3}}
    model = AutoCalibrator(rubric, settings, FAST, group="system").fit(train)
    assert model.parts_["ridge_judge-level"] == Part("ridge_judge", "all")
    assert {p.where for p in model.parts_.values()} <= {None, "all", "beyond"}
    loaded = load_model(save_model(model, tmp_path / "auto.safetensors"))
    assert {n: loaded.parts_[n] for n in loaded.weights_} == {n: model.parts_[n] for n in model.weights_}
    np.testing.assert_array_equal(loaded.predict_proba(test), model.predict_proba(test))


def test_a_checkpoint_saved_before_parts_reads_its_weights_labels_back():
    weights = {"network": 0.5, "network-level": 0.3, "clmm_own-beyond": 0.2}
    assert legacy_parts(weights) == {
        "network": ["network", None],
        "network-level": ["network", "all"],
        "clmm_own-beyond": ["clmm_own", "beyond"],
    }
