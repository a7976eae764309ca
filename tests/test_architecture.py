"""The code's shape: import layers (import-linter), no private third-party imports, short functions."""

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
    """``lint-imports`` on the package under ``root`` with the contracts of ``root/pyproject.toml``."""
    env = {"PYTHONPATH": f"{root}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (pip install -e '.[test]')")
def test_packages_import_only_the_layers_below_and_nothing_private():
    result = _lint_imports()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "2 kept, 0 broken" in result.stdout


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (pip install -e '.[test]')")
def test_the_contracts_catch_an_upward_import_and_a_private_one(tmp_path):
    """The same contracts on a copy of the package with one upward and one private import break."""
    shutil.copytree(ROOT / "llmrubric", tmp_path / "llmrubric", ignore=shutil.ignore_patterns("__pycache__", "conf"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / "llmrubric" / "io" / "errors.py", "a") as f:
        f.write(
            "\nfrom llmrubric.model import engine  # noqa\nfrom optuna.storages._heartbeat import is_heartbeat_enabled  # noqa\n"
        )
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "0 kept, 2 broken" in result.stdout
    assert "llmrubric.io.errors -> llmrubric.model.engine" in result.stdout
    assert "optuna.storages._heartbeat" in result.stdout


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
