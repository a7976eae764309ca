"""The rubric of a command that reads predictions (``label suggest``, ``leaderboard build``): ``--checkpoint`` (the
rubric the checkpoint that wrote them was trained with), else ``--rubric``, else the shipped
``conf/rubric/llm_rubric.yaml``; the predictions' questions must be the rubric's, never silently another's."""

from __future__ import annotations

from llmrubric.config import conf_path
from llmrubric.io.errors import InputError

DEFAULT = "conf/rubric/llm_rubric.yaml"


def add_rubric_flags(parser, what: str = "the predictions") -> None:
    """``--rubric`` and ``--checkpoint`` of a command reading ``what``."""
    parser.add_argument(
        "--checkpoint",
        help=f"the checkpoint that wrote {what}: its rubric (default: --rubric, else {DEFAULT})",
    )
    parser.add_argument("--rubric", help=f"rubric YAML of {what} (default: the --checkpoint's, else {DEFAULT})")


def command_rubric(args, questions) -> object:
    """The rubric of ``args`` (module doc), checked against the ``questions`` ids the predictions hold."""
    from llmrubric.io.rubric import Rubric

    if args.rubric and args.checkpoint:
        raise InputError("give --rubric or --checkpoint (whose rubric it is), not both", setting="--rubric")
    if args.checkpoint:
        from llmrubric.model.core.checkpoints import read_checkpoint

        meta, _ = read_checkpoint(args.checkpoint)
        if "rubric" not in meta:
            raise InputError("checkpoint holds no rubric", file=str(args.checkpoint))
        rubric = Rubric.from_dict(meta["rubric"], str(args.checkpoint))
        rubric = rubric.with_main(meta["main_question"]) if meta.get("main_question") else rubric
        where = f"checkpoint {args.checkpoint}"
    else:
        rubric = Rubric.load(args.rubric or conf_path("rubric", "llm_rubric.yaml"))
        where = f"rubric {args.rubric or DEFAULT}"
    unknown = sorted({str(q) for q in questions} - set(rubric.ids))
    if unknown:
        raise InputError(
            f"the predictions' questions {unknown} are not in the {where} {rubric.ids}: give --checkpoint (the one "
            "that wrote them) or --rubric",
            setting="--checkpoint" if args.checkpoint else "--rubric",
        )
    return rubric
