"""The network's checkpoint: what a fitted :class:`~llmrubric.model.families.network.calibrator.NetworkCalibrator`
saves (rubric, judge map, layout, settings, training summaries, an oracle's inputs, the members' weights) and how a
constructed one gets them back."""

from __future__ import annotations

import torch

from llmrubric.io.errors import InputError
from llmrubric.model.core.answers import answers_from_state, answers_state
from llmrubric.model.core.encoding import FeatureLayout, JudgeMap
from llmrubric.model.core.label_rule import LabelRule
from llmrubric.model.families.oracles import JudgeAnswers

FORMAT = "llmrubric-calibrator/5"
REQUIRED = ("rubric", "main_question", "model", "trainer", "seed", "layout", "judges")


def network_state(model) -> tuple[dict, dict[str, torch.Tensor]]:
    """Metadata and tensors of a fitted network."""
    meta = {
        "format": FORMAT,
        "family": model.family,
        "rubric": model.rubric.to_dict(),
        "main_question": model.rubric.main.id,
        "judges": list(model.judges_.judges),
        "layout": model.layout_.to_dict(),
        "model": model.model,
        "trainer": vars(model.trainer),
        "seed": model.seed,
        "summaries": model.summaries_,
        "train_texts": model.train_texts_,
    }
    if model.label_rule_ is not None:
        meta["label_rule"] = model.label_rule_.to_dict()
    if model.pair_features is not None:
        if not isinstance(model.pair_features, JudgeAnswers):
            raise InputError("a calibrator with pair features other than the oracles' JudgeAnswers cannot be saved")
        meta["pair_features"] = model.pair_features.settings()
        meta["llm_features"] = model.llm_features
    tensors = {f"{m}.{k}": v for m, net in enumerate(model.nets_) for k, v in net.state_dict().items()}
    answers_state(model.answers_, meta, tensors)
    return meta, tensors


def check_format(meta: dict, source: str) -> None:
    """An error naming ``source`` unless ``meta`` is a network checkpoint's of this format with what it needs."""
    if meta.get("format") != FORMAT:
        raise InputError(
            f"not an llmrubric calibrator checkpoint of format {FORMAT!r} (format {meta.get('format')!r}); retrain it",
            file=source,
        )
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
        raise InputError(f"checkpoint metadata lacks {missing}", file=source)


def restored(model, meta: dict, tensors: dict[str, torch.Tensor], source: str):
    """``model`` (constructed with the checkpoint's settings) with the fitted state of ``meta`` and ``tensors``."""
    model.layout_ = FeatureLayout.from_dict(meta["layout"])
    model.judges_ = JudgeMap(tuple(meta["judges"]))
    model.summaries_ = meta.get("summaries", [])
    model.train_texts_, model.source_ = meta.get("train_texts"), source
    model.label_rule_ = LabelRule.from_dict(meta.get("label_rule"), source) if model.rubric.main.ordered else None
    model.answers_ = answers_from_state(meta, tensors, model.rubric, source)
    model.nets_ = []
    for m in range(len(model.seeds)):
        net = model.new_net()
        try:
            net.load_state_dict({k.split(".", 1)[1]: v for k, v in tensors.items() if k.split(".", 1)[0] == str(m)})
        except RuntimeError as e:
            raise InputError(
                f"checkpoint weights do not fit its own metadata: {' '.join(str(e).split())[:300]}", file=source
            ) from e
        model.nets_.append(net.eval())
    return model
