"""Evaluate trained checkpoints on held-out texts; print and write the metric table.

    llmrubric evaluate experiment=llm_rubric_real
    llmrubric evaluate experiment=llm_rubric_real report=full   # + the evaluation report

Writes to ``run_dir``: the predictions table (every question, every (text, judge) pair),
with ``protocol=systems|system_groups`` ``system_errors.csv`` (each held-out system's predicted and
human mean), ``metrics.json`` and ``metrics.md`` (main question: the model and the configured baselines;
under those two protocols also every method's system-level figures, ``systems``,
:func:`llmrubric.evaluation.transfer.system_metrics`; under ``protocol=system_groups`` also
``kendall_groups``, the Kendall within held-out groups averaged over the ``grouping_seeds`` groupings
that train.py trained, :func:`~llmrubric.evaluation.transfer.grouped_kendall`; an LLM baseline runs once per LLM source and on their mean when there are several, and is
skipped, with the reason recorded, when no source answered the main question).
With ``report=fast|full`` it also writes the report folder (``report.dir``, see
:mod:`llmrubric.report.build`), which trains its own models, so checkpoints are then optional.
Each finished evaluation is logged as an MLflow run (:mod:`llmrubric.experiments.tracking`; ``logger=none``: off).
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import hydra
import pandas as pd
from omegaconf import DictConfig

from llmrubric.config import CONF_PATH, VERSION_BASE, run_app
from llmrubric.data.splits import text_systems
from llmrubric.evaluation.metrics import evaluate, markdown_table, metric_names
from llmrubric.evaluation.transfer import grouped_kendall, pair_scores, shift_errors, system_means, system_metrics
from llmrubric.experiments.experiment import SYSTEM_PROTOCOLS, checked_once, prepare
from llmrubric.experiments.tracking import Tracker, metric_keys
from llmrubric.io.errors import InputError, reports_errors
from llmrubric.io.files import write_json, write_table, write_text
from llmrubric.io.guards import check_choice
from llmrubric.io.integrity import check_fits
from llmrubric.model.core.encoding import PAIR, with_round
from llmrubric.model.core.registry import capabilities
from llmrubric.scoring.intervals import (
    COVERAGE_BY,
    DEFAULT_COVERAGE,
    check_coverage,
    coverage_curve,
    coverage_figures,
    coverage_plot,
    with_intervals,
)
from llmrubric.scoring.leaderboard import rms

log = logging.getLogger("evaluate")
SYSTEM_ERRORS_FILE = "system_errors.csv"
COVERAGE_PLOT = "coverage.png"  # observed against nominal coverage of the conformal intervals (model=auto)


@hydra.main(config_path=CONF_PATH, config_name="config", version_base=VERSION_BASE)
@reports_errors
def evaluate_app(cfg: DictConfig) -> dict | None:
    from llmrubric.report.build import check_report_config, experiment_splits, report_from_config  # not for --help

    started = time.time()
    checked_once(cfg)
    run_dir = Path(cfg.run_dir)
    report = bool(cfg.report.enabled)
    rubric, splits = experiment_splits(cfg) if report else prepare(cfg, create_folds=False)
    if report:
        check_report_config(cfg, rubric)
    metrics = None
    if not report or all((run_dir / f"{s.name}.safetensors").is_file() for s in splits):
        metrics = evaluate_checkpoints(cfg, rubric, splits)
    else:
        log.info("no checkpoints in %s: only the report's own models are evaluated", run_dir)
    if report:
        curve = (metrics or {}).get("llm_rubric", {}).get("coverage_curve")
        coverage = {"curve": curve, "nominal": cfg.get("coverage", DEFAULT_COVERAGE)} if curve else None
        print(f"report written to {report_from_config(cfg, rubric, splits, coverage)}/")
    track(cfg, metrics, started)
    return metrics


def evaluate_checkpoints(cfg: DictConfig, rubric, splits) -> dict:
    """Every split's checkpoint and the baselines on its held-out texts; the figures use the first
    grouping's splits (all of them but under ``protocol=system_groups``), the Kendall within held-out
    groups every grouping's (:func:`grouping_figures`)."""
    from llmrubric.model.families.baselines import duplicates  # imported here: not for --help

    run_dir = Path(cfg.run_dir)
    parts, choices, skipped, rules, family, curve = predict_splits(cfg, rubric, splits)
    same = duplicates(list(cfg.baselines))
    first = [s for s in splits if s.grouping == 0]
    tables = {
        name: pd.concat([t for s, t in zip(splits, held) if s.grouping == 0], ignore_index=True)
        for name, held in parts.items()
    }
    annotations = pd.concat([s.test.annotations for s in first], ignore_index=True)
    metrics = {name: evaluate_predicted(table, annotations, rubric.main) for name, table in tables.items()}
    intervals = interval_figures(cfg, tables["llm_rubric"], annotations, rubric)
    if intervals:
        metrics["llm_rubric"]["intervals"] = intervals
    if curve:
        metrics["llm_rubric"]["coverage_curve"] = curve
        coverage_plot(curve, run_dir / COVERAGE_PLOT, f"{rubric.main.id}: conformal intervals")
    table = markdown_table(metrics, metric_names(rubric.main))
    header = (
        f"{cfg.name}: {rubric.main.id} on {metrics['llm_rubric']['n']} held-out (text, judge) pairs ({cfg.protocol})"
    )
    errors = (
        system_errors(tables["llm_rubric"], annotations, rubric.main, first)
        if cfg.protocol in SYSTEM_PROTOCOLS
        else None
    )
    systems = system_figures(cfg.protocol, tables, annotations, rubric.main, first)
    if systems and cfg.protocol == "system_groups":
        for name, figures in grouping_figures(parts, splits, rubric.main).items():
            systems[name].update(figures)
    table += system_table(systems)
    write_table(tables["llm_rubric"], run_dir / f"predictions.{cfg.predictions_format}")
    if errors is not None:
        write_table(errors, run_dir / SYSTEM_ERRORS_FILE)
        print(
            f"errors of {len(errors)} held-out systems (RMS {rms(errors.error):.3f}) written to"
            f" {run_dir / SYSTEM_ERRORS_FILE}: `llmrubric leaderboard build --shift-errors` turns them into intervals for new systems"
        )
    notes = "".join(f"\n- {name} skipped: {reason}" for name, reason in skipped.items())
    notes += "".join(f"\n- {name}: same as {other} on every data set (listed once)" for name, other in same.items())
    notes += "".join(
        f"\n- {name}: {m['not_predicted']} pairs not predicted (no LLM answer to {rubric.main.id} from any source)"
        for name, m in metrics.items()
        if m.get("not_predicted")
    )
    notes += "".join(f"\n- model=auto, {split}: weights {_rounded(c['weights'])}" for split, c in choices.items())
    notes += "".join(f"\n- llm_rubric, {split}: label rule {_rule_note(r)}" for split, r in rules.items())
    notes += interval_notes(intervals, rubric.main.id)
    write_json(
        {
            "experiment": cfg.name,
            "family": family,
            "question": rubric.main.id,
            "protocol": cfg.protocol,
            "methods": metrics,
            "skipped": skipped,
            **({"same_as": same} if same else {}),
            **({"systems": systems} if systems else {}),
            **({"auto": choices} if choices else {}),
            **({"label_rules": rules} if rules else {}),
        },
        run_dir / "metrics.json",
    )
    write_text(f"# {header}\n\n{table}\n" + (f"{notes}\n" if notes else ""), run_dir / "metrics.md")
    print(f"\n{header}\n{table}\n{notes}\nwritten to {run_dir}/")
    return metrics


