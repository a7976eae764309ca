"""``llmrubric score texts`` and ``llmrubric leaderboard build | correlate``.

Settings come from ``conf/scoring/default.yaml`` (or ``--config``); flags override them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from llmrubric.apps.commands import add_noun, flags
from llmrubric.apps.rubric_args import add_rubric_flags, command_rubric
from llmrubric.config import command_settings, conf_path
from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_outputs, check_range, check_writable_dir

log = logging.getLogger(__name__)
CONF = conf_path()


def register(subparsers) -> None:
    """``llmrubric score texts`` and the ``leaderboard`` verbs."""
    score = add_noun(subparsers, "score", "judge-free scores of new texts from a trained calibrator")
    s = score.add_parser(
        "texts",
        help="score new texts with a trained calibrator (judge-free scores)",
        description="Score new texts with a trained calibrator: for each text and question, the judge-free "
        "score over the trusted judges (mean, max, quantile) with its conformal interval lo/hi. Settings come "
        "from conf/scoring/default.yaml (or --config); flags override them.",
    )
    s.add_argument("checkpoint", help="calibrator checkpoint (.safetensors)")
    s.add_argument("features", help="features table of the new texts")
    s.add_argument("--texts", help="texts table (text_id, system_id): which texts, and their systems")
    s.add_argument(
        "--out", required=True, help="scores table: one row per (text, question) (.csv/.tsv/.parquet/.jsonl)"
    )
    s.add_argument(
        "--predictions", help="also write the predictions table of every (text, trusted judge, question) here"
    )
    s.add_argument("--config", help="settings YAML (default: conf/scoring/default.yaml)")
    s.add_argument(
        "--trusted-judges",
        dest="trusted_judges",
        nargs="+",
        metavar="JUDGE",
        help="the judges whose answers a score is over (default: every judge the checkpoint knows)",
    )
    s.add_argument(
        "--questions", nargs="+", metavar="QUESTION", help="questions to score (default: every ordered question)"
    )
    s.add_argument(
        "--quantile",
        type=float,
        help="the judge-free quantile over the trusted judges, beside mean and max (default 0.9)",
    )
    s.add_argument(
        "--coverage", type=float, help="coverage of the conformal intervals lo/hi (default 0.9; docs/scoring.md)"
    )
    s.add_argument(
        "--coverage-by",
        dest="coverage_by",
        choices=["pooled", "judge"],
        help="pooled: one conformal threshold for all judges (default); judge: each judge's own (coverage per judge)",
    )
    s.add_argument(
        "--chunk-texts",
        dest="chunk_texts",
        type=int,
        help="texts scored at a time: memory grows with this times the trusted judges (default 4096)",
    )
    s.add_argument(
        "--log-to-traces",
        dest="log_to_traces",
        action="store_true",
        help="also log each score as CODE feedback on its MLflow trace (--texts of `llmrubric import mlflow`: trace_id)",
    )
    s.add_argument("--tracking-uri", dest="tracking_uri", help="MLflow store (default: MLFLOW_TRACKING_URI)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(run=run_score)

    add_leaderboard_verbs(subparsers)


def add_leaderboard_verbs(subparsers) -> None:
    """``llmrubric leaderboard build | correlate``."""
    board = add_noun(subparsers, "leaderboard", "system leaderboards and their rank correlations")
    b = board.add_parser(
        "build",
        help="system leaderboard with bootstrap intervals, paired tests, PPI and a density plot",
        description="Rank systems by their texts' predicted scores, with bootstrap intervals, paired tests "
        "and, with human labels, classical, PPI and PPI++ intervals; writes the tables and a density plot "
        "(--no-plot: none). Settings come from conf/scoring/default.yaml (or --config); flags override them.",
    )
    b.add_argument("predictions", help="predictions table (from `llmrubric score texts --predictions` or evaluate.py)")
    b.add_argument("--out-dir", required=True, help="folder of the leaderboard tables and plot (created if missing)")
    add_rubric_flags(b)
    b.add_argument("--texts", help="texts table with system_id (and query_id to pair systems by query)")
    b.add_argument(
        "--annotations",
        help="human annotations: adds the human leaderboard, its rank correlation, classical, PPI and PPI++ intervals and the ranks of the human means they allow (label_rank_low/high)",
    )
    b.add_argument(
        "--sampling",
        help="sampling-probability file of `llmrubric label suggest` the annotated texts were drawn by: active PPI++ intervals",
    )
    b.add_argument("--reference", help="reference leaderboard file (system, score) to rank-correlate with")
    b.add_argument(
        "--shift-errors",
        dest="shift_errors",
        help="system_errors.csv of a protocol=systems (or system_groups) evaluation: adds intervals that include the model's error on new systems",
    )
    b.add_argument(
        "--levels",
        help="<scores>.levels.csv of `llmrubric score texts` with a model that has a system level: ranks by the level and adds its interval",
    )
    add_transport_flags(b)
    b.add_argument("--config", help="settings YAML (default: conf/scoring/default.yaml)")
    b.add_argument("--question", help="the question systems are ranked by (default: the rubric's main question)")
    b.add_argument(
        "--trusted-judges",
        dest="trusted_judges",
        nargs="+",
        metavar="JUDGE",
        help="the judges whose predictions a system's score is over (default: every judge of the predictions)",
    )
    b.add_argument("--bootstrap", type=int, help="bootstrap replicates of the intervals (default 1000)")
    b.add_argument("--seed", type=int, help="seed of the bootstrap (default 0)")
    b.add_argument("--alpha", type=float, help="the intervals are 1 - alpha (default 0.05)")
    b.add_argument(
        "--missing-systems",
        dest="missing_systems",
        choices=["error", "drop"],
        help="a system absent from --reference: an error (default) or dropped with a warning",
    )
    b.add_argument("--no-plot", action="store_true", help="skip the density plot (its seconds)")
    b.set_defaults(run=run_leaderboard)

    r = board.add_parser(
        "correlate",
        help="Spearman and Kendall tau between two leaderboard files",
        description="Spearman and Kendall tau between the system scores of two leaderboard files.",
    )
    r.add_argument("a", help="leaderboard file with system (or system_id) and score columns")
    r.add_argument("b", help="the other leaderboard file")
    r.add_argument(
        "--missing-systems",
        dest="missing_systems",
        choices=["error", "drop"],
        default="error",
        help="a system in only one of the files: an error (default) or dropped with a warning",
    )
    r.set_defaults(run=run_rank_correlation)


def add_transport_flags(b) -> None:
    """The transport check's flags of ``leaderboard build`` (``--levels --annotations``)."""
    b.add_argument(
        "--transport-margin",
        dest="transport_margin",
        type=float,
        help="with --levels --annotations: the largest error of a system's level its labels may show and PASS "
        "(label scale; default: each system's own prior half-width); FAIL / INCONCLUSIVE fall back to PPI++",
    )
    b.add_argument(
        "--transport-min-labels",
        dest="transport_min_labels",
        type=int,
        help="fewest labels of a system for the transport check (default 10)",
    )


