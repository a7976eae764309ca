"""``model=auto``'s settings and builders: the model of ``model.family``, a candidate by name, the default
candidates (``conf/presets.yaml``) and the checks of ``model.auto.*``."""

from __future__ import annotations

from llmrubric.config import AutoConfig, TrainConfig, model_settings
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.model.core.combine import RULES
from llmrubric.model.core.registry import make, names, with_capability

GROUPS = ("auto", "text", "system")
INTERVALS = ("all", "refit", "main")  # the questions whose intervals the inner folds calibrate, and how
FAMILIES = ("auto", "network")  # the values of model.family


def default_candidates() -> list[str]:
    """``model=auto``'s default candidates: the names registered ``default_candidate``, in registration order."""
    return with_capability("default_candidate")


def resolved_candidates(candidates: list[str] | None) -> list[str] | None:
    """``model.auto.candidates``, None (the shipped setting) being :func:`default_candidates`."""
    return default_candidates() if candidates is None else candidates


def check_auto(settings: AutoConfig) -> None:
    """``model.auto.*`` in range, each error naming the setting."""
    if settings.rule not in RULES:
        raise InputError(f"{settings.rule!r} is not one of {list(RULES)}", setting="model.auto.rule")
    if settings.intervals not in INTERVALS:
        raise InputError(f"{settings.intervals!r} is not one of {list(INTERVALS)}", setting="model.auto.intervals")
    if settings.group not in GROUPS:
        raise InputError(f"{settings.group!r} is not one of {list(GROUPS)}", setting="model.auto.group")
    for key, least in (("folds", 2), ("tune_trials", 0), ("bb_draws", 1), ("level_min_systems", 3), ("workers", 1)):
        value = getattr(settings, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise InputError(f"{value!r} is not a whole number >= {least}", setting=f"model.auto.{key}")
    fold = settings.fold_ensemble
    if fold is not None and (not isinstance(fold, int) or isinstance(fold, bool) or fold < 1):
        raise InputError(f"{fold!r} is not a whole number >= 1 or null", setting="model.auto.fold_ensemble")
    if settings.cover not in names(candidate=True):
        raise InputError(f"{settings.cover!r} is not a candidate: {names(candidate=True)}", setting="model.auto.cover")
    chosen, known = list(settings.candidates), names(candidate=True)
    unknown = [n for n in chosen if n not in known]
    if unknown or not chosen or len(set(chosen)) != len(chosen):
        what = f"unknown candidate(s) {unknown}" if unknown else "candidates must be distinct and not empty"
        raise InputError(f"{what}; known: {known}", setting="model.auto.candidates")


def build_model(rubric: Rubric, model: dict | None = None, trainer: dict | None = None, seed: int = 0, group="text"):
    """The model of ``model.family``: :class:`AutoCalibrator` (``auto``) or the network (``network``),
    from :mod:`llmrubric.model.core.registry`. ``group`` resolves ``model.auto.group=auto`` (``text`` or ``system``)."""
    settings = model_settings(model)
    if settings["family"] not in FAMILIES:
        raise InputError(f"{settings['family']!r} is not one of {list(FAMILIES)}", setting="model.family")
    return make(settings["family"], rubric, settings, trainer, seed, group)


def candidate(
    name: str,
    rubric: Rubric,
    model: dict,
    trainer: TrainConfig,
    seed: int,
    group: str = "text",
    params: dict | None = None,
):
    """An unfitted candidate by name (the registry's :func:`~llmrubric.model.core.registry.names` ``(candidate=True)``),
    fitted for new texts or new systems (``group``), with ``params`` set on it."""
    if name not in names(candidate=True):
        raise InputError(f"unknown candidate {name!r}; known: {names(candidate=True)}", setting="model.auto.candidates")
    return make(name, rubric, model, trainer, seed, group, params=params)


def fold_model(model, fold_ensemble: int | None):
    """``model`` as an inner fold fits it: at most ``fold_ensemble`` (``model.auto.fold_ensemble``; None: no limit)
    networks where it averages an ensemble (``model.ensemble``: its first ones, seeded as in the refit)."""
    ensemble = model.get_params().get("model.ensemble") if fold_ensemble is not None else None
    return model.set_params(**{"model.ensemble": fold_ensemble}) if ensemble and ensemble > fold_ensemble else model
