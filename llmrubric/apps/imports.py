"""``llmrubric import workbench | nuggetizer | mlflow``: the IR ecosystem's files and MLflow's traces → this
project's tables.

``workbench``: the RUBRIC workbench's graded passages (JSONL or .jsonl.gz), with ``--qrels``, →
features, texts, annotations (and ``--summaries``: the self-rating summary blocks to train on);
``nuggetizer``: the AutoNuggetizer's nuggets and assignments → test bank, texts, assignments and
``nugget_support`` features. Settings: ``imports.*`` of ``conf/ir/default.yaml`` (or ``--config``).
``mlflow``: an MLflow experiment's traces (HUMAN feedback → annotations, LLM_JUDGE feedback → features,
request + response → texts; :mod:`llmrubric.mlflow_genai.read`). Everything is read and checked before the
first file is written.
"""

from __future__ import annotations

from pathlib import Path

from llmrubric.apps.commands import add_noun, section_settings
from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_writable_dir

FORMATS = ("parquet", "csv", "tsv", "jsonl")


def register(subparsers) -> None:
    sub = add_noun(subparsers, "import", "read the IR ecosystem's files: RUBRIC workbench, TREC qrels, AutoNuggetizer")
    w = sub.add_parser("workbench", help="RUBRIC workbench JSONL(.gz) (+ TREC qrels) → features, texts, annotations")
    w.add_argument("file", help="the workbench's graded passages: [query_id, [paragraph, ...]] per line")
    w.add_argument("--qrels", help="TREC qrels of the passages: the annotations of --judge-id")
    w.add_argument("--judge-id", dest="judge_id", help="judge of the qrels and judgments (default: assessor)")
    w.add_argument("--summaries", action="store_true", help="also write summaries.<format>: self-rating summaries")
    _common(w)
    w.set_defaults(run=run_workbench)

    n = sub.add_parser("nuggetizer", help="AutoNuggetizer nuggets and assignments JSONL → test bank, tables")
    n.add_argument("--nuggets", help="its create output: {qid, query, nuggets: [{text, importance}]} per line")
    n.add_argument("--assignments", nargs="+", help="its assign output (answers or retrieval), one or more files")
    n.add_argument("--source", dest="nuggetizer_source", help="features source of the assignments")
    _common(n)
    n.set_defaults(run=run_nuggetizer)

    m = sub.add_parser("mlflow", help="an MLflow experiment's traces and their feedback → annotations, features, texts")
    m.add_argument("--experiment", required=True, help="MLflow experiment (name or id) whose traces are read")
    m.add_argument("--rubric", help="rubric YAML the feedback answers (default: conf/rubric/llm_rubric.yaml)")
    m.add_argument("--tracking-uri", dest="tracking_uri", help="tracking store (default: MLFLOW_TRACKING_URI)")
    m.add_argument("--system-tag", dest="system_tag", help="trace tag holding the system: texts get system_id")
    m.add_argument("--queue", help="read only the traces of this review queue (`llmrubric label suggest --queue`)")
    m.add_argument("--out-dir", required=True, help="folder of the tables written")
    m.add_argument("--format", choices=FORMATS, default="parquet", help="tables' file format (default: parquet)")
    m.set_defaults(run=run_mlflow)


