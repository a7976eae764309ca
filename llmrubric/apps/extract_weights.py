"""``llmrubric extract weights``: each block's weight in the calibrated score, from a pilot extraction of labelled
texts, for the adaptive stop weighted by it (:mod:`llmrubric.extract.tolerance_weights`; docs/extract.md,
"Weighted by the score")."""

from __future__ import annotations

from pathlib import Path

import yaml

from llmrubric.io.errors import InputError

DECIMALS = 4  # of each weight written
UNFEATURED_ADVICE = "set data.drop_unfeatured=true to drop them"  # load_tables's advice, for train's config


def add_weights_verb(sub) -> None:
    p = sub.add_parser(
        "weights",
        help="features + human labels → each block's weight in the score, for --tolerance-weights",
        description="Weigh each block (source, question) by how much the main question's calibrated answer moves "
        "with the block's expected answer: a ridge of the main question's mean human answer on every block's "
        "expected answer, normalised to mean 1 over the blocks (blocks of categories weigh 1). Run it on a pilot "
        "extraction of labelled texts (e.g. --samples 2); a sampled extraction with --tolerance-weights then "
        "divides each block's tolerance by its weight.",
    )
    p.add_argument("features", help="features table of the pilot extraction (.parquet/.csv/.tsv/.jsonl)")
    p.add_argument("annotations", help="human annotations of (some of) the same texts")
    p.add_argument("--rubric", required=True, help="the rubric YAML (its main question is the score)")
    p.add_argument("--out", required=True, help="weights YAML to write: {source: {question_id: weight}}")
    p.add_argument(
        "--drop-unfeatured",
        action="store_true",
        help="weigh on the annotated texts that have features, leaving out the others (a pilot of some texts)",
    )
    p.set_defaults(run=run_weights)


def run_weights(args) -> int:
    from llmrubric.extract.tolerance_weights import score_weights
    from llmrubric.io.files import write_text
    from llmrubric.io.guards import check_outputs
    from llmrubric.io.rubric_arg import as_rubric
    from llmrubric.io.tables import load_tables

    out = Path(args.out)
    if out.suffix.lower() not in (".yaml", ".yml"):
        raise InputError("the weights file is YAML: give a .yaml or .yml path", file=str(out), setting="--out")
    check_outputs({"--out": out}, {"features": args.features, "annotations": args.annotations, "--rubric": args.rubric})
    rubric = as_rubric(args.rubric)
    try:
        tables = load_tables(args.annotations, args.features, rubric, drop_unfeatured=args.drop_unfeatured)
    except InputError as e:
        if UNFEATURED_ADVICE not in str(e):
            raise
        where = {"file": e.file, "row": e.row, "column": e.column}
        message = str(e).split(": ", 1)[1] if e.file else str(e)
        raise InputError(message.replace(UNFEATURED_ADVICE, "add --drop-unfeatured to leave them out"), **where) from e
    try:
        weights = score_weights(tables, rubric)
    except InputError as e:
        if e.file is None:
            raise InputError(str(e), file=str(args.annotations)) from e
        raise
    rounded = {s: {q: round(w, DECIMALS) for q, w in qs.items()} for s, qs in weights.items()}
    write_text(yaml.safe_dump(rounded, sort_keys=False), out)
    blocks = sum(len(qs) for qs in rounded.values())
    heaviest = max(((w, s, q) for s, qs in rounded.items() for q, w in qs.items()), default=None)
    top = f"; heaviest {heaviest[1]} {heaviest[2]} ({heaviest[0]:g})" if heaviest else ""
    print(f"{blocks} blocks of {len(rounded)} sources weighed (mean 1){top} → {out}")
    return 0
