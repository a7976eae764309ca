"""``llmrubric import workbench | nuggetizer | mlflow``: the IR ecosystem's files and MLflow's traces → this
project's tables; ``llmrubric export mlflow``: the tables → MLflow traces (the inverse of ``import mlflow``).

``workbench``: the RUBRIC workbench's graded passages (JSONL or .jsonl.gz), with ``--qrels``, →
features, texts, annotations (and ``--summaries``: the self-rating summary blocks to train on);
``nuggetizer``: the AutoNuggetizer's nuggets and assignments → test bank, texts, assignments and
``nugget_support`` features. Settings: ``imports.*`` of ``conf/ir/default.yaml`` (or ``--config``).
``mlflow``: an MLflow experiment's traces (HUMAN feedback → annotations, LLM_JUDGE feedback → features,
request + response → texts; :mod:`llmrubric.mlflow_genai.read`). Everything is read and checked before the
first file is written. ``export mlflow``: one trace per text with its raters' ``HUMAN`` and the LLMs' ``LLM_JUDGE``
feedback (:func:`llmrubric.mlflow_genai.write.log_tables`), into an experiment that holds no traces yet.
"""

from __future__ import annotations

from pathlib import Path

from llmrubric.apps.commands import add_noun, section_settings
from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_writable_dir

FORMATS = ("parquet", "csv", "tsv", "jsonl")


def register(subparsers) -> None:
    sub = add_noun(
        subparsers,
        "import",
        "read the IR ecosystem's files (RUBRIC workbench, TREC qrels, AutoNuggetizer), MLflow traces",
    )
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
    m.add_argument(
        "--rubric",
        required=True,
        help="rubric YAML the feedback answers: its question ids (or names) are the feedback names read",
    )
    m.add_argument("--tracking-uri", dest="tracking_uri", help="tracking store (default: MLFLOW_TRACKING_URI)")
    m.add_argument("--system-tag", dest="system_tag", help="trace tag holding the system: texts get system_id")
    m.add_argument("--queue", help="read only the traces of this review queue (`llmrubric label suggest --queue`)")
    m.add_argument("--out-dir", required=True, help="folder of the tables written")
    m.add_argument("--format", choices=FORMATS, default="parquet", help="tables' file format (default: parquet)")
    m.set_defaults(run=run_mlflow)
    add_export(subparsers)


def add_export(subparsers) -> None:
    """``llmrubric export mlflow``."""
    sub = add_noun(subparsers, "export", "write the tables elsewhere: MLflow traces with their feedback")
    e = sub.add_parser(
        "mlflow",
        help="annotations, features and texts → one MLflow trace per text with HUMAN and LLM_JUDGE feedback",
    )
    e.add_argument("--features", required=True, help="features table: each block becomes LLM_JUDGE feedback")
    e.add_argument("--annotations", required=True, help="annotations table: each answer becomes HUMAN feedback")
    e.add_argument("--texts", help="texts table (text_id, system_id, text): the traces' text and system tag")
    e.add_argument("--rubric", required=True, help="rubric YAML of the tables")
    e.add_argument("--experiment", required=True, help="MLflow experiment (created if missing; it must hold no traces)")
    e.add_argument(
        "--system-tag", dest="system_tag", default="system_id", help="trace tag of the system (default: system_id)"
    )
    e.add_argument("--tracking-uri", dest="tracking_uri", help="tracking store (default: MLFLOW_TRACKING_URI)")
    e.add_argument("--no-progress", action="store_true", help="no progress bar")
    e.set_defaults(run=run_export)


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
    from llmrubric.io.rubric import Rubric
    from llmrubric.io.tables import validate_annotations, validate_features
    from llmrubric.mlflow_genai.read import experiment_id, read_traces, search_traces
    from llmrubric.mlflow_genai.review import queue_trace_ids
    from llmrubric.mlflow_genai.store import store_errors, tracking_client

    rubric = Rubric.load(args.rubric)
    out = check_writable_dir(args.out_dir, "--out-dir")
    client = tracking_client(args.tracking_uri)
    with store_errors():
        wanted = queue_trace_ids(experiment_id(client, args.experiment), args.queue) if args.queue else None
        got = read_traces(search_traces(client, args.experiment, wanted), rubric, args.system_tag)
    if got.texts.empty:
        raise InputError(f"experiment {args.experiment!r} has no traces", setting="--experiment")
    if not len(got.features) and not len(got.annotations):
        raise InputError(
            f"no HUMAN or LLM_JUDGE feedback of experiment {args.experiment!r} answers a question of rubric "
            f"{rubric.name!r} {rubric.ids}; the feedback names seen: {got.other_names or 'none'}",
            setting="--rubric",
        )
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


def run_export(args) -> int:
    from llmrubric.io.rubric import Rubric
    from llmrubric.io.tables import load_tables
    from llmrubric.mlflow_genai.store import store_errors, tracking_client
    from llmrubric.mlflow_genai.write import log_tables

    rubric = Rubric.load(args.rubric)
    tables = load_tables(args.annotations, args.features, rubric, texts=args.texts)
    if tables.texts is not None:
        extra = sorted(set(tables.features.text_id.astype(str)) - set(tables.texts.text_id.astype(str)))
        if extra:
            raise InputError(f"text {extra[0]!r} of the features is not in the texts table", file=str(args.texts))
    client = tracking_client(args.tracking_uri, create=True)
    with store_errors():
        found = client.get_experiment_by_name(args.experiment)
        eid = found.experiment_id if found else client.create_experiment(args.experiment)
        if found and client.search_traces(locations=[eid], max_results=1):
            raise InputError(
                f"experiment {args.experiment!r} already holds traces: export into a new one", setting="--experiment"
            )
        traces = log_tables(eid, tables, rubric, args.system_tag, progress=not args.no_progress)
    print(
        f"{len(traces)} traces, {len(tables.annotations)} HUMAN feedback, "
        f"{tables.features.groupby(['text_id', 'source', 'question_id']).ngroups} LLM_JUDGE feedback "
        f"→ MLflow experiment {args.experiment} ({eid})"
    )
    return 0
