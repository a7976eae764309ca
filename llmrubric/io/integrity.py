"""Checkpoint integrity: a checksum of the tensors, the fingerprint of the training texts,
and the checks that a checkpoint fits the evaluation asked of it."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the tensors' names, dtypes, shapes and bytes (sorted by name)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def texts_fingerprint(text_ids) -> dict:
    """``{"texts": n, "sha256": …}`` of a set of text ids (order-free)."""
    ids = sorted({str(t) for t in text_ids})
    return {"texts": len(ids), "sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest()}


def verify_tensors(tensors: dict[str, torch.Tensor], expected: str | None, path: str) -> None:
    """The stored checksum matches and every weight is finite, else the checkpoint is corrupt."""
    if not expected:
        raise InputError("checkpoint has no tensor checksum (saved by an older version); retrain it", file=path)
    if tensors_digest(tensors) != expected:
        raise InputError("checkpoint is corrupt: its tensors do not match their stored checksum", file=path)
    for name, t in sorted(tensors.items()):
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise InputError(f"checkpoint holds non-finite weights in tensor {name!r}", file=path)


def check_finite_predictions(probs: np.ndarray, source: str) -> None:
    """Predictions must be finite probabilities; NaN scores are never a result."""
    bad = ~np.isfinite(probs)
    if bad.any():
        raise InputError(
            f"non-finite predictions ({int(bad.any(axis=tuple(range(1, probs.ndim))).sum())} pairs): the model is corrupt",
            file=source,
        )


def check_fits(model, rubric: Rubric, train_text_ids, path: str) -> None:
    """A checkpoint must share the rubric's questions and options, be fine-tuned for its main
    question, and have been trained on exactly ``train_text_ids`` (not a stale run)."""
    shape = lambda r: [(q.id, q.keys) for q in r.questions]
    if shape(model.rubric) != shape(rubric):
        raise InputError(
            f"checkpoint belongs to rubric {model.rubric.name!r} (questions {model.rubric.ids}), "
            f"the configuration has rubric {rubric.name!r} (questions {rubric.ids}) or other options",
            file=path,
            setting="rubric",
        )
    if model.rubric.main.id != rubric.main.id:
        raise InputError(
            f"checkpoint is fine-tuned for {model.rubric.main.id}, the evaluation asks for {rubric.main.id}; "
            f"set main_question={model.rubric.main.id} or train for {rubric.main.id}",
            file=path,
            setting="main_question",
        )
    expected, found = model.train_texts_, texts_fingerprint(train_text_ids)
    if expected != found:
        raise InputError(
            f"checkpoint was trained on {expected.get('texts') if expected else '?'} other texts than this split's "
            f"{found['texts']} training texts (a stale checkpoint beside new folds, or changed data); run train.py again",
            file=path,
        )