def interval_notes(intervals: dict, main: str) -> str:
    """metrics.md's lines of the held-out intervals (:func:`interval_figures`): the main question's, then the others'."""
    if not intervals:
        return ""
    figures = {main: intervals, **intervals.get("other_questions", {})}
    names = {q: q for q in figures} | {main: f"{main} (main question, nominal {intervals['nominal']:.2f})"}
    return "".join(
        f"\n- intervals of {names[q]}: coverage {f['coverage']:.3f}, mean width {f['width']:.3f} ({f['pairs']} pairs)"
        for q, f in figures.items()
    )


def interval_figures(cfg: DictConfig, predictions: pd.DataFrame, annotations: pd.DataFrame, rubric) -> dict:
    """Coverage and mean width of the held-out intervals of the main question, with ``other_questions``' where
    they have intervals ({} without a calibration)."""
    main = coverage_figures(predictions, annotations, rubric.main)
    if not main:
        return {}
    others = {q.id: coverage_figures(predictions, annotations, q) for q in rubric.questions if q.id != rubric.main.id}
    others = {q: figures for q, figures in others.items() if figures}
    nominal, by = cfg.get("coverage", DEFAULT_COVERAGE), cfg.get("coverage_by", "pooled")
    return {"nominal": nominal, "by": by, **main, **({"other_questions": others} if others else {})}


