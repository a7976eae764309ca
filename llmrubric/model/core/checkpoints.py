"""The estimator interface every model family implements, and the one checkpoint file they share.

A family (the calibration network and its cumulative heads, :class:`~llmrubric.model.families.network.calibrator.NetworkCalibrator`;
the cumulative-link mixed model, :class:`~llmrubric.model.families.mixed.MixedOrdinal`; ridge regression,
:class:`~llmrubric.model.families.baselines.RidgeJudge`; the LLM baselines; the oracles; the model choice of
:class:`~llmrubric.model.auto.AutoCalibrator`), registered under its config name in
:mod:`llmrubric.model.core.registry` (whose :class:`~llmrubric.model.core.registry.Family` is this interface), has:

- ``fit(tables) -> self``;
- ``predict_proba(tables, pairs=None) -> ndarray (pairs, rubric questions, max options)``: the
  predictive distribution of every annotated (or given) (text, judge, round) pair; a question the
  family does not predict is NaN, padding 0;
- ``predict(tables, pairs=None) -> DataFrame``: the predictions table of the questions it predicts;
- ``state() -> (meta, tensors)`` and ``from_state(rubric, meta, tensors, source)``: JSON metadata
  (``meta["format"]``: ``llmrubric-<family>/<version>``) and tensors that restore the fitted model,
  written by :func:`save_model` as one safetensors file (no pickles) and read back by
  :func:`load_model`, whatever the family.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from llmrubric.io.errors import InputError
from llmrubric.io.files import atomic_path
from llmrubric.io.integrity import tensors_digest, verify_tensors
from llmrubric.io.rubric import Rubric
from llmrubric.model.core.registry import family_of

META_KEY = "llmrubric"


def write_checkpoint(path: str | Path, meta: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """One safetensors file: ``tensors`` plus ``meta`` (with the tensors' checksum), written atomically."""
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    meta = {**meta, "tensors_sha256": tensors_digest(tensors)}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta)})
    return Path(path)


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metadata, tensors) of a checkpoint whose tensors match their checksum."""
    path = Path(path)
    if not path.is_file():
        raise InputError("checkpoint not found", file=str(path))
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get(META_KEY, "{}"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise InputError(f"not a readable safetensors checkpoint: {e}", file=str(path)) from e
    if not isinstance(meta, dict) or "format" not in meta:
        raise InputError("not an llmrubric checkpoint (no format in its metadata)", file=str(path))
    verify_tensors(tensors, meta.get("tensors_sha256"), str(path))
    return meta, tensors


def split_tensors(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors named ``prefix/…``, without the prefix."""
    start = f"{prefix}/"
    return {k[len(start) :]: v for k, v in tensors.items() if k.startswith(start)}


def save_model(model, path: str | Path) -> Path:
    """One checkpoint of any family: its :meth:`state` with the rubric that :func:`load_model` passes back."""
    meta, tensors = model.state()
    meta.setdefault("rubric", model.rubric.to_dict())
    meta.setdefault("main_question", model.rubric.main.id)
    return write_checkpoint(path, meta, tensors)


def load_model(path: str | Path):
    """The fitted model of a checkpoint, whatever its family (:func:`llmrubric.model.core.registry.family_of`);
    a checkpoint of an unknown family or version, or whose state lacks a key, is one :class:`InputError`."""
    meta, tensors = read_checkpoint(path)
    family = family_of(meta["format"], str(path))
    try:
        rubric = Rubric.from_dict(meta["rubric"], str(path)).with_main(meta["main_question"])
        return family.from_state(rubric, meta, tensors, source=str(path))
    except KeyError as e:
        raise InputError(f"checkpoint state lacks {e}", file=str(path)) from None
