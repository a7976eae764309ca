"""Settings: typed defaults, the shipped ``conf/`` over them, and one loader for every entry point.

Each default is defined once, in a dataclass: :class:`ModelConfig` (the calibration network) and
:class:`TrainConfig` (optimisation). Both are registered in Hydra's
ConfigStore as ``schemas/model`` and ``schemas/trainer``; the YAML files of ``conf/model/`` and
``conf/trainer/`` start from them (``defaults: [/schemas/model@_here_, _self_]``) and override
what differs (``conf/model/paper.yaml``: the paper's architecture). ``conf/`` ships inside the
package as ``llmrubric.conf`` (:func:`conf_path`), so an installed wheel has its settings,
prompts, rubrics and model manifests.

:func:`compose` is the loader: the Hydra apps (``llmrubric train|evaluate``, ``train.py``,
``evaluate.py``), the CLI's ``--config`` files (:func:`load_file`) and the Python API (:func:`group`)
all read settings through it, and a bad override or file is an :class:`InputError` naming the setting.
"""

from __future__ import annotations

import importlib.resources
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from llmrubric.io.errors import InputError, report
from llmrubric.io.guards import check_range

CONF_PACKAGE = "llmrubric.conf"
CONF_PATH = f"pkg://{CONF_PACKAGE}"
VERSION_BASE = "1.3"


ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps")


@dataclass
class TrainConfig:
    """Optimisation settings (``trainer.*``, the one definition of their defaults); epochs are maxima,
    each phase stops early on held-out NLL."""

    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.0
    delta_l2: float = 0.01
    pretrain_epochs: int = 100
    finetune_epochs: int = 100
    patience: int = 20
    val_fraction: float = 0.2
    temperature_scaling: bool = True
    ordinal_blend: bool = True
    accelerator: str = "auto"

    def __post_init__(self):
        """Each setting checked (and converted) here, named ``trainer.<field>`` in the error."""
        if self.accelerator not in ACCELERATORS:
            raise InputError(f"{self.accelerator!r} is not one of {list(ACCELERATORS)}", setting="trainer.accelerator")
        for name, (low, integer, open_low, high) in LIMITS.items():
            setattr(
                self,
                name,
                check_range(
                    f"trainer.{name}",
                    getattr(self, name),
                    low,
                    high,
                    open_low=open_low,
                    integer=integer,
                    open_high=name == "val_fraction",
                ),
            )
        for name in ("temperature_scaling", "ordinal_blend"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{getattr(self, name)!r} is not true or false", setting=f"trainer.{name}")

    @classmethod
    def from_dict(cls, data: dict | None) -> TrainConfig:
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(
                f"unknown trainer setting(s) {unknown}; known: {sorted(known)}", setting=f"trainer.{unknown[0]}"
            )
        return cls(**data)


LIMITS = {  # field: (lower bound, integer, lower bound excluded, upper bound)
    "batch_size": (1, True, False, None),
    "lr": (0, False, True, None),
    "weight_decay": (0, False, False, None),
    "delta_l2": (0, False, False, None),
    "pretrain_epochs": (0, True, False, None),
    "finetune_epochs": (0, True, False, None),
    "patience": (1, True, False, None),
    "val_fraction": (0, False, False, 1),
}


AUTO_CANDIDATES = ("network", "clmm_own", "clmm_all", "clmm_mean", "ridge_judge")


@dataclass
class AutoConfig:
    """``model=auto`` (:mod:`llmrubric.model.auto`): candidate families compared by inner cross-validation.

    Attributes:
        candidates: names of :data:`llmrubric.model.auto.CANDIDATES` (``network`` is the network of
            the other ``model.*`` settings).
        rule: ``select`` (the candidate with the lowest inner-CV NLL) or ``stack`` (non-negative
            weights summing to 1 that maximise the inner-CV likelihood of the main question);
            ``select`` had the lower pair NLL on all four design protocols of ``benchmarks/auto.py``
            (synthetic DS1..DS5 and the simulated 12-system set, leave one system out and system groups).
        group: inner folds by ``text`` or ``system``; ``auto``: by system under the protocols that
            score unseen systems (``systems``, ``system_groups``), else by text.
        folds: inner folds (by system: at most one per training system).
    """

    candidates: list[str] = field(default_factory=lambda: list(AUTO_CANDIDATES))
    rule: str = "select"
    group: str = "auto"
    folds: int = 5


@dataclass
class ModelConfig:
    """The calibration network and its ensemble (``model.*``), defaults chosen by synthetic
    5-fold CV (``benchmarks/table1.py``, NLL of the main question on training texts only).

    Attributes:
        h1, h2: hidden layer sizes.
        inputs: ``expected`` (each feature block's expected answer), ``probabilities`` (the raw
            distributions, the paper's) or ``both``.
        personalize: ``input`` (a judge one-hot on the input), ``deltas`` (per-judge layer
            deltas, eq. 3-5 of the paper) or ``none``.
        input_dropout: dropout on the inputs while training (0.2 beat 0.0: NLL 1.0557 vs 1.0594).
        ensemble: networks whose average distribution is predicted.
        head: ``softmax`` (the network's heads), ``ordinal`` or ``combined``
            (:mod:`llmrubric.model.cumulative`); ``monotone`` applies to the latter two.
        family: ``network`` (this network alone) or ``auto`` (the model chosen by inner
            cross-validation among ``auto.candidates``, :class:`AutoConfig`).
    """

    h1: int = 25
    h2: int = 25
    inputs: str = "expected"
    personalize: str = "input"
    input_dropout: float = 0.2
    ensemble: int = 5
    head: str = "softmax"
    monotone: bool = False
    family: str = "network"
    auto: AutoConfig = field(default_factory=AutoConfig)


def model_settings(model: dict | ModelConfig | None = None) -> dict:
    """:class:`ModelConfig`'s defaults updated by ``model`` (unknown keys are kept, for the caller to reject)."""
    from omegaconf import Container, OmegaConf

    given = asdict(model) if isinstance(model, ModelConfig) else dict(model or {})
    plain = lambda v: OmegaConf.to_container(v, resolve=True) if isinstance(v, Container) else v
    given = {k: asdict(v) if isinstance(v, AutoConfig) else plain(v) for k, v in given.items()}
    return {**asdict(ModelConfig()), **given}


def model_file(name: str) -> dict:
    """The settings of ``conf/model/<name>.yaml`` over :class:`ModelConfig`'s defaults, read without
    composing (so also inside a running Hydra app; the file's only default is the schema)."""
    import yaml

    data = yaml.safe_load(conf_path("model", f"{name}.yaml").read_text()) or {}
    return model_settings({k: v for k, v in data.items() if k != "defaults"})


def conf_path(*parts: str) -> Path:
    """A file or folder of the shipped ``conf/`` (``conf_path("rubric", "llm_rubric.yaml")``),
    found with :mod:`importlib.resources` in a checkout and in an installed wheel alike."""
    return Path(str(importlib.resources.files(CONF_PACKAGE).joinpath(*parts)))


def register_configs() -> None:
    """Store the structured configs in Hydra's ConfigStore (done before every composition)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(group="schemas", name="model", node=ModelConfig)
    store.store(group="schemas", name="trainer", node=TrainConfig)


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
