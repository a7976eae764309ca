"""``llmrubric label plan``: how many texts of each new system humans should label, before they label
(:mod:`llmrubric.scoring.label_plan`).

The checkpoint scores the new systems' texts as ``llmrubric score texts`` does; the plan is for the interval
``leaderboard build --levels --annotations`` gives (the level with PPI++; PPI++ alone for a model without a level).
Settings: ``plan`` of ``conf/labels/default.yaml`` (or ``--config``); flags override them.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_outputs, check_range

ASSUMPTIONS = (
    "labelled texts are drawn uniformly at random from each system's texts",
    "label = calibrated score + a system offset + a residual uncorrelated with the score, of SD {sd:.4g} ({source})",
    "estimator: the system level's prior updated by PPI++ (ppi_py, power-tuned lambda = 1 / (1 + k / (N - k)), "
    "variance lambda^2 var f / (N - k) + var(Y - lambda f) / k); PPI++ alone for a system without a level",
    "Student's small-sample widening as the leaderboard applies it ({small_sample})",
    "from {checked_from} labels on, planned for PPI++ alone: the interval the leaderboard's transport check falls "
    "back to when a system's labels do not show its level holds",
    "width: met in {assurance:.0%} of draws (the residual variance at its chi-square quantile, normal residuals)",
    "difference: two-sided test at alpha = {alpha:g} of two systems' estimates (independent labels), "
    "power {power:.0%}, at the residual variance's mean",
)


def add_plan_parser(label) -> None:
    p = label.add_parser(
        "plan",
        help="how many texts of each new system to label: for an interval width, or to tell two systems apart",
        description="Plan how many texts of each new system to label before anyone labels: the checkpoint scores "
        "the systems' texts, and the plan is for the interval of a system's mean that the leaderboard gives with "
        "labels (the system level with PPI++; PPI++ alone for a model without a level), for a target width or a "
        "difference between two systems. Settings come from conf/labels/default.yaml (or --config); flags override them.",
    )
    p.add_argument("checkpoint", help="calibrator checkpoint (.safetensors)")
    p.add_argument("features", help="features table of the new systems' texts")
    p.add_argument("--texts", required=True, help="texts table (text_id, system_id)")
    p.add_argument("--width", type=float, help="target width of each system mean's interval (label scale)")
    p.add_argument("--difference", type=float, help="difference of two system means to detect (label scale)")
    p.add_argument("--annotations", help="pilot human labels of some of these texts: the residual SD from them")
    p.add_argument("--out", help="plan table: one row per system (k_width, planned_width, k_difference)")
    p.add_argument("--config", help="settings YAML (default: conf/labels/default.yaml)")
    p.add_argument(
        "--trusted-judges",
        dest="trusted_judges",
        nargs="+",
        metavar="JUDGE",
        help="the judges whose predictions the system mean is over (default: every judge)",
    )
    p.add_argument(
        "--assurance", type=float, help="share of draws whose interval is to be at most --width (default 0.9)"
    )
    p.add_argument("--power", type=float, help="power to detect --difference (default 0.8)")
    p.add_argument(
        "--alpha",
        type=float,
        help="intervals and the test at 1 - alpha (default: the leaderboard's alpha, conf/scoring/default.yaml)",
    )
    p.add_argument(
        "--residual-sd",
        dest="residual_sd",
        type=float,
        help="SD of labels around the calibrated predictions (default: from --annotations, else the checkpoint)",
    )
    p.set_defaults(run=run_plan)


def run_plan(args) -> int:
    from llmrubric.apps.commands import section_settings
    from llmrubric.config import command_settings
    from llmrubric.io.files import check_table_path, json_safe, write_table
    from llmrubric.io.tables import read_table, validate_features
    from llmrubric.model.core.checkpoints import load_model

    settings = section_settings(args, "labels", "plan", "assurance", "power", "alpha", "residual_sd")
    board = command_settings("scoring", None, {})["leaderboard"]
    alpha = check_range("--alpha", settings["alpha"] or board["alpha"], 0, 1, open_low=True, open_high=True)
    assurance = check_range("--assurance", settings["assurance"], 0, 1, open_low=True, open_high=True)
    power = check_range("--power", settings["power"], 0, 1, open_low=True, open_high=True)
    if args.width is None and args.difference is None:
        raise InputError("give --width, --difference or both", setting="--width")
    for name, value in (("--width", args.width), ("--difference", args.difference)):
        if value is not None:
            check_range(name, value, 0, open_low=True)
    inputs = {"checkpoint": args.checkpoint, "features": args.features, "--texts": args.texts}
    check_outputs({"--out": args.out}, {**inputs, "--annotations": args.annotations, "--config": args.config})
    if args.out:
        check_table_path(args.out, "--out")
    model = load_model(args.checkpoint)
    features = validate_features(read_table(args.features, "features"), model.rubric)
    texts = read_table(args.texts, "texts")
    if "system_id" not in texts.columns or texts.system_id.isna().any():
        row = int(texts.index[texts.system_id.isna().to_numpy().argmax()]) if "system_id" in texts.columns else None
        raise InputError("every text needs a system_id", file=str(args.texts), row=row, column="system_id")
    scores, levels = system_scores(model, features, texts, args.trusted_judges)
    sigma2, source = residual_variances(settings["residual_sd"], args.annotations, model.rubric, scores, levels)
    checked_from = board["transport_min_labels"]
    plan = system_plan(scores, levels, sigma2, args, (alpha, board["small_sample"], assurance, power, checked_from))
    if args.out:
        write_table(plan["table"], Path(args.out))
    sd = float(np.sqrt(np.mean(np.concatenate([np.atleast_1d(v) for v in sigma2.values()]))))
    words = {"sd": sd, "source": source, "small_sample": board["small_sample"], "assurance": assurance}
    words["checked_from"] = checked_from
    summary = {
        "alpha": alpha,
        "assumptions": [a.format(**words, alpha=alpha, power=power) for a in ASSUMPTIONS],
        "residual_sd": sd,
        "residual_source": source,
        **{k: v for k, v in plan.items() if k != "table"},
        "systems": plan["table"].to_dict("records"),
    }
    print(json.dumps(json_safe(summary), indent=1))
    return 0


def system_scores(model, features, texts, judges) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """``text_id, system_id, f`` (the judge-free score of the main question, as ``score texts`` writes it) and
    ``predicted_var`` (the trusted judges' mean predicted variance) of the scored texts, and the levels table (None:
    the model has no system level)."""
    from llmrubric.scoring.scores import score_texts

    main = model.rubric.main.id
    result = score_texts(model, features, texts, judges=judges, questions=[main], keep_predictions=True)
    scores = result.scores[(result.scores.question_id == main)].dropna(subset=["mean"])
    scores = scores.assign(system_id=scores.system_id.astype(str), text_id=scores.text_id.astype(str))
    pred = result.predictions[result.predictions.question_id == main]
    predicted = pred.groupby(pred.text_id.astype(str))["var"].mean()
    scores = scores.assign(predicted_var=scores.text_id.map(predicted).to_numpy(float))
    levels = result.levels.set_index(result.levels.system_id.astype(str)) if result.levels is not None else None
    return scores[["text_id", "system_id", "mean", "predicted_var"]].rename(columns={"mean": "f"}), levels


def residual_variances(given, annotations_path, rubric, scores: pd.DataFrame, levels) -> tuple:
    """system → its residual variances, and where they came from: ``--residual-sd``; pilot labels (when two
    systems have 5 or more: each pilot system's variance scaled to the new system by their mean predicted variances,
    :func:`llmrubric.scoring.label_plan.scaled_variances`; else one pooled); or the checkpoint's level."""
    from llmrubric.io.tables import read_table, validate_annotations
    from llmrubric.scoring import leaderboard as lb
    from llmrubric.scoring.label_plan import residual_variance, scaled_variances, system_residual_variances

    systems = sorted(scores.system_id.unique())
    if given is not None:
        return dict.fromkeys(systems, check_range("--residual-sd", given, 0) ** 2), "given (--residual-sd)"
    if annotations_path:
        annotations = validate_annotations(read_table(annotations_path, "annotations"), rubric)
        labels = lb.human_labels(annotations, rubric.main)
        pilot = scores[scores.text_id.isin(labels.index)]
        if len(pilot) < 3:
            raise InputError(
                f"{len(pilot)} of the pilot labels are of scored texts; the residual SD needs at least 3",
                file=str(annotations_path),
                column="text_id",
            )
        y, f = pilot.text_id.map(labels).to_numpy(), pilot.f.to_numpy()
        each = system_residual_variances(y, f, pilot.system_id)
        if len(each) >= 2:
            counts = pilot.groupby("system_id").size()
            used = sorted(counts.index[counts >= 5])
            predicted = scores.groupby("system_id").predicted_var.mean()
            scaled = {s: scaled_variances(each, predicted[used].to_numpy(), predicted[s]) for s in systems}
            return scaled, (
                f"pilot labels of {len(pilot)} texts of {len(used)} systems (--annotations): each system's residual "
                "variance, scaled to the new system by the model's mean predicted variance of their texts"
            )
        sigma2, n = residual_variance(y, f, pilot.system_id)
        return dict.fromkeys(
            systems, sigma2
        ), f"pilot labels of {n} texts (--annotations), each system's offset removed"
    if levels is not None and len(levels):
        sigma = float(levels.sigma_within.iloc[0])
        return dict.fromkeys(systems, sigma**2), "the checkpoint's system level: sigma_within of its training labels"
    raise InputError(
        "the checkpoint has no system level to read the residual SD from: give --residual-sd or pilot --annotations",
        setting="--residual-sd",
    )


