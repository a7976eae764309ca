"""benchmarks/common.py: every benchmark result records the commit it measured and whether the tree was dirty."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GIT = shutil.which("git")


def _common(path: Path):
    spec = importlib.util.spec_from_file_location(f"_common_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(GIT is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_a_result_records_head_and_whether_tracked_files_differ(tmp_path):
    common = _common(ROOT / "benchmarks" / "common.py")
    head = subprocess.run([GIT, "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    status = subprocess.run(
        [GIT, "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    )
    path = common.write_result({"meta": {"seconds": 3.5}, "figure": 1}, tmp_path / "r.json")
    written = json.loads(path.read_text())
    assert written == {
        "meta": {"seconds": 3.5, "commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())},
        "figure": 1,
    }
    taken = {"commit": "abc1234", "dirty": False}  # taken when the run started
    assert json.loads(common.write_result({}, tmp_path / "s.json", taken).read_text()) == {"meta": taken}


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "common.py", tmp_path / "benchmarks" / "common.py")
    common = _common(tmp_path / "benchmarks" / "common.py")
    assert common.ROOT == tmp_path
    assert common.code_version() == {"commit": "unknown", "dirty": None}


def test_every_benchmark_that_writes_a_result_writes_it_through_write_result():
    """No benchmark writes its JSON by another path (``write_json`` directly, ``json.dump``), so each records
    its commit; ``transfer.py`` writes its per-job cache with ``write_json``, not a result."""
    others = {}
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        text = path.read_text()
        if path.name in ("common.py", "real_llm_server.py"):  # the helper; server recordings are test data
            continue
        uses = [w for w in ("json.dump(", "write_json(") if w in text.replace("write_json(r, cache(job))", "")]
        if uses:
            others[path.name] = uses
    assert others == {}
