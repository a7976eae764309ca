"""`data fetch llm-rubric` against a loopback HTTP server: verified, all-or-nothing, resumable."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support.paths import SHARED

from llmrubric.cli import main
from llmrubric.data.fetch import UPSTREAM_PATHS, checksums, fetch_llm_rubric, sha256_of
from llmrubric.io.errors import InputError

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"the LLM-Rubric release is not at {SHARED}")
SMALL = "real/real_dialogue_ids.tsv"


class Handler(SimpleHTTPRequestHandler):
    def do_GET(self):
        self.server.requests.append(self.path)
        super().do_GET()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(directory: Path):
    """Serve ``directory`` on 127.0.0.1; yield (base URL, list of requested paths)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", server.requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def mirror(tmp_path: Path) -> Path:
    """A writable copy of the release, under the DEST names."""
    root = tmp_path / "mirror"
    for name in checksums():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHARED / name, root / name)
    return root


def assert_complete(dest: Path) -> None:
    expected = checksums()
    assert len(expected) == 9
    for name, digest in expected.items():
        assert sha256_of(dest / name) == digest, name


def test_shipped_checksums_match_the_release():
    assert checksums() == {
        name: digest for digest, name in (line.split() for line in (SHARED / "SHA256SUMS").read_text().splitlines())
    }
    assert set(UPSTREAM_PATHS) == set(checksums())


@pytest.mark.slow
def test_fetch_mirror_then_nothing_to_do_then_resume(tmp_path):
    dest = tmp_path / "dest"
    with serve(SHARED) as (url, requests):
        assert sorted(fetch_llm_rubric(dest, url, mirror=True, progress=False)) == sorted(checksums())
        assert_complete(dest)
        assert len(requests) == 9
        assert fetch_llm_rubric(dest, url, mirror=True, progress=False) == []
        assert len(requests) == 9
        (dest / SMALL).unlink()
        assert fetch_llm_rubric(dest, url, mirror=True, progress=False) == [SMALL]
        assert requests[-1] == "/" + SMALL and len(requests) == 10
    assert_complete(dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]


@pytest.mark.slow
def test_fetch_upstream_layout(tmp_path):
    upstream = tmp_path / "upstream"
    for name, remote in UPSTREAM_PATHS.items():
        (upstream / remote).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(SHARED / name, upstream / remote)
    with serve(upstream) as (url, requests):
        fetch_llm_rubric(tmp_path / "dest", url, progress=False)
    assert_complete(tmp_path / "dest")
    assert "/data/synth_data/synth_dialogue_ids.tsv" in requests


@pytest.mark.slow
def test_corrupted_file_keeps_nothing(tmp_path):
    source = mirror(tmp_path)
    data = bytearray((source / SMALL).read_bytes())
    data[100] ^= 1
    (source / SMALL).write_bytes(bytes(data))
    dest = tmp_path / "dest"
    with serve(source) as (url, _), pytest.raises(InputError) as info:
        fetch_llm_rubric(dest, url, mirror=True, progress=False)
    message = str(info.value)
    assert SMALL in message and checksums()[SMALL] in message and sha256_of(source / SMALL) in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror"]


@pytest.mark.slow
def test_corrupted_file_into_partial_dest_adds_nothing(tmp_path):
    source = mirror(tmp_path)
    (source / "LICENSE").write_text("not the licence\n")
    dest = tmp_path / "dest"
    (dest / "real").mkdir(parents=True)
    shutil.copy(SHARED / SMALL, dest / SMALL)
    with serve(source) as (url, _), pytest.raises(InputError, match="LICENSE.*sha256 mismatch"):
        fetch_llm_rubric(dest, url, mirror=True, progress=False)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == ["real", SMALL]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "mirror"]


@pytest.mark.slow
def test_missing_file_keeps_nothing(tmp_path):
    source = mirror(tmp_path)
    (source / "real" / "real_data.json").unlink()
    with serve(source) as (url, _), pytest.raises(InputError, match=r"real/real_data.json.*HTTP 404"):
        fetch_llm_rubric(tmp_path / "dest", url, mirror=True, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror"]


@pytest.mark.slow
def test_cli_fetch(tmp_path, capsys):
    dest = tmp_path / "dest"
    with serve(SHARED) as (url, _):
        assert main(["data", "fetch", "llm-rubric", str(dest), "--base-url", url, "--mirror"]) == 0
    assert_complete(dest)
    with serve(tmp_path / "dest" / "synthetic") as (url, _):
        assert main(["data", "fetch", "llm-rubric", str(tmp_path / "other"), "--base-url", url, "--mirror"]) == 2
    assert "HTTP 404" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
