"""Download the LLM-Rubric release (microsoft/LLM-Rubric) and verify it against shipped checksums.

The files land in DEST under the names ``llm_rubric.load`` expects (those of
``llm_rubric.sha256``); upstream they live elsewhere in the repository (``UPSTREAM_PATHS``).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tqdm import tqdm

from llmrubric.io.errors import InputError

log = logging.getLogger(__name__)

UPSTREAM_BASE_URL = "https://raw.githubusercontent.com/microsoft/LLM-Rubric/main/"
UPSTREAM_PATHS = {  # name in DEST -> path in the upstream repository
    "synthetic/gpt-3.5-turbo-16k_synth_evaluations_FIXED.tsv": "data/synth_data/gpt-3.5-turbo-16k_synth_evaluations_FIXED.tsv",
    "synthetic/human_judges_synth_all_FIXED_ANON.tsv": "data/synth_data/human_judges_synth_all_FIXED_ANON.tsv",
    "synthetic/synth_dialogue_ids.tsv": "data/synth_data/synth_dialogue_ids.tsv",
    "real/gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv": "data/real_data/gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv",
    "real/human_judges_real_convs_FIXED_ANON.tsv": "data/real_data/human_judges_real_convs_FIXED_ANON.tsv",
    "real/real_data.json": "data/real_data/real_data.json",
    "real/real_dialogue_ids.tsv": "data/real_data/real_dialogue_ids.tsv",
    "reference_best_hyperparameters.json": "experiments/real_data/best_synth_cross-validation_hp.json",
    "LICENSE": "LICENSE",
}
CHUNK = 1 << 16


def checksums() -> dict[str, str]:
    """Expected sha256 of each release file, by its name in DEST."""
    text = importlib.resources.files(__package__).joinpath("llm_rubric.sha256").read_text()
    return {
        name.strip(): digest for digest, name in (line.split(maxsplit=1) for line in text.splitlines() if line.strip())
    }


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _download(url: str, path: Path, name: str, progress: bool) -> str:
    """Stream ``url`` into ``path`` with a progress bar; return the sha256 of what arrived."""
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as response, path.open("wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(
                total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=name, disable=not progress
            ) as bar:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as e:
        raise InputError(f"download failed: HTTP {e.code} {e.reason} for {url}", file=name) from e
    except (urllib.error.URLError, OSError) as e:
        raise InputError(f"download failed: {getattr(e, 'reason', e)} for {url}", file=name) from e
    return digest.hexdigest()


def fetch_llm_rubric(
    dest: str | Path, base_url: str = UPSTREAM_BASE_URL, mirror: bool = False, progress: bool = True
) -> list[str]:
    """Download the missing or changed release files into ``dest``; return their names.

    Files already in ``dest`` with the right hash are skipped. The others are downloaded
    into a temporary directory beside ``dest`` and moved into ``dest`` only when every
    one matches its checksum; otherwise an InputError names the file and ``dest`` is left
    as it was. With ``mirror`` the base URL serves the files under their DEST names.
    """
    dest = Path(dest)
    expected = checksums()
    todo = [
        name for name, digest in expected.items() if not ((dest / name).is_file() and sha256_of(dest / name) == digest)
    ]
    if not todo:
        log.info("%s: all %d LLM-Rubric files present and verified", dest, len(expected))
        return []
    base = base_url.rstrip("/") + "/"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".fetch"))
    try:
        for name in todo:
            url = urllib.parse.urljoin(base, urllib.parse.quote(name if mirror else UPSTREAM_PATHS[name]))
            part = tmp / name
            part.parent.mkdir(parents=True, exist_ok=True)
            actual = _download(url, part, name, progress)
            if actual != expected[name]:
                raise InputError(
                    f"sha256 mismatch: expected {expected[name]}, got {actual} (from {url}); {dest} left unchanged",
                    file=name,
                )
        if not dest.exists():
            tmp.chmod(0o755)
            os.replace(tmp, dest)
        else:
            for name in todo:
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp / name, dest / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s: downloaded and verified %d file(s): %s", dest, len(todo), ", ".join(todo))
    return todo
