"""``llmrubric label suggest`` (which texts of new systems to label next) and ``llmrubric judges add``
(a new judge from a few annotations, without retraining).

Settings come from ``conf/labels/default.yaml`` (or ``--config``); flags override them.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmrubric.apps.commands import add_noun, section_settings
from llmrubric.apps.label_plan import add_plan_parser
from llmrubric.apps.rubric_args import add_rubric_flags, command_rubric
from llmrubric.config import conf_path
from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_outputs, check_range

CONF = conf_path()


def register(subparsers) -> None:
    label = add_noun(subparsers, "label", "choose which texts of new systems humans label next")
    s = label.add_parser(
        "suggest",
        help="draw the texts of each system to label, with probabilities that grow with the model's uncertainty",
        description="Choose which texts of new systems humans label next: each system's texts are drawn with "
        "probabilities that grow with the model's predicted variance, and the probabilities are written for "
        "active PPI++ intervals (leaderboard build --sampling). Settings come from conf/labels/default.yaml "
        "(or --config); flags override them.",
    )
    s.add_argument("predictions", help="predictions table of the new systems' texts (with var)")
    s.add_argument("--texts", required=True, help="texts table (text_id, system_id): the texts to choose from")
    s.add_argument("--budget", required=True, type=int, help="draws per system (with replacement)")
    s.add_argument("--out", required=True, help="sampling-probability file: one row per text (prob, draws)")
    add_rubric_flags(s)
    s.add_argument("--config", help="settings YAML (default: conf/labels/default.yaml)")
    s.add_argument(
        "--trusted-judges",
        dest="trusted_judges",
        nargs="+",
        metavar="JUDGE",
        help="the judges whose predictions the variance is over (default: every judge of the predictions)",
    )
    s.add_argument("--question", help="whose predicted variance ranks the texts (default: the main question)")
    s.add_argument(
        "--floor", type=float, help="share of each draw spread uniformly over the system's texts (default 0.2)"
    )
    s.add_argument("--seed", type=int, help="seed of the draws; give each round its own (default 0)")
    s.add_argument("--round", help="the round the drawn texts are labelled in, the annotations' round (default 1)")
    s.add_argument("--queue", help="also put the drawn texts into this MLflow review queue (texts need trace_id)")
    s.add_argument("--experiment", help="MLflow experiment of the traces (with --queue)")
    s.add_argument("--reviewers", nargs="+", help="users assigned to the review queue (with --queue)")
    s.add_argument("--tracking-uri", dest="tracking_uri", help="MLflow store (default: MLFLOW_TRACKING_URI)")
    s.set_defaults(run=run_suggest)
    add_plan_parser(label)

    judges = add_noun(subparsers, "judges", "judges of a trained calibrator")
    a = judges.add_parser(
        "add",
        help="fit a new judge's own parameters from a few annotations, shared ones frozen",
        description="Add a judge to a trained calibrator without retraining: its own parameters are fitted from "
        "a few of its annotations, the shared ones frozen, and a new checkpoint is written. Settings come from "
        "conf/labels/default.yaml (or --config); flags override them.",
    )
    a.add_argument("checkpoint", help="calibrator checkpoint (.safetensors)")
    a.add_argument("annotations", help="the new judge's annotations")
    a.add_argument("--features", required=True, help="features table of the annotated texts")
    a.add_argument("--out", required=True, help="new checkpoint (.safetensors)")
    a.add_argument("--judge", help="judge id to add (default: the one judge of the annotations)")
    a.add_argument("--texts", help="texts table of the annotated texts")
    a.add_argument("--config", help="settings YAML (default: conf/labels/default.yaml)")
    a.add_argument(
        "--min-annotations",
        dest="min_annotations",
        type=int,
        help="fewest answers of the main question the judge is fitted from (default 5)",
    )
    a.add_argument("--l2", help="L2 on the new judge's parameters: a number, or cv (see conf/labels/default.yaml)")
    a.set_defaults(run=run_add_judge)


def run_suggest(args) -> int:
    from llmrubric.io.files import check_table_path, write_table
    from llmrubric.io.tables import read_table
    from llmrubric.scoring import labels as lab
    from llmrubric.scoring.leaderboard import read_predictions

    settings = section_settings(args, "labels", "suggest", "floor", "seed", "round", "question")
    floor = check_range("--floor", settings["floor"], 0, 1, open_low=True)
    seed = check_range("--seed", settings["seed"], integer=True)
    budget = check_range("--budget", args.budget, 1, integer=True)
    out = Path(args.out)
    check_outputs(
        {"--out": out},
        {
            "predictions": args.predictions,
            "--texts": args.texts,
            "--config": args.config,
            "--rubric": args.rubric,
            "--checkpoint": args.checkpoint,
        },
    )
    check_table_path(out, "--out")
    predictions = read_predictions(args.predictions)
    rubric = command_rubric(args, predictions.question_id.unique() if "question_id" in predictions else [])
    question = settings["question"] or rubric.main.id
    if question not in rubric:
        raise InputError(f"question {question!r} is not in rubric {rubric.name!r} {rubric.ids}", setting="--question")
    texts = read_table(args.texts, "texts")
    if "system_id" not in texts.columns or texts.system_id.isna().any():
        row = int(texts.index[texts.system_id.isna().to_numpy().argmax()]) if "system_id" in texts.columns else None
        raise InputError("every text needs a system_id", file=str(args.texts), row=row, column="system_id")
    uncertainty = lab.text_uncertainty(predictions, question, args.trusted_judges)
    unknown = ~texts.text_id.isin(uncertainty.index)
    if unknown.any():
        row = texts.index[unknown.to_numpy().argmax()]
        raise InputError(
            f"text {texts.at[row, 'text_id']!r} has no predictions of {question}",
            file=str(args.texts),
            row=int(row),
            column="text_id",
        )
    check_queue(args, texts)
    table = lab.suggest(texts, uncertainty, budget, floor, seed, str(settings["round"]))
    queued = queue_drawn(args, table, texts, rubric)  # before the file: a queue that cannot be made leaves none
    write_table(table, out)
    drawn = table[table.draws > 0].groupby("system_id").size()
    print(json.dumps({"out": str(out), "budget": budget, "floor": floor, "texts_to_label": drawn.to_dict(), **queued}))
    return 0


def check_queue(args, texts) -> None:
    """``--queue`` needs ``--experiment`` and texts with a ``trace_id`` (those of ``llmrubric import mlflow``)."""
    if not args.queue:
        return
    if not args.experiment:
        raise InputError("--queue needs --experiment (the MLflow experiment of the traces)", setting="--queue")
    if "trace_id" not in texts.columns or texts.trace_id.isna().any():
        raise InputError(
            "--queue needs a trace_id for every text (the texts of `llmrubric import mlflow`)",
            file=str(args.texts),
            column="trace_id",
        )


def queue_drawn(args, table, texts, rubric) -> dict:
    """The drawn texts' traces into the review queue ``--queue`` (with the rubric's label schemas); {} without."""
    if not args.queue:
        return {}
    from llmrubric.mlflow_genai.read import experiment_id
    from llmrubric.mlflow_genai.review import queue_texts
    from llmrubric.mlflow_genai.store import store_errors, tracking_client

    client = tracking_client(args.tracking_uri)
    traces = dict(zip(texts.text_id.astype(str), texts.trace_id.astype(str)))
    drawn = [traces[t] for t in table[table.draws > 0].text_id.astype(str)]
    with store_errors():
        queue_id = queue_texts(experiment_id(client, args.experiment), args.queue, rubric, drawn, args.reviewers)
    return {"queue": args.queue, "queue_id": queue_id, "queued_traces": len(drawn)}


def run_add_judge(args) -> int:
    from llmrubric.io.tables import Tables, read_table, validate_annotations, validate_features
    from llmrubric.model.core.checkpoints import load_model
    from llmrubric.model.judges import add_judge, added_record, annotated_judge

    settings = section_settings(args, "labels", "judges", "min_annotations", "l2")
    min_annotations = check_range("--min-annotations", settings["min_annotations"], 1, integer=True)
    l2 = settings["l2"]
    l2 = l2 if l2 in (None, "cv") else check_range("--l2", l2, 0)
    grid = settings["l2_grid"]
    if not grid:
        raise InputError(f"{grid!r} is not a list of numbers", setting="judges.l2_grid")
    grid = [check_range("judges.l2_grid", value, 0) for value in grid]
    cv_folds = check_range("judges.cv_folds", settings["cv_folds"], 2, integer=True)
    max_iter = check_range("judges.max_iter", settings["max_iter"], 1, integer=True)
    out = Path(args.out)
    check_outputs(
        {"--out": out},
        {
            "checkpoint": args.checkpoint,
            "annotations": args.annotations,
            "--features": args.features,
            "--texts": args.texts,
            "--config": args.config,
        },
    )
    model = load_model(args.checkpoint)
    annotations = validate_annotations(read_table(args.annotations, "annotations"), model.rubric)
    judge = annotated_judge(annotations, args.judge)
    features = validate_features(read_table(args.features, "features"), model.rubric)
    texts = read_table(args.texts, "texts") if args.texts else None
    new = add_judge(model, Tables(annotations, features, texts), judge, min_annotations, l2, max_iter, grid, cv_folds)
    new.save(out)
    record = added_record(new)
    print(json.dumps({"out": str(out), "judge": judge, **{k: record.get(k) for k in ("answers", "l2", "seconds")}}))
    return 0
