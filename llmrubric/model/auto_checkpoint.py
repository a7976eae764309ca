"""``model=auto``'s checkpoint: what a fitted :class:`~llmrubric.model.auto.AutoCalibrator` saves (its choice, its
members, their system levels and its interval calibrations) and how a constructed one gets them back."""

from __future__ import annotations

import torch

from llmrubric.io.errors import InputError
from llmrubric.model.core.checkpoints import split_tensors
from llmrubric.model.core.conformal import Conformal
from llmrubric.model.core.encoding import FeatureLayout, JudgeMap
from llmrubric.model.core.label_rule import LabelRule
from llmrubric.model.core.registry import entry, family_of
from llmrubric.model.core.system_level import LABELS, Part, levels_from_state, levels_state

FORMAT = "llmrubric-auto/1"
CONFORMAL = "conformal"  # the tensors of the interval calibrations: conformal.<i>/…
REQUIRED = ("rubric", "main_question", "model", "weights", "members", "layout", "judges")


def auto_state(model) -> tuple[dict, dict[str, torch.Tensor]]:
    """Metadata and tensors of a fitted ``model=auto`` model."""
    meta = {
        "format": FORMAT,
        "family": model.family,
        "rubric": model.rubric.to_dict(),
        "main_question": model.rubric.main.id,
        "model": model.model,
        "trainer": vars(model.trainer),
        "seed": model.seed,
        "group": model.group,
        "fallback": model.fallback_,
        "system_level": model.level_record_,
        "weights": model.weights_,
        "parts": {n: model.parts_[n].to_list() for n in model.weights_},
        "inner_cv": model.table_,
        "decision": model.decision_,
        "inner_nll": model.inner_nll_,
        "layout": model.layout_.to_dict(),
        "judges": list(model.judges_.judges),
        "train_texts": model.train_texts_,
        "added_judges": model.added_judges_,
        "members": {},
        "label_rule": model.label_rule_.to_dict() if model.label_rule_ is not None else None,
        "conformals": [],
    }
    tensors = {}
    for i, conformal in enumerate(model.conformals_.values()):
        part, arrays = conformal.state()
        meta["conformals"].append(part)
        tensors.update({f"{CONFORMAL}.{i}/{k}": torch.from_numpy(v) for k, v in arrays.items()})
    for name, member in model.members_.items():
        member_meta, member_tensors = member.state()
        meta["members"][name] = member_meta
        tensors.update({f"{name}/{k}": v for k, v in member_tensors.items()})
    tensors.update(levels_state(model.levels_))
    return meta, tensors


def check_format(meta: dict, source: str) -> None:
    """An error naming ``source`` unless ``meta`` is a ``model=auto`` checkpoint's of this format."""
    missing = [k for k in REQUIRED if k not in meta]
    if meta.get("format") != FORMAT or missing:
        raise InputError(f"not a model=auto checkpoint of format {FORMAT!r} (lacks {missing})", file=source)


def restored(model, meta: dict, tensors: dict[str, torch.Tensor], source: str):
    """``model`` (constructed with the checkpoint's settings) with the fitted state of ``meta`` and ``tensors``."""
    rubric = model.rubric
    model.weights_, model.table_, model.inner_nll_ = meta["weights"], meta.get("inner_cv", {}), meta.get("inner_nll")
    model.parts_ = {n: Part(*part) for n, part in meta.get("parts", legacy_parts(meta["weights"])).items()}
    model.decision_ = meta.get("decision")
    model.layout_, model.judges_ = FeatureLayout.from_dict(meta["layout"]), JudgeMap(tuple(meta["judges"]))
    model.train_texts_, model.source_, model.fallback_ = meta.get("train_texts"), source, meta.get("fallback")
    model.added_judges_ = meta.get("added_judges", [])
    model.level_record_ = meta.get("system_level", {})
    model.label_rule_ = LabelRule.from_dict(meta.get("label_rule"), source) if rubric.main.ordered else None
    model.levels_ = levels_from_state(rubric, model.level_record_, tensors, source)
    model.conformals_ = conformals_from_state(meta, tensors)
    model.members_ = {}
    for name, member_meta in meta["members"].items():
        part = split_tensors(tensors, name)
        # members saved before their families had a format (mixed model, ridge) are known by name
        family = family_of(member_meta["format"], source) if "format" in member_meta else entry(name).family
        try:
            model.members_[name] = family.from_state(rubric, member_meta, part, source)
        except (KeyError, ValueError, RuntimeError) as e:
            raise InputError(f"checkpoint member {name} does not fit its own metadata: {e!r}", file=source) from e
    return model


def legacy_parts(weights: dict) -> dict[str, list]:
    """The parts of a checkpoint saved before they were (issue 48): its weights' labels read back, ``<member>-level``
    and ``<member>-beyond`` being the member with its level on every system and beyond the range only."""
    ends = {f"-{label}": where for where, label in LABELS.items()}
    return {
        n: next(([n.removesuffix(end), where] for end, where in ends.items() if n.endswith(end)), [n, None])
        for n in weights
    }


def conformals_from_state(meta: dict, tensors: dict[str, torch.Tensor]) -> dict[str, Conformal]:
    """Question id → interval calibration of a checkpoint (an older one has a single ``conformal``: the main
    question's)."""
    if "conformal" in meta:
        arrays = {k: v.numpy() for k, v in split_tensors(tensors, CONFORMAL).items()}
        return {meta["conformal"]["question_id"]: Conformal.from_state(meta["conformal"], arrays)}
    out = {}
    for i, part in enumerate(meta.get("conformals", [])):
        arrays = {k: v.numpy() for k, v in split_tensors(tensors, f"{CONFORMAL}.{i}").items()}
        out[part["question_id"]] = Conformal.from_state(part, arrays)
    return out
