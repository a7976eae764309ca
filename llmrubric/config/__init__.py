"""Settings: typed defaults, the shipped ``conf/`` over them, and one loader for every entry point.

Each default is defined once, in a dataclass of the module of its section: :class:`ModelConfig`
and :class:`AutoConfig` (``model``: the calibration network, ``model=auto``), :class:`TrainConfig`
(``trainer``: optimisation), :class:`DataConfig` (``data``), :class:`SearchConfig` (``search``),
:class:`ReportConfig` (``report``), :class:`LoggerConfig` (``logger``), and the CLI's
:class:`ScoringConfig` (``scoring``), :class:`LabelsConfig` (``labels``), :class:`IRConfig` (``ir``)
and :class:`ExtractConfig` (``extract``). Each is registered in Hydra's ConfigStore as
``schemas/<group>`` (:data:`GROUP_SCHEMAS`); the YAML files of ``conf/<group>/`` start from it
(``defaults: [/schemas/<group>@_here_, _self_]``) and override only what differs by purpose
(``conf/model/paper.yaml``: the paper's architecture). ``conf/`` ships inside the package as
``llmrubric.conf`` (:func:`conf_path`, ``paths``), so an installed wheel has its settings, prompts,
rubrics and model manifests.

:func:`compose` (``loader``) is the loader: the Hydra apps (``llmrubric train|evaluate``, ``train.py``,
``evaluate.py``), the CLI's ``--config`` files (:func:`load_file`, :func:`command_settings`) and
the Python API (:func:`group`) all read settings through it, and a bad override or file is an
:class:`InputError` naming the setting. Every name is importable from ``llmrubric.config``.
"""

from llmrubric.config.data import MISSING, DataConfig
from llmrubric.config.extract import AdaptiveConfig, ExtractConfig
from llmrubric.config.hydra_app import app_help, run_app
from llmrubric.config.ir import AutograderConfig, ImportsConfig, IRConfig, NuggetsConfig
from llmrubric.config.labels import JudgesConfig, LabelsConfig, PlanConfig, SuggestConfig
from llmrubric.config.loader import (
    GROUP_SCHEMAS,
    OPEN_GROUPS,
    command_settings,
    compose,
    group,
    load_file,
    register_configs,
    settings_error,
)
from llmrubric.config.logger import LoggerConfig
from llmrubric.config.model import (
    LABEL_RULES,
    AutoConfig,
    LabelRuleConfig,
    LinearConfig,
    ModelConfig,
    model_file,
    model_overrides,
    model_settings,
)
from llmrubric.config.paths import CONF_PACKAGE, CONF_PATH, VERSION_BASE, conf_path
from llmrubric.config.report import REPORT_SECTIONS, ReportConfig
from llmrubric.config.scoring import LeaderboardConfig, ScoringConfig
from llmrubric.config.search import SearchConfig
from llmrubric.config.trainer import ACCELERATORS, LIMITS, TrainConfig

__all__ = [
    "ACCELERATORS",
    "CONF_PACKAGE",
    "CONF_PATH",
    "GROUP_SCHEMAS",
    "LABEL_RULES",
    "LIMITS",
    "MISSING",
    "OPEN_GROUPS",
    "REPORT_SECTIONS",
    "VERSION_BASE",
    "AutoConfig",
    "LinearConfig",
    "AutograderConfig",
    "DataConfig",
    "AdaptiveConfig",
    "ExtractConfig",
    "IRConfig",
    "ImportsConfig",
    "JudgesConfig",
    "LabelRuleConfig",
    "LabelsConfig",
    "LeaderboardConfig",
    "LoggerConfig",
    "ModelConfig",
    "NuggetsConfig",
    "ReportConfig",
    "ScoringConfig",
    "SearchConfig",
    "PlanConfig",
    "SuggestConfig",
    "TrainConfig",
    "app_help",
    "command_settings",
    "compose",
    "conf_path",
    "group",
    "load_file",
    "model_file",
    "model_overrides",
    "model_settings",
    "register_configs",
    "run_app",
    "settings_error",
]