def _common(p) -> None:
    p.add_argument("--out-dir", required=True, help="folder of the tables written")
    p.add_argument("--text", action="store_true", help="keep the passage / answer text in the texts table")
    p.add_argument("--format", choices=FORMATS, help="tables' file format (default: parquet)")
    p.add_argument("--config", help="settings YAML (default: conf/ir/default.yaml)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _settings(args, *keys: str) -> dict:
    settings = section_settings(args, "ir", "imports", "format", *keys)
    if settings["format"] not in FORMATS:
        raise InputError(f"format {settings['format']!r} is not one of {FORMATS}", setting="imports.format")
    return settings


def _write(out: Path, fmt: str, tables: dict) -> list[str]:
    from llmrubric.io.files import write_table

    return [str(write_table(df, out / f"{name}.{fmt}")) for name, df in tables.items()]


def _counts(counts: dict) -> str:
    return ", ".join(f"{v if not isinstance(v, list) else '/'.join(v)} {k}" for k, v in counts.items())


def run_workbench(args) -> int:
    from llmrubric.extract.summaries import summarise
    from llmrubric.io.tables import validate_features
    from llmrubric.ir.autograder import read_qrels
    from llmrubric.ir.judgments import add_qrels
    from llmrubric.ir.workbench import read_workbench

    settings = _settings(args, "judge_id")
    out = check_writable_dir(args.out_dir, "--out-dir")
    qrels = read_qrels(args.qrels) if args.qrels else None
    got = read_workbench(
        args.file, settings["judge_id"], settings["question_id"], args.text, progress=not args.no_progress
    )
    annotations = got.annotations
    if qrels is not None:
        annotations, dropped = add_qrels(annotations, got.texts, qrels, settings["judge_id"], settings["question_id"])
        got.counts["qrels_dropped"] = dropped
    tables = {"features": validate_features(got.features), "texts": got.texts}
    if len(annotations):
        tables["annotations"] = annotations
    if args.summaries:
        summary = summarise(got.features, "self_rating")
        if summary.empty:
            raise InputError("no self-ratings to summarise", file=str(args.file))
        summary.attrs["source"] = str(args.file)
        tables["summaries"] = validate_features(summary)
    written = _write(out, settings["format"], tables)
    print(f"{_counts({**got.counts, 'annotations': len(annotations)})} → {', '.join(written)}")
    return 0


def run_nuggetizer(args) -> int:
    from llmrubric.extract.testbank import write_bank
    from llmrubric.io.tables import validate_features
    from llmrubric.ir.nuggetizer import read_assignments, read_nuggets

    settings = _settings(args, "nuggetizer_source")
    if not (args.nuggets or args.assignments):
        raise InputError("give --nuggets, --assignments or both")
    out = check_writable_dir(args.out_dir, "--out-dir")
    bank = read_nuggets(args.nuggets) if args.nuggets else None
    tables, counts = {}, {}
    if args.assignments:
        got, bank, assignments = read_assignments(args.assignments, bank, settings["nuggetizer_source"], args.text)
        tables = {"texts": got.texts, "assignments": assignments, "features": validate_features(got.features)}
        counts = got.counts
    written = _write(out, settings["format"], tables)
    written.append(str(write_bank(bank, out / "bank.jsonl")))
    vital = sum(i.importance == "vital" for i in bank)
    print(f"{_counts({'nuggets': len(bank), 'vital': vital, **counts})} → {', '.join(written)}")
    return 0


def run_mlflow(args) -> int:
    import mlflow

    from llmrubric.config import conf_path
    from llmrubric.io.rubric import Rubric
    from llmrubric.io.tables import validate_annotations, validate_features
    from llmrubric.mlflow_genai.read import experiment_id, read_traces, search_traces
    from llmrubric.mlflow_genai.review import queue_trace_ids

    rubric = Rubric.load(args.rubric or conf_path() / "rubric" / "llm_rubric.yaml")
    out = check_writable_dir(args.out_dir, "--out-dir")
    if args.tracking_uri:
        mlflow.set_tracking_uri(args.tracking_uri)
    client = mlflow.MlflowClient()
    wanted = queue_trace_ids(experiment_id(client, args.experiment), args.queue) if args.queue else None
    got = read_traces(search_traces(client, args.experiment, wanted), rubric, args.system_tag)
    if got.texts.empty:
        raise InputError(f"experiment {args.experiment!r} has no traces", setting="--experiment")
    where = f"MLflow experiment {args.experiment}"
    tables = {"texts": got.texts}
    if len(got.features):
        got.features.attrs["source"] = where
        tables["features"] = validate_features(got.features, rubric)
    if len(got.annotations):
        got.annotations.attrs["source"] = where
        tables["annotations"] = validate_annotations(got.annotations, rubric)
    written = _write(out, args.format, tables)
    print(f"{_counts(got.counts)} → {', '.join(written)}")
    return 0
