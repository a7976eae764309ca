"""One source of defaults, found through the package: the Python API, the Hydra apps and the CLI agree."""

import inspect
import re
from dataclasses import asdict, fields

import pytest
import yaml
from support.paths import ROOT

from llmrubric.cli import main as cli_main
from llmrubric.config import (
    GROUP_SCHEMAS,
    OPEN_GROUPS,
    AutoConfig,
    ModelConfig,
    ScoringConfig,
    SearchConfig,
    TrainConfig,
    command_settings,
    compose,
    conf_path,
    group,
    load_file,
    model_settings,
)
from llmrubric.io.errors import InputError
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.auto_settings import default_candidates
from llmrubric.model.families.baselines import make_method
from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.model.families.network.net import CalibrationNet


@pytest.mark.slow
def test_the_python_api_the_hydra_apps_and_the_cli_default_to_the_same_settings(rubric, capsys):
    api = AutoCalibrator(rubric)
    hydra = compose("config")
    assert cli_main(["train", "--cfg", "job"]) == 0
    cli = yaml.safe_load(capsys.readouterr().out)
    for settings in (group("model", "auto"), model_settings(hydra.model), cli["model"]):
        assert settings == api.model == {**asdict(ModelConfig()), "family": "auto"}
    for settings in (group("trainer"), dict(hydra.trainer), cli["trainer"]):
        assert settings == vars(api.trainer) == asdict(TrainConfig())
    assert AutoConfig().candidates is None and api.settings == AutoConfig(candidates=default_candidates())
    assert api.settings.candidates == ["network", "clmm_own", "clmm_all", "clmm_mean", "ridge_judge"]
    network = NetworkCalibrator(rubric)  # the network alone: model=default
    assert network.model == group("model", "default") == asdict(ModelConfig())
    assert network.model["inputs"] == "expected" and network.model["ensemble"] == 5 and api.trainer.lr == 0.003


def test_the_network_class_defaults_are_the_model_config():
    signature = inspect.signature(CalibrationNet)
    for field in fields(ModelConfig):
        if field.name in signature.parameters:
            assert signature.parameters[field.name].default == field.default, field.name


@pytest.mark.slow
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
    assert NetworkCalibrator(rubric, paper).model == paper
    assert make_method("llm_rubric_paper", rubric).model == paper  # Table 1's paper row is this config


@pytest.mark.parametrize(
    "override, needles",
    [
        ("trainer.lr=abc", ("setting trainer.lr", "'abc'")),
        ("model.h1=2.5", ("setting model.h1", "'2.5' is not an integer")),
        ("model.colour=red", ("setting model.colour", "not in 'ModelConfig'")),
        ("model=nope", ("setting model", "'nope' is not an option", "options: auto, combined")),
        ("model.auto.tune_trials=two", ("setting model.auto.tune_trials", "not an integer")),
    ],
)
def test_a_bad_override_names_the_setting(override, needles):
    with pytest.raises(InputError) as info:
        compose("config", [override])
    assert all(n in str(info.value) for n in needles), str(info.value)


def test_model_auto_tune_trials_is_a_setting_of_the_apps():
    assert compose("config", ["model.auto.tune_trials=2"]).model.auto.tune_trials == 2


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


SCHEMA_GROUPS = sorted(set(GROUP_SCHEMAS) - set(OPEN_GROUPS))
PINNED = {  # values a file keeps whatever the schema's default becomes: what the cumulative heads need
    ("model", "ordinal"): {"inputs", "ensemble"},
    ("model", "combined"): {"inputs", "ensemble"},
}


def own_settings(group_name: str, option: str) -> tuple[list, dict]:
    """The ``defaults`` list of ``conf/<group>/<option>.yaml`` and what the file itself sets."""
    data = yaml.safe_load(conf_path(group_name, f"{option}.yaml").read_text()) or {}
    return data.pop("defaults", []), data


def inherited(group_name: str, option: str):
    """The settings ``conf/<group>/<option>.yaml`` starts from: its schema and the sibling files it names."""
    from omegaconf import OmegaConf

    defaults, _ = own_settings(group_name, option)
    assert defaults[0] == f"/schemas/{group_name}@_here_" or defaults[0] in option_names(group_name), defaults
    parents = [complete(group_name, d) for d in defaults if d not in ("_self_", f"/schemas/{group_name}@_here_")]
    return OmegaConf.merge(OmegaConf.structured(GROUP_SCHEMAS[group_name]), *parents)


