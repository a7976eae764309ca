"""Presets (issue 48): the registry lists classes; the named variants are a class plus settings in
``conf/presets.yaml``, listed by ``llmrubric models list``, and the old names build what they built."""

from __future__ import annotations

import pytest
import yaml
from support.paths import ROOT

import llmrubric.model  # noqa: F401  (registers every class)
from llmrubric.cli import main as cli
from llmrubric.model.core import registry
from llmrubric.model.core.registry import classes, entry, make, names, preset_params
from llmrubric.model.listing import model_rows

SPECS = yaml.safe_load((ROOT / "conf" / "presets.yaml").read_text())
OLD_NAMES = [  # the 25 names of the registry before presets (issue 48): each still builds
    *("auto", "llm_rubric", "random", "argmax_llm", "expected_llm", "mean_of_sources", "constant"),
    *("raw_linear_system", "ridge_judge", "ridge_context", "network", "ordinal", "combined", "calibrated_q0"),
    *("no_personalization", "llm_rubric_single", "llm_rubric_paper", "oracle", "oracle_no_llm"),
    *("depersonalized_oracle", "personal_isotonic", "clmm_own", "clmm_all", "clmm_mean", "ordinal_lr"),
]


@pytest.fixture
def presets(monkeypatch):
    """Replace ``conf/presets.yaml``'s contents for one test (the registry re-reads them)."""

    def use(specs: dict) -> None:
        monkeypatch.setattr(registry, "_preset_specs", lambda: specs)
        monkeypatch.setattr(registry, "_NAMES", None)

    yield use
    registry._NAMES = None


def test_every_old_name_is_a_class_or_a_preset_and_each_class_registers_once():
    assert set(OLD_NAMES) <= set(names())
    families = [entry(c).family for c in classes() if c != "llm_rubric"]  # llm_rubric: the run's model.family
    assert len(families) == len(set(families))
    for name in set(names()) - set(classes()):
        assert name in SPECS and SPECS[name]["class"] in classes()


@pytest.mark.parametrize("name", [n for n in SPECS if n not in classes()])
def test_a_preset_builds_its_class_with_its_parameters(rubric, name):
    model = make(name, rubric)
    assert type(model) is entry(SPECS[name]["class"]).family
    params = model.get_params()
    for key, value in preset_params(name, rubric).items():
        assert params[key] == value
    overrides = (
        yaml.safe_load((ROOT / "conf" / "model" / f"{SPECS[name]['model']}.yaml").read_text())
        if ("model" in SPECS[name])
        else {}
    )
    for key, value in overrides.items():
        if key != "defaults":
            assert params[f"model.{key}"] == value


def test_a_preset_reads_the_main_question_and_its_model_file_over_the_run(rubric):
    assert make("calibrated_q0", rubric).get_params()["feature_questions"] == [rubric.main.id]
    ordinal = make("ordinal", rubric, {"h1": 64, "ensemble": 2}).get_params()
    assert (ordinal["model.head"], ordinal["model.ensemble"], ordinal["model.h1"]) == ("ordinal", 5, 64)
    assert make("ridge_context", rubric, params={"contextual": False}).get_params()["contextual"] is False


@pytest.mark.parametrize(
    "specs, match",
    [
        ({"x": {"class": "no_such_class"}}, "conf/presets.yaml: x: class 'no_such_class' is not registered"),
        ({"x": {"class": "clmm", "colour": "red"}}, "x: unknown key\\(s\\) \\['colour'\\]"),
        ({"x": {"class": "clmm", "params": {"depth": 3}}}, "x: clmm has no parameter 'depth'"),
        ({"network": {"class": "clmm"}}, "network is a registered class of its own"),
        ({"x": {"class": "clmm", "report_default": 1}, "y": {"class": "clmm", "report_default": 1}}, "same report"),
        ({"x": {"class": "clmm", "default_candidate": 1}}, "x: a default candidate must be a candidate"),
    ],
)
def test_a_wrong_preset_is_one_error_naming_the_file_and_the_preset(presets, specs, match):
    presets(specs)
    with pytest.raises(ValueError, match=match):
        names()


def test_a_preset_file_of_other_names_changes_the_defaults_without_code(presets, rubric):
    presets(
        {
            "my_ridge": {
                "class": "ridge_judge",
                "params": {"contextual": True},
                "candidate": True,
                "default_candidate": 1,
            }
        }
    )
    assert registry.with_capability("default_candidate") == ["my_ridge"]
    assert make("my_ridge", rubric).get_params()["contextual"] is True


def test_models_list_prints_every_name_with_its_class(capsys):
    rows = {row["name"]: row for row in model_rows()}
    assert list(rows) == names()
    assert (rows["clmm_mean"]["class"], rows["clmm_mean"]["settings"], rows["clmm_mean"]["auto"]) == (
        "clmm",
        "inputs=mean",
        "default 4",
    )
    assert rows["llm_rubric_paper"]["settings"] == "model=paper" and rows["llm_rubric"]["report"] == "9"
    capsys.readouterr()
    assert cli(["models", "list"]) == 0
    listed = [line.split()[:2] for line in capsys.readouterr().out.splitlines()[1:]]
    assert listed == [[name, rows[name]["class"]] for name in names()]
