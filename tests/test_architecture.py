"""The code's shape: import layers and ``model.auto`` on top of ``model/`` (import-linter), no private
third-party imports, no import cycle between modules, short functions."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300  # a class longer than this holds several jobs (issue 48)
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path = ROOT) -> subprocess.CompletedProcess:
    """``lint-imports`` run in ``root`` as its docs say, with no ``PYTHONPATH``: the package under ``root``, the
    contracts of ``root/pyproject.toml`` and the contract type ``root/import_contracts.py``."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy(tmp_path: Path) -> Path:
    """A copy of the package, ``pyproject.toml`` and ``import_contracts.py`` in ``tmp_path``."""
    shutil.copytree(ROOT / "llmrubric", tmp_path / "llmrubric", ignore=shutil.ignore_patterns("__pycache__", "conf"))
    for name in ("pyproject.toml", "import_contracts.py"):
        shutil.copy(ROOT / name, tmp_path)
    return tmp_path


@pytest.mark.slow
@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (pip install -e '.[test]')")
def test_packages_import_only_the_layers_below_and_nothing_private():
    result = _lint_imports()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.slow
@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (pip install -e '.[test]')")
def test_the_contracts_catch_an_upward_import_a_private_one_and_one_of_model_auto(tmp_path):
    """The same contracts on a copy of the package with one upward import, one private import and a module of
    ``model/core/`` that imports ``model.auto`` break."""
    root = _copy(tmp_path)
    with open(root / "llmrubric" / "io" / "errors.py", "a") as f:
        f.write(
            "\nfrom llmrubric.model.families.network import engine  # noqa\nfrom optuna.storages._heartbeat import is_heartbeat_enabled  # noqa\n"
        )
    (root / "llmrubric" / "model" / "core" / "planted.py").write_text("import llmrubric.model.auto  # noqa\n")
    result = _lint_imports(root)
    assert result.returncode != 0
    assert "0 kept, 3 broken" in result.stdout
    assert "llmrubric.io.errors -> llmrubric.model.families.network.engine" in result.stdout
    assert "optuna.storages._heartbeat" in result.stdout
    assert "llmrubric.model.core.planted -> llmrubric.model.auto" in result.stdout


GRAPH = (
    "import json, grimp; g = grimp.build_graph('llmrubric', cache_dir=None); "
    "print(json.dumps([[a, b] for a in g.modules for b in g.find_modules_directly_imported_by(a)]))"
)


def _imports(root: Path) -> set[tuple[str, str]]:
    """(importer, imported) for every import between two modules of the package under ``root``, as grimp (which
    import-linter uses) finds them: imports inside functions and ``TYPE_CHECKING`` blocks included, plus the
    packages each import runs (:func:`_with_packages`)."""
    done = subprocess.run(
        [sys.executable, "-c", GRAPH], cwd=root, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return _with_packages({(a, b) for a, b in json.loads(done.stdout)})


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _with_packages(imports: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """``imports`` with an edge from each importer to every package above the imported module that is not above
    the importer: importing ``a.b.c`` runs ``a/b/__init__.py`` first, which grimp does not count as an import."""
    implied = {(a, p) for a, b in imports for p in _ancestors(b) if p != a and p not in _ancestors(a)}
    return imports | implied


def _cycles(imports: set[tuple[str, str]]) -> list[list[str]]:
    """The modules of each import cycle: the strongly connected components with more than one module."""
    modules = sorted({m for edge in imports for m in edge})
    index = {m: i for i, m in enumerate(modules)}
    rows, cols = np.array([[index[a], index[b]] for a, b in imports]).T
    graph = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(modules), len(modules)))
    _, component = connected_components(graph, directed=True, connection="strong")
    groups = [[m for m, c in zip(modules, component) if c == k] for k in set(component)]
    return sorted(g for g in groups if len(g) > 1)


def test_no_import_cycle_between_modules_of_the_package():
    imports = _imports(ROOT)
    assert _cycles(imports) == []


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    root = _copy(tmp_path)
    with open(root / "llmrubric" / "io" / "errors.py", "a") as f:  # llmrubric.io.files imports errors at its top
        f.write("\n\ndef planted():\n    import llmrubric.io.files  # noqa\n")
    imports = _imports(root)
    assert ("llmrubric.io.errors", "llmrubric.io.files") in imports
    assert any({"llmrubric.io.errors", "llmrubric.io.files"} <= set(c) for c in _cycles(imports))


def test_a_cycle_through_the_package_an_import_runs_is_found(tmp_path):
    """Importing ``scoring.leaderboard.reading`` runs ``scoring/leaderboard/__init__.py``, which imports ``board``,
    whose ``build`` imports ``scoring.levels`` inside the function: the cycle ``levels`` had until it read its
    table through ``io.system_values``."""
    root = _copy(tmp_path)
    with open(root / "llmrubric" / "scoring" / "levels.py", "a") as f:
        f.write("\n\ndef planted():\n    from llmrubric.scoring.leaderboard.reading import read_leaderboard  # noqa\n")
    imports = _imports(root)
    assert ("llmrubric.scoring.levels", "llmrubric.scoring.leaderboard") in imports
    cycle = {"llmrubric.scoring.levels", "llmrubric.scoring.leaderboard", "llmrubric.scoring.leaderboard.board"}
    assert any(cycle <= set(c) for c in _cycles(imports))


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


@pytest.mark.slow
def test_no_function_in_the_package_is_longer_than_80_lines():
    long = [
        f"{path.relative_to(ROOT)}:{line} {name} ({n} lines)"
        for path in sorted((ROOT / "llmrubric").rglob("*.py"))
        for name, line, n in _functions(path)
        if n > MAX_FUNCTION_LINES
    ]
    assert not long, "functions over 80 lines:\n" + "\n".join(long)


@pytest.mark.slow
def test_no_class_in_the_package_is_longer_than_300_lines():
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted((ROOT / "llmrubric").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    ]
    assert not long, "classes over 300 lines:\n" + "\n".join(long)
