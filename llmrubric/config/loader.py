"""The one loader of settings: Hydra composition of ``conf/`` over the typed schemas of each group
(:data:`GROUP_SCHEMAS`), users' ``--config`` files, the CLI commands' settings and the Hydra apps' start."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from llmrubric.config.data import DataConfig
from llmrubric.config.extract import ExtractConfig
from llmrubric.config.ir import IRConfig
from llmrubric.config.labels import LabelsConfig
from llmrubric.config.logger import LoggerConfig
from llmrubric.config.model import ModelConfig
from llmrubric.config.paths import CONF_PACKAGE, VERSION_BASE, conf_path
from llmrubric.config.report import ReportConfig
from llmrubric.config.rubric_files import rubric_files
from llmrubric.config.scoring import ScoringConfig
from llmrubric.config.search import SearchConfig
from llmrubric.config.trainer import TrainConfig
from llmrubric.io.errors import InputError, yaml_error
from llmrubric.io.guards import did_you_mean

GROUP_SCHEMAS = {
    "data": DataConfig,
    "model": ModelConfig,
    "trainer": TrainConfig,
    "search": SearchConfig,
    "report": ReportConfig,
    "logger": LoggerConfig,
    "scoring": ScoringConfig,
    "labels": LabelsConfig,
    "ir": IRConfig,
    "extract": ExtractConfig,
}


OPEN_GROUPS = ("extract",)  # a file may add keys the schema does not name (the backends' own)


def register_configs() -> None:
    """Store the structured configs in Hydra's ConfigStore (called before every composition; each is stored once a
    process, not again at 60 ms a composition: Hydra hands out deep copies of what it stores)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    stored = store.repo.get("schemas", {})
    for name, schema in GROUP_SCHEMAS.items():
        if f"{name}.yaml" not in stored:
            store.store(group="schemas", name=name, node=schema)


def compose(
    config_name: str = "config", overrides: list[str] | tuple[str, ...] = (), config_dir: str | Path | None = None
):
    """The composed settings (a DictConfig) of ``config_name`` with Hydra ``overrides``.

    ``config_dir``: compose a file of that folder (its ``defaults`` may name sibling files) instead
    of the shipped ``conf/``. Errors name the setting.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir, initialize_config_module
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    if config_dir is not None:
        context = initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=VERSION_BASE)
    else:
        context = initialize_config_module(CONF_PACKAGE, version_base=VERSION_BASE)
    try:
        with context:
            return hydra_compose(config_name=config_name, overrides=rubric_files(overrides))
    except yaml.YAMLError as e:  # a file of the search path (conf/rubric/mine.yaml) that is not YAML
        raise yaml_error(e) from None
    except MissingConfigException as e:
        raise choice_error(e) from None
    except OmegaConfBaseException as e:
        raise settings_error(e) from None
    except HydraException as e:
        cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else None
        raise (settings_error(cause) if cause is not None else InputError(" ".join(str(e).split()))) from None


TYPE_NAMES = {"Float": "a number", "Integer": "an integer", "Boolean": "true or false", "String": "a string"}


def settings_error(e: Exception) -> InputError:
    """An OmegaConf validation error as an :class:`InputError` naming the setting: a value of the wrong type
    (``'abc' is not a number``), an unknown key with the key meant where one is close."""
    from omegaconf import DictConfig
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    message = str(getattr(e, "msg", None) or e).splitlines()[0]
    wrong_type = re.fullmatch(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", message)
    if wrong_type and wrong_type.group(2) in TYPE_NAMES:
        message = f"'{wrong_type.group(1)}' is not {TYPE_NAMES[wrong_type.group(2)]}"
    parent = getattr(e, "parent_node", None)
    if isinstance(e, ConfigAttributeError | ConfigKeyError) and isinstance(parent, DictConfig):
        message += did_you_mean(getattr(e, "key", None), [k for k in parent.keys() if k != "hydra"])
    key = getattr(e, "full_key", None)
    return InputError(message, setting=key) if key else InputError(message)


def choice_error(e) -> InputError:
    """Hydra's missing option of a config group (``model=forest``) as one line naming the group, the options
    closest to the one given and every option (not Hydra's search path)."""
    group, _, option = str(e.missing_cfg_file).rpartition("/")
    options = [o for o in (e.options or []) if o != "default" or group != "model"]
    if not group or not options:
        return InputError(f"no config {e.missing_cfg_file!r}")
    return InputError(
        f"{option!r} is not an option of {group}{did_you_mean(option, options, 3)} (options: {', '.join(options)})",
        setting=group,
    )


def load_file(path: str | Path, overrides: list[str] | tuple[str, ...] = (), what: str = "settings file") -> dict:
    """A settings file of the user's (``--config``) composed like the shipped ones, as a plain dict:
    its ``defaults`` list may name files of its folder, ``overrides`` apply on top."""
    from omegaconf import OmegaConf

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} not found", file=str(path))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise yaml_error(e, str(path)) from None
    if not isinstance(data, dict | None):
        raise InputError(f"a {what} must be a YAML mapping (key: value lines)", file=str(path))
    try:
        cfg = compose(path.stem, overrides, config_dir=path.parent)
    except InputError as e:
        raise InputError(f"cannot compose the {what}: {e}", file=str(path)) from None
    return OmegaConf.to_container(cfg, resolve=True)


def command_settings(
    group: str,
    path: str | Path | None = None,
    flags: dict | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    what: str = "settings file",
) -> dict:
    """The settings of a CLI command of the config group ``group`` (``scoring``, ``labels``, ``ir``,
    ``extract``) as a plain dict: the group's typed defaults (:data:`GROUP_SCHEMAS`), under its
    ``--config`` file ``path`` or else the shipped ``conf/<group>/default.yaml`` (composed by
    :func:`load_file` with the Hydra ``overrides``), under the command-line ``flags``
    (``{"leaderboard.bootstrap": 200}``; None means not given). A bad value names the setting."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    default = conf_path(group, "default.yaml")
    if path is not None:
        given = load_file(path, overrides, what)
    else:
        given = load_file(default, overrides, what) if default.is_file() else {}
    schema = OmegaConf.structured(GROUP_SCHEMAS[group])
    OmegaConf.set_struct(schema, group not in OPEN_GROUPS)
    flat = {key: value for key, value in (flags or {}).items() if value is not None}
    settings = schema
    for layer, source in ((given, path or default), (_nested(flat), None)):
        try:
            settings = OmegaConf.merge(settings, layer)
        except OmegaConfBaseException as e:
            error = settings_error(e)
            message = str(error)[len(f"setting {error.setting}: ") :] if error.setting else str(error)
            raise InputError(message, file=str(source) if source else None, setting=error.setting) from None
    return OmegaConf.to_container(settings, resolve=True)


def _nested(flat: dict) -> dict:
    """``{"a.b": 1}`` as ``{"a": {"b": 1}}``."""
    out: dict = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def group(name: str, option: str = "default", overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """One group's settings as a plain dict, as the apps see them: ``group("model", "paper")``."""
    from omegaconf import OmegaConf

    cfg = compose("config", [f"{name}={option}", *(f"{name}.{o}" for o in overrides)])
    return OmegaConf.to_container(cfg[name], resolve=True)