def run_score(args) -> int:
    from llmrubric.io.files import check_table_path, json_safe, write_json, write_table
    from llmrubric.io.tables import read_table, validate_features
    from llmrubric.model.core.checkpoints import load_model
    from llmrubric.scoring.scores import score_texts

    settings = command_settings(
        "scoring",
        args.config,
        flags(args, "trusted_judges", "questions", "quantile", "coverage", "coverage_by", "chunk_texts"),
    )
    quantile = check_range("--quantile", settings["quantile"], 0, 1)
    coverage = check_range("--coverage", settings["coverage"], 0, 1, open_low=True, open_high=True)
    chunk_texts = check_range("--chunk-texts", settings["chunk_texts"], 1, integer=True)
    out = Path(args.out)
    summary = out.with_name(out.stem + ".summary.json")
    check_outputs(
        {
            "--out": out,
            "summary": summary,
            "levels": out.with_name(out.stem + ".levels.csv"),
            "--predictions": args.predictions,
        },
        {"checkpoint": args.checkpoint, "features": args.features, "--texts": args.texts, "--config": args.config},
    )
    check_table_path(out, "--out")
    if args.predictions:
        check_table_path(args.predictions, "--predictions")
    model = load_model(args.checkpoint)
    features = validate_features(read_table(args.features, "features"), model.rubric)
    texts = read_table(args.texts, "texts") if args.texts else None
    trace_ids = _trace_ids(args, texts)
    result = score_texts(
        model,
        features,
        texts,
        judges=settings["trusted_judges"],
        questions=settings["questions"],
        quantile=quantile,
        chunk_texts=chunk_texts,
        predictions_out=args.predictions,
        progress=not args.no_progress,
        coverage=coverage,
        coverage_by=settings["coverage_by"],
    )
    write_table(result.scores, out)
    if result.levels is not None:  # a model with a system level: `leaderboard build --levels`
        write_table(result.levels, out.with_name(out.stem + ".levels.csv"))
    write_json(result.summary, summary)
    if trace_ids is not None:
        from llmrubric.mlflow_genai.store import store_errors
        from llmrubric.mlflow_genai.write import log_scores

        with store_errors():
            result.summary["logged_to_traces"] = log_scores(
                result.scores, trace_ids, args.checkpoint, progress=not args.no_progress
            )
    print(json.dumps(json_safe({k: v for k, v in result.summary.items() if k != "judges"})))
    return 0


