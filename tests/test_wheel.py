"""The installed package works without the repository: build the wheel, install it into a fresh
virtual environment outside the checkout, and run the CLI from a folder that is not the checkout."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from setuptools import find_packages
from support.paths import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
FAST = [
    "logger=none",
    "model.ensemble=1",
    "model.auto.intervals=main",  # the main question's intervals only (support/settings.py)
    "model.auto.folds=3",
    "trainer.pretrain_epochs=2",
    "trainer.finetune_epochs=2",
    "trainer.patience=1",
]


def data_packages() -> set[str]:
    """The folders of data files, as the namespace packages the wheel ships them in."""
    folders = [
        (d, "llmrubric.conf." + ".".join(d.relative_to(ROOT / "conf").parts)) for d in (ROOT / "conf").rglob("*")
    ]
    folders.append((ROOT / "llmrubric" / "report" / "templates", "llmrubric.report.templates"))
    return {name for d, name in folders if d.is_dir() and any(f.suffix != ".pyc" for f in d.iterdir() if f.is_file())}


def test_every_package_and_data_folder_of_the_source_tree_is_listed_for_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    code = set(find_packages(str(ROOT), include=["llmrubric*"])) | {"llmrubric.conf"}
    assert code | data_packages() == listed


def sh(*args, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{args}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_the_wheel_trains_evaluates_and_scores_outside_the_repository(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONWARNINGS"] = "ignore"
    source = tmp_path / "source"  # the tracked sources only: nothing the checkout has built or cached
    for name in ("llmrubric", "conf"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    sh(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        tmp_path / "dist",
        source,
        cwd=tmp_path,
        env=env,
    )
    (wheel,) = (tmp_path / "dist").glob("llmrubric-*.whl")

    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path, env=env)
    python, site = (
        venv / "bin" / "python",
        Path(
            sh(
                venv / "bin" / "python",
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                cwd=tmp_path,
                env=env,
            ).stdout.strip()
        ),
    )
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]  # dependencies, not the checkout
    (site / "dependencies.pth").write_text("\n".join(deps) + "\n")
    sh(python, "-m", "pip", "install", "-q", "--no-deps", wheel, cwd=tmp_path, env=env)

    work = tmp_path / "work"
    work.mkdir()
    where = sh(python, "-c", "import llmrubric; print(llmrubric.__file__)", cwd=work, env=env).stdout.strip()
    assert Path(where).is_relative_to(venv), where
    cli = venv / "bin" / "llmrubric"
    assert "train" in sh(cli, "--help", cwd=work, env=env).stdout
    sh(
        cli, "data", "simulate", "data/simulated", "--texts", "60", "--judges", "6", cwd=work, env=env
    )  # the demo's data
    sh(cli, "train", "experiment=demo", *FAST, cwd=work, env=env)
    evaluated = sh(cli, "evaluate", "experiment=demo", *FAST, cwd=work, env=env)
    assert "| llm_rubric |" in evaluated.stdout and (work / "outputs" / "demo" / "metrics.json").is_file()
    data = work / "data" / "simulated"
    sh(
        cli,
        "score",
        "texts",
        "outputs/demo/fold0.safetensors",
        data / "features.csv",
        "--texts",
        data / "texts.csv",
        "--out",
        "scores.csv",
        "--no-progress",
        cwd=work,
        env=env,
    )
    assert (work / "scores.csv").read_text().count("\n") > 60
