"""The evaluation report: significance, calibration, ablations, per-question, oracles, learning curves.

    python evaluate.py report=full experiment=llm_rubric_real

:func:`build_report` trains every variant the chosen sections need under the experiment's
protocol (:mod:`llmrubric.experiments.variants`; which ones: :mod:`llmrubric.report.plan`), computes
the sections from their predictions (:mod:`llmrubric.report.sections`, :mod:`llmrubric.report.calibration`)
and writes one self-contained folder (:mod:`llmrubric.report.render`): ``report.md``, ``report.html``
(tables and figures embedded), ``report.json`` and one CSV per table (every number), and
``figures/*.png``. The folder is written under a temporary name and renamed into place, so a
failure leaves no partial report. :func:`report_from_config` does the same from a composed Hydra
config and returns the folder (what an MLflow run logs as artifacts).

Learned methods are trained with ``seeds`` seeds; a method's prediction for a pair is the
mean of its seeds' predicted distributions (and point predictions), and the spread of the
single-seed metrics is reported beside it.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from llmrubric.experiments.experiment import (
    FOLDS_FILE,
    Split,
    load_data,
    load_rubric,
    make_folds,
    prepare,
    splits_from_folds,
)
from llmrubric.experiments.variants import run_variants
from llmrubric.io.files import write_folder
from llmrubric.io.rubric import Rubric
from llmrubric.report.coverage import coverage_section
from llmrubric.report.plan import ReportPlan
from llmrubric.report.render import report_files
from llmrubric.report.results import Results
from llmrubric.report.sections import build_sections
from llmrubric.report.settings import ReportSettings, check_questions

log = logging.getLogger(__name__)


def build_report(
    rubric: Rubric,
    splits: list[Split],
    settings: ReportSettings,
    out_dir: str | Path,
    model: dict | None = None,
    trainer: dict | None = None,
    reference: dict | None = None,
    title: str | None = None,
    meta: dict | None = None,
    coverage: dict | None = None,
) -> Path:
    """Train the variants the sections need, compute the sections and write the report folder; returns its path.
    ``coverage`` (``{"curve": …, "nominal": …}`` of the experiment's checkpoints) adds the coverage section."""
    start = time.perf_counter()
    plan = ReportPlan(rubric, splits, settings)
    model = {**(model or {}), **settings.model}
    runs = run_variants(plan.requests(), rubric, splits, model, trainer or {}, settings.workers)
    timings = {"training": round(time.perf_counter() - start, 1)}
    sections, seconds = build_sections(Results(plan, runs, reference))
    timings.update(seconds)
    if coverage and coverage.get("curve"):
        sections.append(coverage_section(coverage["curve"], rubric.main.id, coverage["nominal"]))
    meta = {
        **(meta or {}),
        "question": rubric.main.id,
        "held-out pairs": int((plan.annotations.question_id == rubric.main.id).sum()),
        "splits": len(splits),
        "seeds": settings.seeds,
        "permutations": settings.permutations,
        "bootstrap resamples": settings.bootstrap,
        "model settings changed for the report": settings.model or "none",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "",
        "seconds": round(time.perf_counter() - start, 1),
        "seconds per step": ", ".join(f"{k} {v}" for k, v in timings.items()),
    }
    files = report_files(title or f"Evaluation report: {rubric.main.id}", meta, sections)
    path = write_folder(out_dir, files)
    log.info("report written to %s in %.0fs", path, time.perf_counter() - start)
    return path


def experiment_splits(cfg: DictConfig) -> tuple[Rubric, list[Split]]:
    """The experiment's rubric and splits: the folds saved in ``run_dir`` when present, else made from the config (not saved)."""
    if cfg.data.get("test") or (Path(cfg.run_dir) / FOLDS_FILE).exists():
        return prepare(cfg, create_folds=False)
    rubric = load_rubric(cfg)
    train, test = load_data(cfg, rubric)
    return rubric, splits_from_folds(cfg, make_folds(cfg, train), train, test)


def settings_from_config(cfg: DictConfig) -> ReportSettings:
    """The ``report.*`` keys of a composed config as :class:`ReportSettings`."""
    return ReportSettings.from_dict(OmegaConf.to_container(cfg.report, resolve=True))


def check_report_config(cfg: DictConfig, rubric: Rubric) -> ReportSettings:
    """Validate ``report.*`` before anything is trained or written; InputError names the key."""
    settings = settings_from_config(cfg)
    check_questions(settings, rubric)
    return settings


def report_from_config(cfg: DictConfig, rubric: Rubric, splits: list[Split], coverage: dict | None = None) -> Path:
    """The report of an experiment config (``report=fast|full``); returns the folder (to log as MLflow artifacts).
    Under ``protocol=system_groups`` on the first grouping's splits only (the report trains its own models);
    ``coverage``: the checkpoints' coverage curve (:func:`build_report`)."""
    splits = [s for s in splits if s.grouping == 0]
    settings = settings_from_config(cfg)
    reference = OmegaConf.to_container(cfg.reference, resolve=True) if cfg.get("reference") else {}
    meta = {"experiment": cfg.name, "protocol": cfg.protocol, "report mode": cfg.report.name}
    title = f"{cfg.name}: evaluation report ({rubric.main.id}, {cfg.protocol})"
    return build_report(
        rubric, splits, settings, cfg.report.dir, dict(cfg.model), dict(cfg.trainer), reference, title, meta, coverage
    )