def _trace_ids(args, texts) -> dict[str, str] | None:
    """text id → MLflow trace id for ``--log-to-traces`` (the texts table's ``trace_id``), the tracking server
    checked; None without the flag."""
    if not args.log_to_traces:
        return None
    if texts is None or "trace_id" not in texts.columns:
        raise InputError(
            "--log-to-traces needs --texts with a trace_id column (the texts of `llmrubric import mlflow`)",
            setting="--log-to-traces",
        )
    missing = texts.trace_id.isna().to_numpy()
    if missing.any():
        row = int(texts.index[missing.argmax()])
        raise InputError("a text to log to its trace has no trace_id", file=str(args.texts), row=row, column="trace_id")
    from llmrubric.mlflow_genai.store import tracking_client

    tracking_client(args.tracking_uri)  # a server that is down: one error before anything is scored or written
    return dict(zip(texts.text_id.astype(str), texts.trace_id.astype(str)))


def run_leaderboard(args) -> int:
    from llmrubric.io.tables import read_table
    from llmrubric.scoring import leaderboard as lb
    from llmrubric.scoring.levels import read_levels

    board = leaderboard_settings(args)
    predictions = lb.read_predictions(args.predictions)
    rubric = command_rubric(args, predictions.question_id.unique() if "question_id" in predictions else [])
    if board["question"] and board["question"] not in rubric:
        raise InputError(
            f"question {board['question']!r} is not in rubric {rubric.name!r} {rubric.ids}", setting="--question"
        )
    question = rubric[board["question"]] if board["question"] else rubric.main
    out_dir = Path(args.out_dir)
    check_writable_dir(out_dir, "--out-dir")
    check_outputs(
        {
            name: out_dir / name
            for name in ("leaderboard.csv", "comparisons.csv", "leaderboard.json", "leaderboard.md", "density.png")
        },
        {
            "predictions": args.predictions,
            "--texts": args.texts,
            "--annotations": args.annotations,
            "--reference": args.reference,
            "--shift-errors": args.shift_errors,
            "--levels": args.levels,
            "--sampling": args.sampling,
            "--config": args.config,
            "--rubric": args.rubric,
            "--checkpoint": args.checkpoint,
        },
    )
    if args.sampling and not args.annotations:
        raise InputError("--sampling needs the labels of the drawn texts (--annotations)", setting="--sampling")
    shift_errors = lb.read_shift_errors(args.shift_errors) if args.shift_errors else None
    levels = read_levels(args.levels) if args.levels else None
    texts = read_table(args.texts, "texts") if args.texts else None
    annotations, labels, draws = human_labels(args, rubric, question, predictions, texts, board["judges"])
    result = lb.build(
        predictions,
        question,
        texts,
        board["judges"],
        n_boot=board["bootstrap"],
        seed=board["seed"],
        alpha=board["alpha"],
        sample_answers=board["sample_answers"],
        labels=labels,
        band_replicates=board["band_replicates"],
        shift_errors=shift_errors,
        draws=draws,
        small_sample=board["small_sample"],
        sampling_rule=f"active, drawn by {args.sampling} (inverse-probability weighted)" if args.sampling else None,
        levels=levels,
        transport=transport_settings(board),
    )
    extra = rank_correlations(args, result, annotations, question, texts, board["missing_systems"])
    paths = lb.write(result, args.out_dir, plot=not args.no_plot, extra=extra)
    print(lb.markdown(result.board, f"{question.id} leaderboard", result.settings))
    for name, corr in extra.items():
        print(f"{name}: Spearman {corr['spearman']:.3f}, Kendall {corr['kendall']:.3f} over {corr['systems']} systems")
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return 0


