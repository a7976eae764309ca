"""The one loader of settings: Hydra composition of ``conf/`` over the typed schemas of each group
(:data:`GROUP_SCHEMAS`), users' ``--config`` files, the CLI commands' settings and the Hydra apps' start."""

from __future__ import annotations

import sys
from pathlib import Path

from llmrubric.config.data import DataConfig
from llmrubric.config.extract import ExtractConfig
from llmrubric.config.ir import IRConfig
from llmrubric.config.labels import LabelsConfig
from llmrubric.config.logger import LoggerConfig
from llmrubric.config.model import ModelConfig
from llmrubric.config.paths import CONF_PACKAGE, VERSION_BASE, conf_path
from llmrubric.config.report import ReportConfig
from llmrubric.config.scoring import ScoringConfig
from llmrubric.config.search import SearchConfig
from llmrubric.config.trainer import TrainConfig
from llmrubric.io.errors import InputError, report

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
    """Store the structured configs in Hydra's ConfigStore (done before every composition)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, schema in GROUP_SCHEMAS.items():
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
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    if config_dir is not None:
        context = initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=VERSION_BASE)
    else:
        context = initialize_config_module(CONF_PACKAGE, version_base=VERSION_BASE)
    try:
        with context:
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except OmegaConfBaseException as e:
        raise settings_error(e) from None
    except HydraException as e:
        cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else None
        raise (settings_error(cause) if cause is not None else InputError(" ".join(str(e).split()))) from None


def settings_error(e: Exception) -> InputError:
    """An OmegaConf validation error as an :class:`InputError` naming the setting."""
    message = str(getattr(e, "msg", None) or e).splitlines()[0]
    key = getattr(e, "full_key", None)
    return InputError(message, setting=key) if key else InputError(message)


def load_file(path: str | Path, overrides: list[str] | tuple[str, ...] = (), what: str = "settings file") -> dict:
    """A settings file of the user's (``--config``) composed like the shipped ones, as a plain dict:
    its ``defaults`` list may name files of its folder, ``overrides`` apply on top."""
    import yaml
    from omegaconf import OmegaConf

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} not found", file=str(path))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise InputError(f"not valid YAML: {' '.join(str(e).split())}", file=str(path)) from None
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
            message = str(getattr(e, "msg", None) or e).splitlines()[0]
            key = getattr(e, "full_key", None) or None
            raise InputError(message, file=str(source) if source else None, setting=key) from None
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


def run_app(task, name: str, argv: list[str] | None = None) -> None:
    """Run the Hydra app ``task`` (a ``hydra.main`` function) as ``llmrubric <name> argv…``.

    Plain overrides are composed first, so that a bad one is one ``error:`` line (exit 2) like
    every other bad setting; Hydra's flags (``--cfg job``, ``--multirun``, ``--help``) pass through.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    register_configs()
    if not any(a.startswith("-") for a in argv):
        try:
            compose("config", argv)
        except InputError as e:
            sys.exit(report(e))
    saved = sys.argv
    sys.argv = [name, *argv, f"hydra.job.name={name}"]
    try:
        task()
    finally:
        sys.argv = saved