def system_plan(scores, levels, sigma2, args, how: tuple) -> dict:
    """The plan table (one row per new system) and the difference plan over every pair of systems; ``how``:
    ``alpha, small_sample, assurance, power, checked_from``."""
    from llmrubric.scoring import label_plan as lp

    alpha, small_sample, assurance, power, checked_from = how
    rows, inputs = [], {}
    for system, part in scores.groupby("system_id", sort=True):
        level = levels.loc[system] if levels is not None and system in levels.index else None
        known = bool(level is not None and level.known)
        prior_var = float(level.level_sd) ** 2 if level is not None and not known else math.inf
        inputs[system] = lp.SystemPlanInput(system, len(part), float(np.var(part.f.to_numpy())), prior_var)
        row = {"system": system, "texts": len(part), "known": known, "prior_sd": math.sqrt(prior_var)}
        if args.width is not None:
            how_wide = (sigma2[system], alpha, small_sample, assurance, checked_from)
            k = None if known else lp.labels_for_width(args.width, inputs[system], *how_wide)
            width = lp.planned_width(k, inputs[system], *how_wide)
            row.update(k_width=k, planned_width=width)
        rows.append(row)
    out: dict = {"table": pd.DataFrame(rows)}
    new = [s for s in inputs if not math.isinf(inputs[s].prior_var) or levels is None]
    if args.difference is not None and len(new) >= 2:
        pairs = {
            (a, b): lp.labels_for_difference(
                args.difference, inputs[a], inputs[b], sigma2[a], alpha, power, small_sample, sigma2[b], checked_from
            )
            for a, b in itertools.combinations(new, 2)
        }
        worst = max(pairs, key=lambda p: math.inf if pairs[p] is None else pairs[p])
        out["difference"] = {"delta": args.difference, "power": power, "k_every_pair": pairs[worst], "pair": worst}
    return out
