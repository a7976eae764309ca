"""``llmrubric data fetch | simulate | summary | texts``: get the LLM-Rubric release, write simulated data,
summarise a split, turn the release's real dialogues into a texts table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from llmrubric.apps.commands import add_noun
from llmrubric.data.fetch import UPSTREAM_BASE_URL


def register(subparsers) -> None:
    sub = add_noun(subparsers, "data", "get, simulate and summarise data sets")

    fetch = sub.add_parser("fetch", help="download a data set and verify its checksums")
    fetch.add_argument("dataset", choices=["llm-rubric"], help="the data set: llm-rubric (the paper's release)")
    fetch.add_argument("dest", type=Path, metavar="DEST", help="folder to put the files in (created if missing)")
    fetch.add_argument(
        "--base-url", default=UPSTREAM_BASE_URL, help="repository root to download from (default: %(default)s)"
    )
    fetch.add_argument(
        "--mirror",
        action="store_true",
        help="the base URL serves the files under their DEST names (a copy of a fetched folder)",
    )
    fetch.set_defaults(run=_fetch)

    simulate = sub.add_parser("simulate", help="write the simulated data set (llmrubric.data.simulate)")
    simulate.add_argument("dest", type=Path, metavar="DEST", help="folder to write the tables to (created if missing)")
    simulate.add_argument("--seed", type=int, default=0, help="seed of the simulation (default: %(default)s)")
    simulate.add_argument("--texts", type=int, default=300, help="texts to simulate (default: %(default)s)")
    simulate.add_argument("--judges", type=int, default=12, help="human judges (default: %(default)s)")
    simulate.add_argument(
        "--judges-per-text", type=int, default=3, help="judges who annotate each text (default: %(default)s)"
    )
    simulate.add_argument(
        "--shift-systems",
        type=int,
        default=None,
        metavar="N",
        help="the system-shift set (llmrubric.data.simulate.simulate_shift) with N systems instead of the demo's four",
    )
    simulate.set_defaults(run=_simulate)

    summary = sub.add_parser("summary", help="counts of one split of the LLM-Rubric release")
    summary.add_argument(
        "--llm-rubric", type=Path, required=True, metavar="ROOT", help="folder written by `data fetch llm-rubric`"
    )
    summary.add_argument(
        "--split", choices=["synthetic", "real"], required=True, help="the release's synthetic or real dialogues"
    )
    summary.add_argument("--rubric", type=Path, default=None, help="rubric YAML (default: conf/rubric/llm_rubric.yaml)")
    summary.set_defaults(run=_summary)

    texts = sub.add_parser(
        "texts", help="LLM-Rubric real_data.json → texts table (text_id, query_id, text, has_references)"
    )
    texts.add_argument("dialogues", type=Path, help="real/real_data.json of the LLM-Rubric release")
    texts.add_argument("--out", type=Path, required=True, help="texts table to write (.jsonl/.csv/.tsv/.parquet)")
    texts.set_defaults(run=_texts)


def _fetch(args: argparse.Namespace) -> int:
    from llmrubric.data.fetch import fetch_llm_rubric

    fetch_llm_rubric(args.dest, args.base_url, mirror=args.mirror)
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from llmrubric.data.simulate import write_simulated

    shift = {"shift": True, "n_systems": args.shift_systems} if args.shift_systems is not None else {}
    dest = write_simulated(
        args.dest, args.seed, n_texts=args.texts, n_judges=args.judges, judges_per_text=args.judges_per_text, **shift
    )
    print(f"wrote {dest}")
    return 0


def _summary(args: argparse.Namespace) -> int:
    from llmrubric.data import llm_rubric
    from llmrubric.data.simulate import DEFAULT_RUBRIC
    from llmrubric.io.rubric import Rubric

    tables = llm_rubric.load(args.llm_rubric, args.split, Rubric.load(args.rubric or DEFAULT_RUBRIC))
    print(json.dumps(llm_rubric.summary(tables), indent=2))
    return 0


def _texts(args: argparse.Namespace) -> int:
    from llmrubric.extract.adapters import llm_rubric_real_texts
    from llmrubric.io.files import write_table

    texts = llm_rubric_real_texts(args.dialogues)
    write_table(texts, args.out)
    print(f"{len(texts)} texts → {args.out}")
    return 0
