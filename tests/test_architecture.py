"""The code's shape: import layers and ``model.auto`` on top of ``model/`` (import-linter), no private
third-party imports, short functions."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80
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


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (pip install -e '.[test]')")
def test_packages_import_only_the_layers_below_and_nothing_private():
    result = _lint_imports()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (pip install -e '.[test]')")
def test_the_contracts_catch_an_upward_import_a_private_one_and_one_of_model_auto(tmp_path):
    """The same contracts on a copy of the package with one upward import, one private import and a module of
    ``model/`` that imports ``model.auto`` break."""
    root = _copy(tmp_path)
    with open(root / "llmrubric" / "io" / "errors.py", "a") as f:
        f.write(
            "\nfrom llmrubric.model import engine  # noqa\nfrom optuna.storages._heartbeat import is_heartbeat_enabled  # noqa\n"
        )
    (root / "llmrubric" / "model" / "planted.py").write_text("import llmrubric.model.auto  # noqa\n")
    result = _lint_imports(root)
    assert result.returncode != 0
    assert "0 kept, 3 broken" in result.stdout
    assert "llmrubric.io.errors -> llmrubric.model.engine" in result.stdout
    assert "optuna.storages._heartbeat" in result.stdout
    assert "llmrubric.model.planted -> llmrubric.model.auto" in result.stdout


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_function_in_the_package_is_longer_than_80_lines():
    long = [
        f"{path.relative_to(ROOT)}:{line} {name} ({n} lines)"
        for path in sorted((ROOT / "llmrubric").rglob("*.py"))
        for name, line, n in _functions(path)
        if n > MAX_FUNCTION_LINES
    ]
    assert not long, "functions over 80 lines:\n" + "\n".join(long)
