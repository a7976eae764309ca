"""The start of the Hydra apps (``llmrubric train|evaluate``, ``train.py``, ``evaluate.py``): their short
``--help``, the overrides checked before Hydra runs, and Hydra's own record of a run (``hydra/<app>/*.yaml``,
``<app>.log``) written to a staging folder that is moved into ``run_dir`` only when the run succeeds, so that a
failed run leaves a finished run's record as it was.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from llmrubric.config.loader import compose, register_configs
from llmrubric.config.paths import conf_path
from llmrubric.config.rubric_files import rubric_files
from llmrubric.io.errors import InputError, report

HELP_FLAGS = ("--help", "-h")
APP_SUMMARIES = {
    "train": "Train the calibrators of an experiment; write their checkpoints and folds to run_dir.",
    "evaluate": "Evaluate an experiment's checkpoints and baselines on held-out texts; write predictions and metrics "
    "to run_dir.",
}
HIDDEN_GROUPS = ("schemas", "hydra")  # the typed defaults of each group and Hydra's own: not the user's choices


def run_app(task, name: str, argv: list[str] | None = None) -> None:
    """Run the Hydra app ``task`` (a ``hydra.main`` function) as ``llmrubric <name> argv…``.

    Plain overrides are composed first, so that a bad one is one ``error:`` line (exit 2) like
    every other bad setting; ``rubric=<file.yaml>`` takes a rubric file anywhere; Hydra's flags
    (``--cfg job``, ``--multirun``) pass through. Hydra writes its record of the run to a staging
    folder, moved into ``run_dir`` when ``task`` returns (:func:`publish`) and removed otherwise.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in HELP_FLAGS for a in argv):
        print(app_help(name))
        return
    register_configs()
    try:
        argv = rubric_files(argv)
        cfg = None if any(a.startswith("-") for a in argv) else compose("config", argv)
    except InputError as e:
        sys.exit(report(e))
    own_dir = any(a.startswith("hydra.run.dir=") for a in argv)  # the user's choice of Hydra's folder is kept
    staging = Path(tempfile.mkdtemp(prefix=f"llmrubric-{name}-")) if cfg is not None and not own_dir else None
    saved = sys.argv
    sys.argv = [name, *argv, f"hydra.job.name={name}", *([f"hydra.run.dir={staging}"] if staging else [])]
    try:
        task()
        if staging is not None:
            publish(staging, Path(cfg.run_dir))
    finally:
        sys.argv = saved
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def publish(staging: Path, run_dir: Path) -> None:
    """Move Hydra's record of a finished run from ``staging`` into ``run_dir``: each config file replaces the
    previous run's (atomically), the log is appended to the previous runs' log."""
    _close_logs(staging)
    for source in sorted(p for p in staging.rglob("*") if p.is_file()):
        target = run_dir / source.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.suffix == ".log" and target.is_file():
            with target.open("ab") as log:
                log.write(source.read_bytes())
            continue
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        try:
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _close_logs(folder: Path) -> None:
    """Close the logging file handlers that write under ``folder`` (Hydra's ``<app>.log``), so that it is complete."""
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values() if hasattr(v, "handlers"))]
    for logger in loggers:
        for handler in list(logger.handlers):
            path = getattr(handler, "baseFilename", None)
            if path and Path(path).resolve().is_relative_to(folder.resolve()):
                handler.close()
                logger.removeHandler(handler)


def app_help(name: str) -> str:
    """``--help`` of a Hydra app: its usage, its config groups with their options and its top-level settings
    with their defaults and the comment of ``conf/config.yaml`` (read as text: nothing is composed or imported)."""
    lines = conf_path("config.yaml").read_text(encoding="utf-8").splitlines()
    groups, settings, block = [], [], None
    for line in lines:
        top = re.match(r"^([A-Za-z_]\w*):\s*(.*?)\s*(?:#\s*(.*))?$", line)
        entry = re.match(r"^\s+-\s+(\w+):\s*(\S+)\s*(?:#\s*(.*))?$", line)
        if top:
            block = top.group(1)
            if block not in ("defaults", *HIDDEN_GROUPS):
                settings.append(f"  {top.group(1)}={top.group(2)}" + (f"  {top.group(3)}" if top.group(3) else ""))
        elif entry and block == "defaults" and entry.group(1) not in HIDDEN_GROUPS:
            group = entry.group(1)
            options = sorted(p.stem for p in conf_path(group).glob("*.yaml"))
            note = f"  ({entry.group(3)})" if entry.group(3) else ""
            groups.append(f"  {group}={'|'.join(options)}  default: {entry.group(2)}{note}")
    return "\n".join(
        [
            f"usage: llmrubric {name} [key=value ...]   (python {name}.py [key=value ...]: the same)",
            "",
            APP_SUMMARIES.get(name, ""),
            "",
            "config groups (group=option; rubric= also takes a path to a rubric YAML file):",
            *groups,
            "",
            "settings (key=value; a group's own settings as group.key=value, e.g. trainer.lr=0.001):",
            *settings,
            "",
            f"`llmrubric {name} [overrides] --cfg job` prints the whole resolved config; conf/config.yaml and "
            "conf/<group>/*.yaml hold every setting with its comment.",
        ]
    )
