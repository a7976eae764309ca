"""A GGUF file's converted copy: ``transformers`` parses a GGUF file's metadata in Python and de-quantises its
weights at every load (about 40 s for SmolLM2-135M on 2 cores); :func:`llmrubric.extract.models.load` saves what
it built once (``save_pretrained``: safetensors in the load's dtype, the tokenizer with its split) and loads that
copy next time (seconds).

A copy lives under the cache folder (the transformers backend's ``gguf_cache``) in a folder named by the file's
stem and weights hash, the dtype, the ``transformers`` version and :data:`FORMAT`, so another file, dtype or
version converts anew. The folder is written beside its final name and renamed into place, so a copy is whole
or absent; :data:`MARK` records what it was made from.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)
FORMAT = 1  # bump when what a copy holds changes
MARK = "llmrubric-converted.json"


def folder(cache: str | Path, gguf_file: str, weights_hash: str, torch_dtype) -> Path:
    """Where the copy of ``gguf_file`` (with ``weights_hash``) loaded as ``torch_dtype`` lives under ``cache``."""
    import transformers

    dtype = str(torch_dtype).removeprefix("torch.")
    name = f"{Path(gguf_file).stem}-{weights_hash}-{dtype}-transformers{transformers.__version__}-v{FORMAT}"
    return Path(cache).expanduser() / name


def is_whole(path: Path) -> bool:
    return (path / MARK).is_file()


def save(model, tokenizer, path: Path, made_from: dict) -> bool:
    """Write the copy at ``path``; whether it is there now. Only a de-quantised model is copied (weights that
    ``transformers`` keeps in GGUF blocks load fast as they are). A failure (a full disk, a read-only cache) is
    a warning: the model was loaded, only the next load is slower."""
    if any("gguf" in type(m).__module__.lower() for m in model.modules()):
        return False
    part = None
    quantizer, marked = getattr(model, "hf_quantizer", None), model.config.__dict__.pop("quantization_config", None)
    model.hf_quantizer = None  # the weights are plain tensors: saved as such, no GGUF mark in config.json
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = Path(tempfile.mkdtemp(prefix=f"{path.name}.part-", dir=path.parent))
        model.save_pretrained(part)
        tokenizer.save_pretrained(part)
        (part / MARK).write_text(json.dumps(made_from, indent=1) + "\n")
        if not is_whole(path):
            os.replace(part, path)
            part = None
    except OSError as e:
        if not is_whole(path):  # else another process put its copy there first
            log.warning("no converted copy of %s kept in %s (%s): the next load converts again", made_from, path, e)
    finally:
        model.hf_quantizer = quantizer
        if marked is not None:
            model.config.quantization_config = marked
        if part is not None:
            shutil.rmtree(part, ignore_errors=True)
    return is_whole(path)