def leaderboard_settings(args) -> dict:
    """``leaderboard.*`` of the scoring settings with the flags of ``leaderboard build``, checked; and
    ``judges``, the trusted judges."""
    keys = ("question", "bootstrap", "seed", "alpha", "missing_systems", "transport_margin", "transport_min_labels")
    settings = command_settings(
        "scoring",
        args.config,
        {"trusted_judges": args.trusted_judges, **{f"leaderboard.{k}": getattr(args, k) for k in keys}},
    )
    board = settings["leaderboard"]
    board["judges"] = settings["trusted_judges"]
    board["bootstrap"] = check_range("--bootstrap", board["bootstrap"], 1, integer=True)
    board["seed"] = check_range("--seed", board["seed"], integer=True)
    board["alpha"] = check_range("--alpha", board["alpha"], 0, 1, open_low=True, open_high=True)
    board["band_replicates"] = check_range("band_replicates", board["band_replicates"], 1, integer=True)
    if board["missing_systems"] not in ("error", "drop"):
        raise InputError(f"{board['missing_systems']!r} is not error or drop", setting="missing_systems")
    if board["small_sample"] not in ("student", "normal"):
        raise InputError(f"{board['small_sample']!r} is not student or normal", setting="leaderboard.small_sample")
    if board["transport_margin"] is not None:
        board["transport_margin"] = check_range("--transport-margin", board["transport_margin"], 0, open_low=True)
    board["transport_min_labels"] = check_range(
        "--transport-min-labels", board["transport_min_labels"], 2, integer=True
    )
    return board


def transport_settings(board: dict):
    """The transport check of ``--levels --annotations`` (:mod:`llmrubric.scoring.transport`), at the board's alpha."""
    from llmrubric.scoring.transport import TransportSettings

    return TransportSettings(board["transport_margin"], board["alpha"], board["transport_min_labels"])


def human_labels(args, rubric, question, predictions, texts, judges) -> tuple:
    """``(annotations, labels, draws)`` of ``--annotations`` (and ``--sampling``): the human labels of
    the interval rows, checked against the predicted texts; Nones without annotations."""
    from llmrubric.io.tables import read_table, validate_annotations
    from llmrubric.scoring import leaderboard as lb
    from llmrubric.scoring.labels import read_sampling

    if not args.annotations:
        return None, None, None
    annotations = validate_annotations(read_table(args.annotations, "annotations"), rubric)
    systems, _ = lb.system_data(predictions, question, texts, judges)
    lb.check_labelled_texts(systems, annotations, question)
    if not args.sampling:
        return annotations, lb.human_labels(annotations, question), None
    draws = lb.check_sampling(
        read_sampling(args.sampling), systems, lb.human_labels_by_round(annotations, question), str(args.annotations)
    )
    return annotations, None, draws


def rank_correlations(args, result, annotations, question, texts, missing: str) -> dict:
    """The leaderboard's rank correlations with the human leaderboard (adding its ``human`` column)
    and with ``--reference``."""
    from llmrubric.scoring import leaderboard as lb

    scores = result.board.set_index("system").score
    extra: dict = {}
    if annotations is not None:
        human = lb.human_leaderboard(annotations, question, texts)
        result.board["human"] = result.board.system.map(human)
        extra["vs_human"] = lb.rank_correlation(scores, human, missing, "predictions", str(args.annotations))
    if args.reference:
        extra["vs_reference"] = lb.rank_correlation(
            scores, lb.read_leaderboard(args.reference), missing, str(args.predictions), str(args.reference)
        )
    return extra


def run_rank_correlation(args) -> int:
    from llmrubric.io.files import json_safe
    from llmrubric.scoring.leaderboard import rank_correlation, read_leaderboard

    result = rank_correlation(
        read_leaderboard(args.a), read_leaderboard(args.b), args.missing_systems, str(args.a), str(args.b)
    )
    print(json.dumps(json_safe(result)))
    return 0