def predict_splits(cfg: DictConfig, rubric, splits) -> tuple[dict, dict, dict, dict, str, list]:
    """Held-out predictions of every split's checkpoint (``llm_rubric``, with the ``label`` of its rule on an
    ordered main question and the ``lo``/``hi`` of its conformal intervals) and of each configured baseline fitted
    on the split's training texts: ``{method: [table per split]}``, model=auto's choices per split, the baselines
    skipped with their reason, each checkpoint's label rule (ordered main question), the registry name of the family
    fitted (``model.family``: the same in every split) and the intervals' coverage curve over the splits
    (:func:`~llmrubric.scoring.intervals.coverage_curve`; [] without a calibration)."""
    from llmrubric.model.core.checkpoints import load_model
    from llmrubric.model.core.label_rule import rule_of, with_labels
    from llmrubric.model.families.baselines import expand_baselines, make_method  # imported here: not for --help

    run_dir = Path(cfg.run_dir)
    predictions, choices, rules, family, held_out = {"llm_rubric": []}, {}, {}, None, []
    coverage = (check_coverage(cfg.get("coverage", DEFAULT_COVERAGE)), cfg.get("coverage_by", "pooled"))
    check_choice("coverage_by", coverage[1], COVERAGE_BY)
    features = pd.concat(
        [t.features[t.features.question_id == rubric.main.id] for s in splits for t in (s.train, s.test)],
        ignore_index=True,
    )
    baselines, skipped = expand_baselines(list(cfg.baselines), rubric, features)
    for name, reason in skipped.items():
        log.warning("baseline %s skipped: %s", name, reason)
    for split in splits:
        path = run_dir / f"{split.name}.safetensors"
        if not path.is_file():
            raise InputError("checkpoint not found; run train.py with the same config first", file=str(path))
        model = load_model(path)
        check_fits(model, rubric, split.train.text_ids, str(path))
        family = model.family
        predicted = with_labels(model.predict(split.test), rubric.main, rule_of(model))
        predictions["llm_rubric"].append(with_intervals(predicted, model, *coverage))
        if split.grouping == 0:
            held_out.append((model, predicted, split.test.annotations))
        if rubric.main.ordered:
            rules[split.name] = rule_of(model).to_dict()
        if capabilities(model).members:
            choices[split.name] = model.choice()
        for name in [b for b in baselines if b not in skipped]:
            try:
                method = make_method(name, rubric, cfg.seed).fit(split.train)
                predictions.setdefault(name, []).append(method.predict(split.test))
            except InputError as e:  # a baseline that does not apply to these data is recorded, not fatal
                skipped[name] = f"{split.name}: {e}"
                predictions.pop(name, None)
                log.warning("baseline %s skipped: %s", name, skipped[name])
    return predictions, choices, skipped, rules, family, coverage_curve(held_out, rubric.main, by=coverage[1])


def grouping_figures(parts: dict, splits, question) -> dict:
    """Per method (``parts``: ``{method: [held-out predictions per split]}``): :func:`grouped_kendall`
    over the groupings of ``splits`` (``protocol=system_groups``), each split's held-out systems one group."""
    out = {}
    groupings = sorted({s.grouping for s in splits})
    for name, tables in parts.items():
        means, groups = [], []
        for g in groupings:
            mine = [(s, t) for s, t in zip(splits, tables) if s.grouping == g]
            held = pd.concat([text_systems(s.test) for s, _ in mine])
            table = pd.concat([t for _, t in mine], ignore_index=True)
            annotations = pd.concat([s.test.annotations for s, _ in mine], ignore_index=True)
            ann = predicted_annotations(table, annotations, question)[0]
            means.append(system_means(pair_scores(table, ann, question, held)))
            groups.append(pd.Series({system: s.name for s, _ in mine for system in text_systems(s.test).unique()}))
        figures = grouped_kendall(means, groups)
        out[name] = {
            "kendall_groups": figures["kendall_groups"],
            "groupings": figures["groupings"],
            **(
                {"kendall_groups_reason": figures["kendall_groups_reason"]}
                if "kendall_groups_reason" in figures
                else {}
            ),
        }
    return out


