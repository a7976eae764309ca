"""``llmrubric ir qrels | trec-eval | nuggets | grounded-qa``: the IR evaluations.

Settings come from ``conf/ir/default.yaml`` (or ``--config``); flags override them.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmrubric.apps.commands import add_noun, section_settings
from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_outputs, check_range, check_writable_dir


def register(subparsers) -> None:
    sub = add_noun(subparsers, "ir", "IR evaluations: RUBRIC qrels, TREC runs, AutoNuggetizer, grounded QA")
    q = sub.add_parser("qrels", help="RUBRIC qrels from self-rating grades (or a calibrated autograder)")
    _grade_inputs(q)
    q.add_argument(
        "--checkpoint",
        help="calibrated autograder (trained on test-bank summaries): qrels by its label rule on the judge-free distribution",
    )
    q.add_argument("--bank", help="test bank JSONL (nugget importance for the summaries)")
    q.add_argument(
        "--annotations", help="human labels (annotations table) of the --texts: their qrels (export, no grading)"
    )
    q.add_argument("--judge-id", dest="judge_id", help="judge of --annotations (default: its only judge)")
    q.add_argument("--out", required=True, help="qrels file to write")
    q.add_argument("--labels-out", help="also write the passage labels with their (real-valued) grades as a table")
    q.set_defaults(run=run_qrels)

    e = sub.add_parser(
        "trec-eval", help="evaluate TREC runs on qrels (ir-measures), Rubric-Cover@k, verification analyses"
    )
    e.add_argument("--qrels", required=True, help="TREC qrels file the runs are evaluated on")
    e.add_argument("--runs", nargs="+", required=True, help="TREC run files (the file stem names the run)")
    _grade_inputs(e, required=False)
    e.add_argument("--bank", help="test bank JSONL: the items of each query for Rubric-Cover, and known queries")
    e.add_argument("--judgments", help="human qrels: spurious items, uncovered relevant passages, agreement")
    e.add_argument("--measures", nargs="+", metavar="MEASURE", help="ir-measures names (default: nDCG@10 AP RR P@10)")
    e.add_argument("--threshold", type=float, help="a grade at least this counts as covering (default 4)")
    e.add_argument("--cover-k", dest="cover_k", type=int, help="the k of Rubric-Cover@k (default 10)")
    e.add_argument("--out-dir", required=True, help="folder of the evaluation tables (created if missing)")
    e.set_defaults(run=run_trec_eval)

    n = sub.add_parser("nuggets", help="AutoNuggetizer All/Vital strict and partial scores per answer and per run")
    n.add_argument("--answers", required=True, help="answers table: text_id, query_id, run_id (or system_id)")
    n.add_argument("--bank", required=True, help="nugget test bank JSONL (importance vital/okay)")
    src = n.add_mutually_exclusive_group(required=True)
    src.add_argument("--assignments", help="table text_id, item_id, label (support / partial_support / not_support)")
    src.add_argument("--features", help="extracted nugget_support distributions (expected values)")
    n.add_argument("--source", help="features source to use when there are several")
    n.add_argument("--config", help="settings YAML (default: conf/ir/default.yaml)")
    n.add_argument(
        "--partial-weight",
        dest="partial_weight",
        type=float,
        help="credit of partial_support in the partial scores, in [0, 1] (default 0.5)",
    )
    n.add_argument("--out-dir", required=True, help="folder of the score tables (created if missing)")
    n.set_defaults(run=run_nuggets)

    g = sub.add_parser("grounded-qa", help="retrieval, citation, answer-quality, evidence and combined scores")
    g.add_argument("questions", help="gold questions JSONL")
    g.add_argument("predictions", help="predictions JSON (question id → answer, evidence_sentences, retrieved_docs)")
    g.add_argument("--features", help="extracted answer_quality distributions of the answers (text_id = question id)")
    g.add_argument("--failures", help="the extractor's failures table (reasons of missing judgments)")
    g.add_argument("--docs", help="folder of <doc_id>.json documents with a 'sentences' list")
    g.add_argument("--config", help="settings YAML (default: conf/ir/default.yaml)")
    g.add_argument(
        "--lambda",
        dest="lam",
        type=float,
        help="combined = lambda × answer + (1 - lambda) × evidence, in [0, 1] (default 0.5)",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--out", required=True, help="results JSON (summary and per-question results)")
    g.set_defaults(run=run_grounded_qa)


def _grade_inputs(p, required: bool = True) -> None:
    p.add_argument("--grades", help="grades table: query_id, doc_id, item_id, grade")
    p.add_argument("--features", help="extracted self-rating distributions (question ids <family>:<item_id>)")
    p.add_argument("--texts", help="texts table: text_id, query_id (+ doc_id) of the graded passages")
    p.add_argument("--source", help="features source to use when there are several")
    p.add_argument("--config", help="settings YAML (default: conf/ir/default.yaml)")
    p.add_argument(
        "--grade",
        choices=["argmax", "expected"],
        help="an item's grade: its distribution's most likely or expected grade (default argmax)",
    )
    p.add_argument(
        "--rule",
        choices=["max", "at_least_m"],
        help="a passage's label: the highest grade of its items (max, default) or the m-th highest (at_least_m)",
    )
    p.add_argument("--m", type=int, help="the m of --rule at_least_m (default 1)")
    p.set_defaults(grades_required=required)


def _grades(args, settings: dict):
    from llmrubric.io.tables import read_table, validate_features
    from llmrubric.ir.autograder import grades_from_features, read_grades

    if args.grades:
        grades = read_grades(args.grades)
        low, high = settings["grade_range"]
        outside = (grades.grade < low) | (grades.grade > high)
        if outside.any():
            row = grades.index[outside.to_numpy().argmax()]
            raise InputError(
                f"grade {grades.at[row, 'grade']:g} is outside the scale [{low}, {high}] (autograder.grade_range)",
                file=str(args.grades),
                row=int(row),
                column="grade",
            )
        return grades
    if args.features:
        if not args.texts:
            raise InputError("grades from --features need --texts (text_id → query_id, doc_id)")
        features = validate_features(read_table(args.features, "features"))
        return grades_from_features(
            features, read_table(args.texts, "texts"), settings["family"], settings["grade"], args.source
        )
    if args.grades_required:
        raise InputError("give --grades or --features with --texts")
    return None


def run_qrels(args) -> int:
    from llmrubric.io.files import check_table_path, write_table
    from llmrubric.io.tables import read_table, validate_features
    from llmrubric.ir.autograder import passage_labels, write_qrels

    settings = section_settings(args, "ir", "autograder", "grade", "rule", "m")
    check_outputs(
        {"--out": args.out, "--labels-out": args.labels_out},
        {
            "--grades": args.grades,
            "--features": args.features,
            "--texts": args.texts,
            "--checkpoint": args.checkpoint,
            "--bank": args.bank,
            "--annotations": args.annotations,
        },
    )
    if args.labels_out:
        check_table_path(args.labels_out, "--labels-out")
    if args.annotations:
        if args.labels_out:
            raise InputError("--labels-out is for graded qrels, not --annotations")
        return _export_qrels(args)
    if args.checkpoint:
        from llmrubric.extract.testbank import read_bank
        from llmrubric.ir.calibrated import calibrated_labels
        from llmrubric.model.core.checkpoints import load_model

        if not (args.features and args.texts):
            raise InputError("calibrated qrels need --features and --texts")
        importance = {i.item_id: i.importance for i in read_bank(args.bank)[0]} if args.bank else None
        features = validate_features(read_table(args.features, "features"))
        from llmrubric.model.core.label_rule import rule_of

        model = load_model(args.checkpoint)
        labels = calibrated_labels(model, features, settings["family"], read_table(args.texts, "texts"), importance)
        rule = rule_of(model).to_dict()
        print(f"label rule: {rule['name']} ({rule.get('fitted_on', 'no record')})")
    else:
        labels = passage_labels(_grades(args, settings), settings["rule"], int(settings["m"]))
    if args.labels_out:
        write_table(labels, args.labels_out)
    write_qrels(labels, args.out)
    print(
        f"{len(labels)} passages, {labels.query_id.nunique()} queries, label counts {labels.relevance.value_counts().sort_index().to_dict()} → {args.out}"
    )
    return 0


def _export_qrels(args) -> int:
    """``ir qrels --annotations``: one judge's labels of ``imports.question_id`` as TREC qrels."""
    from llmrubric.io.tables import read_table
    from llmrubric.ir.autograder import write_qrels
    from llmrubric.ir.judgments import qrels_labels

    if not args.texts:
        raise InputError("qrels of --annotations need --texts (text_id → query_id, doc_id)")
    question = section_settings(args, "ir", "imports")["question_id"]
    labels = qrels_labels(
        read_table(args.annotations, "annotations"), read_table(args.texts, "texts"), args.judge_id, question
    )
    write_qrels(labels, args.out)
    print(f"{len(labels)} passages, {labels.query_id.nunique()} queries → {args.out}")
    return 0


