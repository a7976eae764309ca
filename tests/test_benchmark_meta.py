"""benchmarks/common.py: every benchmark result records the commit it measured and whether the tree was dirty;
benchmarks/README.md keeps its shape: short, sections by question, every results file read by a page."""

from __future__ import annotations

import importlib.util
import json
import re
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


def _repo(tmp_path: Path) -> Path:
    """A git checkout with benchmarks/common.py and one tracked file, committed."""
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "common.py", repo / "benchmarks" / "common.py")
    (repo / "code.py").write_text("x = 1\n")
    (repo / "benchmarks" / "results" / "r.json").write_text("{}\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"]):
        subprocess.run([GIT, *args], cwd=repo, check=True, capture_output=True)
    return repo


@pytest.mark.skipif(GIT is None, reason="no git")
def test_a_result_records_the_commit_and_the_tree_at_its_start_and_end(tmp_path):
    repo = _repo(tmp_path)
    common = _common(repo / "benchmarks" / "common.py")
    head = subprocess.run([GIT, "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True).stdout
    start = common.code_version()
    out = repo / "benchmarks" / "results" / "r.json"
    written = json.loads(common.write_result({"meta": {"seconds": 3.5}, "figure": 1}, out, start).read_text())
    assert written == {
        "meta": {"seconds": 3.5, "commit": head.strip(), "dirty": False, "diff": "", "dirty_at_end": False},
        "figure": 1,
    }
    again = common.write_result({"figure": 2}, out, start)  # a second result of the same run: results are not code
    assert json.loads(again.read_text())["meta"]["dirty_at_end"] is False


@pytest.mark.skipif(GIT is None, reason="no git")
def test_a_result_whose_code_changed_during_the_run_is_refused_and_says_what_changed(tmp_path):
    repo = _repo(tmp_path)
    common = _common(repo / "benchmarks" / "common.py")
    start = common.code_version()
    (repo / "code.py").write_text("x = 2\n")  # an edit while the run measures
    out = repo / "benchmarks" / "results" / "s.json"
    with pytest.raises(common.InputError, match=r"s\.json: not written: the code changed while the run measured it"):
        common.write_result({"figure": 1}, out, start)
    assert not out.exists()
    dirty = common.code_version()  # a run that starts and ends on the same uncommitted tree is written, and says so
    meta = json.loads(common.write_result({}, out, dirty).read_text())["meta"]
    assert meta["dirty"] is True and meta["dirty_at_end"] is True and len(meta["diff"]) == 12
    subprocess.run([GIT, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "d"], cwd=repo, check=True)
    with pytest.raises(common.InputError, match="re-run it at one commit"):  # committed meanwhile: another commit
        common.write_result({}, out, dirty)


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "common.py", tmp_path / "benchmarks" / "common.py")
    common = _common(tmp_path / "benchmarks" / "common.py")
    assert common.ROOT == tmp_path
    assert common.code_version() == {"commit": "unknown", "dirty": None, "diff": None}


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


BENCHMARKS_README = ROOT / "benchmarks" / "README.md"
RESULTS = ROOT / "benchmarks" / "results"
README_MAX_LINES = 650  # the results page answers questions with current figures; history lives in git
ISSUE_HEADING = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


def _headings(text: str) -> list[str]:
    """The Markdown headings of a text, outside fenced code blocks."""
    found, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            found.append(line)
    return found


def test_the_results_page_stays_short():
    lines = BENCHMARKS_README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"benchmarks/README.md has {len(lines)} lines (at most {README_MAX_LINES}): one section per question with "
        "its current figures; the history of a default goes to the 'what was tried' list, old results to git"
    )


def test_no_heading_of_the_results_page_names_an_issue():
    named = [h for h in _headings(BENCHMARKS_README.read_text(encoding="utf-8")) if ISSUE_HEADING.search(h)]
    assert named == [], f"benchmarks/README.md: headings name an issue (head a section by its question): {named}"


def test_headings_are_found_and_issue_headings_caught():
    text = "# Title\n```bash\n# Issue 3: a comment in code\n```\n## Issue 49: the default\n### Intervals\n"
    assert _headings(text) == ["# Title", "## Issue 49: the default", "### Intervals"]
    assert [h for h in _headings(text) if ISSUE_HEADING.search(h)] == ["## Issue 49: the default"]


def test_every_results_file_is_read_by_a_section_or_a_doc():
    """A file under benchmarks/results that no page names is a leftover: delete it (git keeps it)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), BENCHMARKS_README]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    files = [path for path in sorted(RESULTS.rglob("*")) if path.is_file()]
    assert files, "no results files found"
    unread = [str(path.relative_to(RESULTS)) for path in files if path.name not in text]
    assert unread == [], f"benchmarks/results files that no section or doc reads: {unread}"
