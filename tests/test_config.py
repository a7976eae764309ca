"""One source of defaults, found through the package: the Python API, the Hydra apps and the CLI agree."""

import inspect
import re
from dataclasses import asdict, fields

import pytest
import yaml
from support.paths import ROOT

from llmrubric.cli import main as cli_main
from llmrubric.config import (
    AUTO_CANDIDATES,
    AutoConfig,
    ModelConfig,
    TrainConfig,
    compose,
    conf_path,
    group,
    load_file,
    model_settings,
)
from llmrubric.io.errors import InputError
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.baselines import make_method
from llmrubric.model.calibrator import Calibrator
from llmrubric.model.network import CalibrationNet


def test_the_python_api_the_hydra_apps_and_the_cli_default_to_the_same_settings(rubric, capsys):
    api = AutoCalibrator(rubric)
    hydra = compose("config")
    assert cli_main(["train", "--cfg", "job"]) == 0
    cli = yaml.safe_load(capsys.readouterr().out)
    for settings in (group("model", "auto"), model_settings(hydra.model), cli["model"]):
        assert settings == api.model == {**asdict(ModelConfig()), "family": "auto"}
    for settings in (group("trainer"), dict(hydra.trainer), cli["trainer"]):
        assert settings == vars(api.trainer) == asdict(TrainConfig())
    assert api.settings == AutoConfig() and list(api.settings.candidates) == list(AUTO_CANDIDATES)
    network = Calibrator(rubric)  # the network alone: model=default
    assert network.model == group("model", "default") == asdict(ModelConfig())
    assert network.model["inputs"] == "expected" and network.model["ensemble"] == 5 and api.trainer.lr == 0.003


def test_the_network_class_defaults_are_the_model_config():
    signature = inspect.signature(CalibrationNet)
    for field in fields(ModelConfig):
        if field.name in signature.parameters:
            assert signature.parameters[field.name].default == field.default, field.name


def test_named_configs_override_the_defaults_they_name(rubric):
    paper = group("model", "paper")
    assert paper == {
        **asdict(ModelConfig()),
        "inputs": "probabilities",
        "personalize": "deltas",
        "input_dropout": 0.0,
        "ensemble": 1,
    }
    assert group("model", "ordinal", ["h1=7"])["h1"] == 7 and group("model", "ordinal")["head"] == "ordinal"
    assert Calibrator(rubric, paper).model == paper
    assert make_method("llm_rubric_paper", rubric).model == paper  # Table 1's paper row is this config


@pytest.mark.parametrize(
    "override, needles",
    [
        ("trainer.lr=abc", ("setting trainer.lr", "'abc'")),
        ("model.h1=2.5", ("setting model.h1", "Integer")),
        ("model.colour=red", ("setting model.colour", "not in 'ModelConfig'")),
        ("model=nope", ("model/nope",)),
    ],
)
def test_a_bad_override_names_the_setting(override, needles):
    with pytest.raises(InputError) as info:
        compose("config", [override])
    assert all(n in str(info.value) for n in needles), str(info.value)


def test_a_users_settings_file_is_composed_like_the_shipped_ones(tmp_path):
    (tmp_path / "base.yaml").write_text("quantile: 0.9\nchunk_texts: 10\n")
    (tmp_path / "mine.yaml").write_text("defaults:\n  - base\n  - _self_\nquantile: 0.5\n")
    assert load_file(tmp_path / "mine.yaml", ["chunk_texts=20"]) == {"quantile": 0.5, "chunk_texts": 20}
    (tmp_path / "bad.yaml").write_text("quantile: [0.5,\n")
    with pytest.raises(InputError, match="bad.yaml.*not valid YAML"):
        load_file(tmp_path / "bad.yaml")
    with pytest.raises(InputError, match="mine.yaml.*cannot compose.*nope"):
        load_file(tmp_path / "mine.yaml", ["nope=1"])


def test_shipped_files_are_found_through_the_package_not_the_source_tree():
    assert conf_path("prompts", "llm_rubric.j2").is_file() and conf_path("models", "smollm2.yaml").is_file()
    lookups = [
        p for p in (ROOT / "llmrubric").rglob("*.py") if re.search(r"__file__\)?\.resolve\(\)\.parents", p.read_text())
    ]
    assert lookups == []