def run_trec_eval(args) -> int:
    from llmrubric.evaluation.metrics import markdown_table
    from llmrubric.extract.testbank import read_bank
    from llmrubric.io.files import write_json, write_table, write_text
    from llmrubric.ir import autograder as ag

    settings = section_settings(args, "ir", "autograder", "grade", "rule", "m", "measures", "threshold", "cover_k")
    qrels = ag.read_qrels(args.qrels)
    bank = read_bank(args.bank)[0] if args.bank else None
    queries = set(qrels.query_id) | ({i.query_id for i in bank} if bank else set())
    runs = {Path(p).stem: ag.read_run(p, queries) for p in args.runs}
    if len(runs) != len(args.runs):
        raise InputError(f"two run files share a name: {[Path(p).stem for p in args.runs]}")
    threshold = settings["threshold"]
    board, per_query = ag.evaluate_runs(qrels, runs, list(settings["measures"]), int(threshold))
    report: dict = {"settings": settings}
    grades = _grades(args, settings)
    if grades is not None:
        items = None
        if bank:
            items = {}
            for i in bank:
                items.setdefault(i.query_id, set()).add(i.item_id)
        k = int(settings["cover_k"])
        covers = {name: ag.rubric_cover(grades, run, k, threshold, items) for name, run in runs.items()}
        board[f"RubricCover@{k}"] = board.run.map({name: c.cover.mean() for name, c in covers.items()})
        report["cover_unjudged"] = {name: int(c.unjudged.sum()) for name, c in covers.items()}
        if args.judgments:
            judgments = ag.read_qrels(args.judgments)
            rel = int(settings["judged_relevant"])
            spurious, uncovered = (
                ag.spurious_items(grades, judgments, threshold, rel),
                ag.uncovered_relevant(grades, judgments, threshold, rel),
            )
            write_table(spurious, Path(args.out_dir) / "spurious_items.csv")
            write_table(uncovered, Path(args.out_dir) / "uncovered_relevant.csv")
            labels = ag.passage_labels(grades, settings["rule"], int(settings["m"]))
            report["agreement"] = ag.agreement(labels, judgments, int(threshold), rel)
            report["verification"] = {
                "spurious_items": spurious.head(20).to_dict("records"),
                "uncovered_relevant": int(len(uncovered)),
            }
    report["leaderboard"] = board.to_dict("records")
    out = Path(args.out_dir)
    write_table(per_query, out / "per_query.csv")
    write_table(board, out / "leaderboard.csv")
    write_json(report, out / "leaderboard.json")
    metrics = [c for c in board.columns if c not in ("run", "queries", "missing_queries")]
    table = markdown_table({r["run"]: r for r in board.to_dict("records")}, metrics)
    write_text(table + "\n", out / "leaderboard.md")
    print(table)
    return 0