def complete(group_name: str, option: str):
    from omegaconf import OmegaConf

    return OmegaConf.merge(inherited(group_name, option), own_settings(group_name, option)[1])


def option_names(group_name: str) -> list[str]:
    return sorted(p.stem for p in conf_path(group_name).glob("*.yaml"))


@pytest.mark.parametrize("group_name", SCHEMA_GROUPS)
def test_every_shipped_setting_file_starts_from_its_typed_schema_and_repeats_no_default(group_name):
    from omegaconf import OmegaConf

    assert option_names(group_name)
    for option in option_names(group_name):
        base = OmegaConf.to_container(inherited(group_name, option))
        for key, value in own_settings(group_name, option)[1].items():
            assert key in base, (
                f"{group_name}/{option}.yaml: {key} is no setting of {GROUP_SCHEMAS[group_name].__name__}"
            )
            if key not in PINNED.get((group_name, option), ()):
                assert value != base[key], f"{group_name}/{option}.yaml repeats the default {key}: {value!r}"


@pytest.mark.slow
def test_a_settings_file_or_flag_that_the_schema_refuses_names_the_setting(tmp_path):
    (tmp_path / "mine.yaml").write_text("quantile: 0.5\nleaderboard: {bootstrap: many}\n")
    with pytest.raises(InputError, match=r"mine.yaml, setting leaderboard.bootstrap: .*'many'"):
        command_settings("scoring", tmp_path / "mine.yaml")
    (tmp_path / "typo.yaml").write_text("quantlie: 0.5\n")
    with pytest.raises(InputError, match=r"typo.yaml, setting quantlie: .*not in 'ScoringConfig'"):
        command_settings("scoring", tmp_path / "typo.yaml")
    (tmp_path / "mine.yaml").write_text("quantile: 0.5\nleaderboard: {bootstrap: 50}\n")
    partial = command_settings("scoring", tmp_path / "mine.yaml", {"leaderboard.bootstrap": 7, "quantile": None})
    assert partial["quantile"] == 0.5 and partial["leaderboard"]["bootstrap"] == 7  # a flag over the file
    assert partial["chunk_texts"] == ScoringConfig.chunk_texts  # what the file leaves out: the schema's default


@pytest.mark.slow
def test_code_defaults_equal_the_shipped_settings():
    from llmrubric.model.judges import add_judge
    from llmrubric.report.settings import ReportSettings
    from llmrubric.scoring.labels import suggest
    from llmrubric.scoring.leaderboard import build
    from llmrubric.scoring.scores import score_texts

    def defaults(function) -> dict:
        return {k: p.default for k, p in inspect.signature(function).parameters.items() if p.default is not p.empty}

    scoring, labels = command_settings("scoring"), command_settings("labels")
    assert {k: defaults(score_texts)[k] for k in ("quantile", "chunk_texts")} == {
        k: scoring[k] for k in ("quantile", "chunk_texts")
    }
    board = scoring["leaderboard"]
    assert defaults(build) == {
        "texts": None,
        "judges": scoring["trusted_judges"],
        "n_boot": board["bootstrap"],
        **{k: board[k] for k in ("seed", "alpha", "sample_answers", "band_replicates", "small_sample")},
        "labels": None,
        "shift_errors": None,
        "draws": None,
        "sampling_rule": None,
        "levels": None,
        "transport": None,  # the Python API checks transport only when given TransportSettings (the CLI always)
    }
    assert defaults(suggest) == {"seed": labels["suggest"]["seed"], "round_id": labels["suggest"]["round"]}
    judges = labels["judges"]
    assert {**defaults(add_judge), "l2_grid": list(defaults(add_judge)["l2_grid"])} == {
        k: judges[k] for k in ("min_annotations", "l2", "max_iter", "l2_grid", "cv_folds")
    }
    assert defaults(NetworkCalibrator.add_judge) == defaults(add_judge)  # the network's own, as `judges add`'s
    full = group("report", "full")
    assert ReportSettings.from_dict(full) == ReportSettings(dir=full["dir"])
    assert (full["seeds"], full["workers"]) == (2, 2)
    optuna = group("search", "optuna")
    assert {k: v for k, v in optuna.items() if k not in ("enabled", "space", "storage")} == {
        k: v for k, v in asdict(SearchConfig()).items() if k not in ("enabled", "space", "storage")
    }
    assert optuna["pruner"] == "successive_halving" and not group("search", "none")["enabled"]