def predicted_annotations(predictions: pd.DataFrame, annotations: pd.DataFrame, question) -> tuple[pd.DataFrame, int]:
    """The annotations of ``question`` whose pair has a prediction, and how many have none (an LLM
    baseline has no prediction for a text that no LLM source answered)."""
    ann = with_round(annotations)
    ann = ann[ann.question_id == question.id]
    keys = pd.MultiIndex.from_frame(with_round(predictions[predictions.question_id == question.id])[PAIR])
    predicted = pd.MultiIndex.from_frame(ann[PAIR]).isin(keys)
    if not predicted.any():
        raise InputError(f"no held-out pair of {question.id} was predicted")
    return ann[predicted], int((~predicted).sum())


def evaluate_predicted(predictions: pd.DataFrame, annotations: pd.DataFrame, question) -> dict:
    """:func:`evaluate` on the annotated pairs a method predicted, with ``not_predicted``: the count of the others."""
    ann, missing = predicted_annotations(predictions, annotations, question)
    return {**evaluate(predictions, ann, question), "not_predicted": missing}


def _rounded(weights: dict) -> dict:
    return {name: round(w, 3) for name, w in weights.items()}


def _rule_note(rule: dict) -> str:
    """``name`` (fitted on …, cut points) of a label rule's record."""
    cuts = ", ".join(c if isinstance(c, str) else f"{c:.3f}" for c in rule.get("cuts", []))
    return f"{rule['name']} ({rule.get('fitted_on', '?')}" + (f"; cut points {cuts})" if cuts else ")")


def system_errors(predictions: pd.DataFrame, annotations: pd.DataFrame, question, splits) -> pd.DataFrame:
    """Each held-out system's human and predicted means and their error (leave-one-system-out splits),
    for the shift intervals of ``llmrubric leaderboard build --shift-errors``."""
    return shift_errors(predictions, annotations, question, pd.concat([text_systems(s.test) for s in splits]))


def system_figures(protocol: str, tables: dict, annotations: pd.DataFrame, question, splits) -> dict | None:
    """Under a protocol whose folds are whole systems (ordered main question): every method's
    :func:`system_metrics`, each split's held-out systems one group; else None."""
    if protocol not in SYSTEM_PROTOCOLS or not question.ordered:
        return None
    held = [text_systems(s.test) for s in splits]
    groups = pd.Series({system: s.name for s, part in zip(splits, held) for system in part.unique()})
    return {
        name: system_metrics(t, predicted_annotations(t, annotations, question)[0], question, pd.concat(held), groups)
        for name, t in tables.items()
    }


SYSTEM_FIGURES = ("rms_error", "kendall", "kendall_within_groups", "kendall_groups", "coverage", "width")


def system_table(systems: dict | None) -> str:
    """The markdown table of :func:`system_figures` after a blank line (empty without them)."""
    if not systems:
        return ""
    n = next(iter(systems.values()))
    title = (
        f"system means of {n['systems']} held-out systems in {n['groups']} groups (shift intervals: coverage, width)"
    )
    return f"\n\n{title}\n\n{markdown_table(systems, SYSTEM_FIGURES)}"


def track(cfg: DictConfig, metrics: dict | None, started: float) -> None:
    """Log the finished evaluation to MLflow (``logger=none``: off): config, ``test/<metric>``
    (baselines: ``test/<metric>/<method>``, characters MLflow refuses replaced by ``_``), predictions and metric tables, the report folder."""
    run_dir = Path(cfg.run_dir)
    with Tracker.from_config(cfg).run("evaluate", nested=True, tags={"job": "evaluate"}, start_time=started) as run:
        run.log_config(cfg)
        if metrics is not None:
            for name, values in metrics.items():
                run.log_metrics(
                    metric_keys(values, "test", None if name == "llm_rubric" else re.sub(r"[^\w\-. /]", "_", name))
                )
            files = [f"predictions.{cfg.predictions_format}", "metrics.json", "metrics.md"]
            files += [SYSTEM_ERRORS_FILE] if cfg.protocol in SYSTEM_PROTOCOLS else []
            files += [COVERAGE_PLOT] if (run_dir / COVERAGE_PLOT).is_file() else []
            for file in files:
                run.log_artifact(run_dir / file)
        report = cfg.get("report")
        if report is not None and report.get("enabled") and Path(report.dir).is_dir():
            run.log_artifacts(report.dir, "report")


def main(argv: list[str] | None = None) -> None:
    """``llmrubric evaluate [overrides…]`` (and ``python evaluate.py``): Hydra overrides and flags in ``argv``."""
    run_app(evaluate_app, "evaluate", argv)