def run_nuggets(args) -> int:
    from llmrubric.evaluation.metrics import markdown_table
    from llmrubric.extract.testbank import read_bank
    from llmrubric.io.files import write_json, write_table, write_text
    from llmrubric.io.tables import read_table, validate_features
    from llmrubric.ir import nuggets as ng

    settings = section_settings(args, "ir", "nuggets", "partial_weight")
    partial_weight = check_range("--partial-weight", settings["partial_weight"], 0, 1)
    out = Path(args.out_dir)
    check_writable_dir(out, "--out-dir")
    bank = read_bank(args.bank)[0]
    answers = read_table(args.answers, "texts")
    if args.assignments:
        from llmrubric.io.tables import read_raw

        support = ng.support_from_labels(read_raw(args.assignments))
    else:
        support = ng.support_from_features(
            validate_features(read_table(args.features, "features")), settings["family"], args.source
        )
    per_answer = ng.answer_scores(support, answers, bank, partial_weight)
    per_run = ng.run_scores(per_answer)
    write_table(per_answer, out / "answers.csv")
    write_table(per_run, out / "runs.csv")
    write_json({"settings": settings, "runs": per_run.to_dict("records")}, out / "runs.json")
    table = markdown_table({r["run_id"]: r for r in per_run.to_dict("records")}, ng.SCORES)
    write_text(table + "\n", out / "runs.md")
    print(table)
    return 0


def run_grounded_qa(args) -> int:
    from llmrubric.io.files import json_safe, write_json
    from llmrubric.io.tables import read_table, validate_features
    from llmrubric.ir import grounded_qa as gq

    settings = section_settings(args, "ir", "grounded_qa")
    lam = check_range("--lambda", args.lam if args.lam is not None else settings["lambda"], 0, 1)
    if args.docs is not None and not Path(args.docs).is_dir():
        raise InputError("the documents folder does not exist", file=str(args.docs), setting="--docs")
    check_outputs(
        {"--out": args.out},
        {
            "questions": args.questions,
            "predictions": args.predictions,
            "--features": args.features,
            "--failures": args.failures,
            "--config": args.config,
        },
    )
    questions = gq.read_questions(args.questions)
    predictions = gq.read_predictions(args.predictions, {q["question_id"] for q in questions})
    quality = None
    if args.features:
        failures = read_table(args.failures, "texts") if args.failures else None
        quality = gq.answer_quality(
            validate_features(read_table(args.features, "features")), settings["family"], failures
        )
    result = gq.evaluate(
        questions,
        predictions,
        quality,
        args.docs,
        lam,
        tuple(settings["recall_at"]),
        progress=not args.no_progress,
    )
    write_json(result, args.out)
    print(json.dumps(json_safe(result["summary"]), indent=2))
    return 0
