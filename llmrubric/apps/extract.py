"""``llmrubric extract features | bank | summaries | weights``: the LLM's answer distributions.

``features``: texts (+ rubric or test bank) → features table, cached and resumable;
``bank``: generate a test bank to edit by hand;
``summaries``: per-item features → a summary-only features table;
``weights``: features + human labels → each block's weight in the score (:mod:`llmrubric.apps.extract_weights`).
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import fields
from pathlib import Path

import pandas as pd

from llmrubric.apps.commands import add_noun
from llmrubric.apps.extract_weights import add_weights_verb
from llmrubric.config import GROUP_SCHEMAS, command_settings
from llmrubric.config.extract import adaptive_settings
from llmrubric.extract.backends import BACKEND_KEYS, make_backend_from
from llmrubric.extract.backends.generation import ModeSettings
from llmrubric.io.errors import InputError
from llmrubric.io.files import write_json, write_table
from llmrubric.io.tables import read_table

log = logging.getLogger(__name__)
COMMAND_ONLY = ("run", "noun", "verb", "config", "overrides")  # argparse values that are no setting


def load_config(path: str | Path, overrides: list[str] | None = None) -> dict:
    """A config of the ``conf/extract/`` group (its ``defaults`` list pulls in sibling files) over
    :class:`llmrubric.config.ExtractConfig`'s defaults, with Hydra ``overrides`` such as ``batch_size=8``."""
    return command_settings("extract", path, overrides=overrides or [], what="extract config")


def register(subparsers) -> None:
    sub = add_noun(subparsers, "extract", "the LLM's answer distributions: features tables and test banks")
    add_features_verb(sub)
    add_bank_verb(sub)
    add_summaries_verb(sub)
    add_weights_verb(sub)


def add_features_verb(sub) -> None:
    """``extract features``: its inputs and outputs, then the settings it shares with the config."""
    p = sub.add_parser(
        "features",
        help="texts (+ rubric or test bank) → features table, cached and resumable",
        description="Ask an LLM each rubric question (or test-bank item) about each text and write the "
        "probability of every answer option: the features table that calibrators read. Results are cached "
        "(SQLite) and resumed; settings come from --config and the flags override them.",
    )
    p.add_argument("texts", help="texts table (text_id, text, …): .jsonl/.csv/.tsv/.parquet")
    p.add_argument("--out", required=True, help="features table to write (.parquet/.csv/.tsv/.jsonl)")
    p.add_argument("--config", help="a conf/extract/*.yaml file (composed by Hydra); flags override it")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar="KEY=VALUE",
        help="Hydra override of the config (repeatable)",
    )
    p.add_argument("--rubric", help="likert family: the rubric YAML whose questions are asked")
    p.add_argument(
        "--family",
        choices=["likert", "self_rating", "nugget_support", "answer_quality"],
        help="what is asked: the rubric's questions (likert) or the items of a test bank (default: likert)",
    )
    p.add_argument("--bank", help="test bank JSONL (item families)")
    p.add_argument(
        "--bank-errors",
        choices=["raise", "skip"],
        default="raise",
        help="a malformed bank line: error, or skip and record",
    )
    p.add_argument("--template", help="template name under conf/prompts/ (default: the family's)")
    p.add_argument(
        "--backend",
        choices=["transformers", "openai"],
        help="transformers: a local model (HF folder or .gguf); openai: an OpenAI-compatible server",
    )
    p.add_argument("--model", help="an HF model folder, a .gguf file, or the server's model name")
    p.add_argument("--source", help="source name in the features table (default: model name + template)")
    add_run_flags(p)
    add_setting_flags(p)
    p.set_defaults(run=run)


def add_run_flags(p) -> None:
    """How ``extract features`` runs: cache, progress, shards and their launcher."""
    p.add_argument("--cache", help="SQLite result store (default: <out>.cache.sqlite)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the requests, prompt and output tokens and cost (price.prompt, price.output) of the prompts "
        "the cache does not hold, and the longest prompt (against context_tokens); write nothing",
    )
    p.add_argument("--summaries", action="store_true", help="add fixed-size summary blocks of item families")
    p.add_argument(
        "--track",
        metavar="URI",
        nargs="?",
        const="",
        help="log the run's requests, tokens and statuses to an MLflow run (URI: the tracking store; default the project's)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--cached-only",
        action="store_true",
        help="compute nothing: write what the cache holds (the rest listed as 'no result')",
    )
    p.add_argument(
        "--adaptive",
        dest="adaptive_extraction",
        action="store_true",
        help="ask each text only the blocks worth asking, one at a time (docs/adaptive.md); needs --calibrator",
    )
    p.add_argument("--calibrator", help="with --adaptive: a checkpoint trained on this model's features and rubric")
    p.add_argument(
        "--budget", dest="adaptive.budget", type=int, help="with --adaptive: most calls per text (adaptive.budget)"
    )
    p.add_argument(
        "--min-gain",
        dest="adaptive.min_gain",
        type=float,
        help="with --adaptive: stop a text when the best expected variance reduction per unit cost is below this",
    )
    p.add_argument(
        "--shard", metavar="K/N", help="only the texts of shard K of N (0 <= K < N; by the sha256 of text_id)"
    )
    p.add_argument(
        "--shards", type=int, metavar="N", help="run N shard jobs with submitit, merge their caches, write the outputs"
    )
    p.add_argument(
        "--launcher",
        metavar="NAME|FILE",
        help="with --shards: local (default) or slurm (conf/extract/launcher/NAME.yaml), or a launcher YAML file",
    )
    p.add_argument(
        "--launcher-set",
        dest="launcher_overrides",
        action="append",
        metavar="KEY=VALUE",
        help="Hydra override of the launcher config (repeatable), e.g. slurm_partition=gpu",
    )


def add_setting_flags(p) -> None:
    """Flags of the extract settings (:class:`llmrubric.config.ExtractConfig` and the backends' keys)."""
    p.add_argument(
        "--orders",
        type=int,
        help="likert: ask each question with the options in this many rotated orders, averaged (default 1)",
    )
    p.add_argument(
        "--min-label-mass",
        type=float,
        help="blocks whose labels get less total probability are marked low_label_mass (default 0.05)",
    )
    p.add_argument(
        "--detect-injection",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mark blocks whose text matches an injection pattern as possible_injection (default off)",
    )
    p.add_argument("--injection-patterns", help="YAML file of patterns (default conf/injection/default.yaml)")
    p.add_argument(
        "--mode",
        choices=["logprob", "sampled", "verbalized", "reasoned"],
        help="how a block is read: the answer token's logprobs (default) or a server's generated answers (docs/extract.md)",
    )
    for key in sorted({k for keys in BACKEND_KEYS.values() for k in keys}):
        flag = "--" + key.replace("_", "-")
        backend = next(name for name, keys in BACKEND_KEYS.items() if key in keys)
        help = f"{backend} backend: {BACKEND_HELP[key]} (docs/extract.md)"
        if key in ("prefix_reuse", "chat_template", "whitespace_continuation"):
            p.add_argument(flag, dest=key, action=argparse.BooleanOptionalAction, default=None, help=help)
        else:
            p.add_argument(flag, dest=key, default=None, type=_number, help=help)


BACKEND_HELP = {  # the help line of each backend setting's flag (``--gguf-file``: the key gguf_file)
    "gguf_file": "the .gguf file inside a model folder or repository",
    "device": "cpu, cuda, cuda:N or mps (default: the best available)",
    "dtype": "the weights' dtype (float32, bfloat16, float16; default: the model's on a GPU, float32 on a CPU)",
    "threads": "CPU threads (default: the CPUs the process may use)",
    "batch_size": "prompts per forward pass",
    "prefix_batch_size": "shared prompt prefixes per forward pass (default: 1 on a CPU, batch_size on a GPU)",
    "prefix_reuse": "reuse the cached keys and values of a prompt prefix shared by several questions",
    "max_length": "most tokens of a prompt (default: the model's context)",
    "overflow": "a text longer than the context: truncate (cut it) or refuse (record it, ask nothing)",
    "label_prefix": "the text before an answer label (default: the chat template's, or one space)",
    "chat_template": "ask through the model's chat template",
    "gguf_cache": "folder that keeps what a .gguf load built (default ~/.cache/llmrubric/gguf; null: off)",
    "base_url": "the server's URL (several: a list, requests spread over them)",
    "endpoint": "chat or completions",
    "api_key_env": "environment variable that holds the API key",
    "azure_api_version": "Azure OpenAI: the api-version of its URLs",
    "top_logprobs": "alternatives asked per answer position (at least the number of options)",
    "concurrency": "requests in flight per endpoint",
    "max_retries": "retries of a failed request",
    "timeout": "seconds a request may take",
    "backoff": "seconds before the first retry (doubled at each further one)",
    "max_backoff": "most seconds between retries",
    "pause_after": "failures in a row after which an endpoint is paused",
    "pause": "seconds an endpoint is first paused (doubled at each further pause)",
    "max_pause": "most seconds an endpoint is paused",
    "down_after": "seconds without any answer, while requests fail, after which the server is down: the blocks "
    "not yet answered end as server_down",
    "whitespace_continuation": "completions: ask once more after a likely whitespace token that carries no label",
    "whitespace_min_prob": "completions: the probability from which a whitespace token is continued",
    "samples": "sampled, reasoned: answers per block (with tolerance: the most)",
    "samples_per_request": "answers per request (the server's n; 1 for servers without n)",
    "tolerance": "sampled, reasoned: stop a block once it has spread / tolerance answers (docs/extract.md, adaptive stop)",
    "tolerance_weights": "with tolerance: YAML of each block's weight in the score (extract weights); tolerance / weight",
    "temperature": "the sampling temperature (default: 1; verbalized 0)",
    "max_tokens": "output tokens per answer (default: sampled 8, verbalized 200, reasoned 512)",
    "sum_tolerance": "verbalized: how far from 1 the probabilities may sum (then renormalised)",
    "structured_output": "verbalized: json_schema, json_object (llama.cpp) or none",
    "seed": "seeds each request of a block",
}


def add_bank_verb(sub) -> None:
    b = sub.add_parser("bank", help="generate a test bank (questions or nuggets) to edit")
    b.add_argument(
        "queries", help="table with query_id, query (and passages: passage text rows with query_id for nuggets)"
    )
    b.add_argument(
        "--kind",
        choices=["question", "nugget"],
        default="question",
        help="question: questions an answer should address; nugget: facts from --passages (default: question)",
    )
    b.add_argument("--passages", help="texts table (text_id, query_id, text) for nuggetization")
    b.add_argument("--n", type=int, default=10, help="questions to generate per query (--kind question; default: 10)")
    b.add_argument("--config", help="a conf/extract/*.yaml file naming the backend and model; flags override it")
    b.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar="KEY=VALUE",
        help="Hydra override of the config (repeatable)",
    )
    b.add_argument(
        "--backend",
        choices=["transformers", "openai"],
        help="transformers: a local model (HF folder or .gguf); openai: an OpenAI-compatible server",
    )
    b.add_argument("--model", help="the generating model: an HF model folder, a .gguf file, or the server's model name")
    b.add_argument("--out", required=True, help="test bank JSONL to write (edit it by hand before extracting)")
    b.set_defaults(run=run_bank)


def add_summaries_verb(sub) -> None:
    m = sub.add_parser(
        "summaries",
        help="per-item features of a test bank → summary-only features table",
        description="Fixed-size summary blocks (.mean, .max, .cov_ge<g>, …) of one item family, "
        "the only blocks of the table written (llmrubric.extract.summaries).",
    )
    m.add_argument("features", help="features table with the family's per-item blocks (question_id <family>:<item_id>)")
    m.add_argument(
        "--family",
        required=True,
        choices=["self_rating", "nugget_support", "answer_quality"],
        help="the item family whose per-item blocks are summarised",
    )
    m.add_argument("--bank", help="test bank JSONL: nugget importance for .vital_support")
    m.add_argument("--out", required=True, help="summary features table to write (.parquet/.csv/.tsv/.jsonl)")
    m.set_defaults(run=run_summaries)


def _number(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return None if text.lower() in ("null", "none") else text


def _settings(args) -> dict:
    """The extract config (``--config`` with ``--set``) under the flags that name its settings, and
    the command's other flags (texts, out, shards, …) beside them."""
    if getattr(args, "overrides", None) and not getattr(args, "config", None):
        raise InputError("--set needs --config")
    given = {k: v for k, v in vars(args).items() if k not in COMMAND_ONLY}
    setting_keys = {f.name for f in fields(GROUP_SCHEMAS["extract"])} | {k for ks in BACKEND_KEYS.values() for k in ks}
    settings = command_settings(
        "extract",
        getattr(args, "config", None),
        {k: v for k, v in given.items() if k.split(".")[0] in setting_keys},
        getattr(args, "overrides", None) or [],
        "extract config",
    )
    settings.update({k: v for k, v in given.items() if k.split(".")[0] not in setting_keys and v is not None})
    if settings.get("model") in (None, "???"):
        raise InputError("no model given (--model or model: in the config)")
    return settings


def run(args) -> int:
    from llmrubric.extract.cost import check_price
    from llmrubric.extract.injection import make_detector
    from llmrubric.extract.runner import Interrupted
    from llmrubric.extract.shards import launch, launcher_settings, parse_shard, shard_of
    from llmrubric.extract.summaries import summarise

    settings = _settings(args)
    check_run_flags(settings)
    check_price(settings.get("price"))
    detector = make_detector(settings["detect_injection"], settings["injection_patterns"])
    shard = parse_shard(settings["shard"]) if settings.get("shard") else None
    out = Path(settings["out"])
    texts = read_table(settings["texts"], "texts")
    if shard and "text_id" in texts.columns:
        mine = texts.text_id.astype(str).map(lambda text_id: shard_of(text_id, shard[1]) == shard[0])
        if not mine.any():
            raise InputError(f"shard {settings['shard']} holds none of the {len(texts)} texts", setting="--shard")
        texts = texts[mine]
    tasks, skipped, rubric, template, importance, bank_warnings = _tasks(settings, texts)
    source = settings.get("source") or default_source(settings, template.name)
    if settings.get("tolerance_weights") is not None:
        settings["tolerance_weights"] = source_weights(settings, source, tasks)
    cache_path = Path(settings.get("cache") or out.with_name(out.name + ".cache.sqlite"))
    if settings.get("dry_run"):
        print(json.dumps({source: dry_run(settings, tasks, cache_path)}))
        return 0
    if settings.get("shards") is not None:
        launcher = launcher_settings(settings.get("launcher") or "local", settings.get("launcher_overrides") or [])
        result = launch(
            tasks,
            skipped,
            rubric,
            settings,
            source,
            cache_path,
            out.with_name(out.name + ".jobs"),
            launcher,
            detector,
        )
    elif settings.get("adaptive_extraction"):
        result = _run_adaptive(settings, tasks, skipped, rubric, source, cache_path, detector)
    else:
        try:
            result = _run_plain(settings, tasks, skipped, rubric, source, cache_path, detector)
        except Interrupted as e:
            return interrupted(e)
    features = result.features
    if settings.get("summaries") and settings["family"] != "likert":
        features = pd.concat([features, summarise(features, settings["family"], importance)], ignore_index=True)
    if features.empty:
        raise InputError(f"no features were obtained: {nothing_obtained(result)}; nothing written", file=str(out))
    failures_path = out.with_name(out.stem + ".failures" + out.suffix)
    summary = {
        **result.summary,
        "bank_warnings": len(bank_warnings),
        "features": str(out),
        "failures": str(failures_path),
    }
    write_table(features, out)
    write_table(result.failures, failures_path)
    write_json(summary, out.with_name(out.stem + ".summary.json"))
    if settings.get("track") is not None:
        track(summary, settings, source)
    print(json.dumps(summary))
    return 0


def open_cache(backend, cache_path: Path, check: bool = True):
    """The run's cache; before a new one is made, the server is checked (``check``), so that a server that is down
    is one error line and leaves no empty cache file."""
    from llmrubric.extract.cache import ResultCache

    if check and not cache_path.exists():
        backend.check()
    return ResultCache(cache_path)


def _run_plain(settings: dict, tasks, skipped, rubric, source: str, cache_path: Path, detector):
    """One process asks every block the cache lacks (``Interrupted`` on Ctrl-C, with what the cache kept)."""
    from llmrubric.extract.runner import extract

    backend = make_backend_from(settings)
    try:
        cache = open_cache(backend, cache_path, check=not settings.get("cached_only"))
        try:
            return extract(
                tasks,
                backend,
                cache,
                source,
                skipped,
                rubric,
                progress=not settings.get("no_progress"),
                min_label_mass=float(settings["min_label_mass"]),
                compute=not settings.get("cached_only"),
                detector=detector,
            )
        finally:
            cache.close()
    finally:
        backend.close()


def interrupted(e) -> int:
    """Ctrl-C: one line saying what the cache kept, exit code 130 (nothing else is written)."""
    import sys

    print(
        f"interrupted (Ctrl-C): no request was sent after the signal; {e.kept} results of this run are kept in "
        f"{e.cache} ({e.after} of them from requests in flight at the signal); nothing else written; run the same "
        "command again to resume",
        file=sys.stderr,
    )
    return 130


def nothing_obtained(result) -> str:
    """Why a run got no features, in a few words: its blocks' statuses, most frequent first, and the reason of the
    commonest failure; not-applicable blocks are counted apart, never as the reason (the failures table is not
    written then: a run that ends in an error writes nothing, the cache keeps what it asked)."""
    rows = result.failures[result.failures.status != "possible_injection"]
    failures = rows[rows.status != "not_applicable"]
    skipped = rows.groupby(["text_id", "question_id"]).ngroups - failures.groupby(["text_id", "question_id"]).ngroups
    apart = f"; {skipped} blocks not applicable" if skipped else ""
    if failures.empty:
        return f"no block was asked{apart}"
    counts = failures.status.value_counts()
    commonest = failures[failures.status == counts.index[0]]
    first = " ".join(str(commonest.reason.iloc[0]).split())[:200]
    listed = ", ".join(f"{status} {n}" for status, n in counts.items())
    blocks = failures.groupby(["text_id", "question_id"]).ngroups
    return f"{blocks} blocks without a result ({listed}; {counts.index[0]}: {first}){apart}"


def check_run_flags(settings: dict) -> None:
    """Flags that do not go together: a dry run plans a plain extraction; shards and their launcher."""
    if settings.get("dry_run") and (settings.get("adaptive_extraction") or settings.get("shards") is not None):
        raise InputError("--dry-run plans a plain extraction: leave out --adaptive and --shards", setting="--dry-run")
    if not settings.get("dry_run"):
        check_adaptive(settings)
    if settings.get("shards") is not None and (settings.get("shard") or settings.get("cached_only")):
        raise InputError("--shards runs every shard: leave out --shard and --cached-only", setting="--shards")
    if settings.get("shards") is None and (settings.get("launcher") or settings.get("launcher_overrides")):
        raise InputError("--launcher and --launcher-set go with --shards N", setting="--launcher")


def track(summary: dict, settings: dict, source: str) -> None:
    """The run's counts as an MLflow run ``extract <source>`` (experiment ``llmrubric-extract``): the source, mode,
    model and backend as parameters, every number of the summary (requests, tokens, statuses) as a metric."""
    from llmrubric.experiments.tracking import Tracker

    tracker = Tracker("llmrubric-extract", settings["track"] or None)
    with tracker.run(f"extract {source}", tags={"job": "extract", "source": source}) as run:
        run.log_params({"source": source, "mode": settings.get("mode") or "logprob", "model": settings["model"]})
        run.log_params({"backend": settings["backend"]})
        number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
        this_run = summary.get("this_run", {})
        run.log_metrics(
            {
                **{k: v for k, v in summary.items() if number(v)},
                **{f"answers.{k}": v for k, v in summary.get("answers", {}).items()},
                **{f"this_run.{k}": v for k, v in this_run.items() if number(v)},
                **{f"this_run.answers.{k}": v for k, v in this_run.get("answers", {}).items()},
            }
        )


def source_weights(settings: dict, source: str, tasks) -> dict[str, float]:
    """The tolerance weights of the run's ``source`` (question_id → weight) from the ``tolerance_weights`` file,
    for a sampled or reasoned run with a tolerance."""
    from llmrubric.extract.tolerance_weights import read_weights

    if settings.get("mode") not in ("sampled", "reasoned") or settings.get("tolerance") is None:
        raise InputError(
            "tolerance_weights go with --mode sampled or reasoned and a --tolerance", setting="tolerance_weights"
        )
    return read_weights(settings["tolerance_weights"], source, [t.question_id for t in tasks])


def default_source(settings: dict, template: str) -> str:
    """Model name + template, + ``:<mode>`` for a mode other than logprob (blocks of several modes share a table),
    + the stop of a sampled or reasoned block (``-k10``: fixed k; ``-k10-tol0.1``: the adaptive stop at that
    tolerance, at most k; ``-weighted``: with tolerance weights), so that runs of other stops get other names."""
    mode = settings.get("mode") or "logprob"
    name = f"{Path(str(settings['model'])).name}/{template}" + (f":{mode}" if mode != "logprob" else "")
    if mode in ("sampled", "reasoned"):
        name += f"-k{settings.get('samples') or ModeSettings.samples}"
        if settings.get("tolerance") is not None:
            name += f"-tol{float(settings['tolerance']):g}" + ("-weighted" if settings.get("tolerance_weights") else "")
    return name


def dry_run(settings: dict, tasks, cache_path: Path) -> dict:
    """The cost plan of the ``tasks`` a run would ask (:func:`llmrubric.extract.cost.plan`): those the cache at
    ``cache_path`` does not hold as the run would find them, counted by the settings' tokenizer (the transformers
    backend's model by default) or estimated; ``asked_again``: those of them the cache holds without a result, by
    their status (asked with new seeds, or resumed where a run was cut short)."""
    from llmrubric.extract.cost import TokenCounter, load_tokenizer, plan

    if settings["backend"] == "openai":
        make_backend_from(settings).close()  # its settings checked as a run checks them (it sends nothing)
    todo, again = uncached(settings, tasks, cache_path)
    path = settings.get("tokenizer") or (settings["model"] if settings["backend"] == "transformers" else None)
    counter = None
    if path:
        server = settings["backend"] == "openai"
        chat = settings.get("endpoint", "chat") == "chat" if server else bool(settings.get("chat_template"))
        counter = TokenCounter(load_tokenizer(path), chat, settings.get("system_prompt"))
    figures = plan(todo, settings, counter, cached=len(tasks) - len(todo))
    figures["asked_again"] = again
    figures["resumed_answers"] = sum(
        int(t.resume.get("drawn", len(t.resume.get("answers", [])))) for t in todo if t.resume
    )
    return figures


def uncached(settings: dict, tasks, cache_path: Path) -> tuple[list, dict[str, int]]:
    """The ``tasks`` a run would ask: all without a cache file, else those it holds no final result of under the
    backend's cache key (:func:`llmrubric.extract.runner.split_cached`; the transformers backend loads its model
    for that key), and the statuses the cache holds for them ({} for a block it does not hold). Opens no new cache
    file."""
    from collections import Counter

    from llmrubric.extract.cache import ResultCache
    from llmrubric.extract.runner import split_cached

    if not cache_path.is_file():
        return list(tasks), {}
    backend = make_backend_from(settings)
    cache = ResultCache(cache_path)
    try:
        todo = split_cached(tasks, cache, backend.model_id)[1]
        held = (cache.get(backend.model_id, t) for t in todo)
        return todo, dict(Counter(r.status for r in held if r is not None))
    finally:
        cache.close()
        backend.close()


def check_adaptive(settings: dict) -> None:
    """``--adaptive`` goes with ``--calibrator`` and runs in one process; its settings in range."""
    settings["adaptive"] = adaptive_settings(settings.get("adaptive"))
    if not settings.get("adaptive_extraction"):
        if settings.get("calibrator"):
            raise InputError("--calibrator is for --adaptive extraction", setting="--calibrator")
        return
    if not settings.get("calibrator"):
        raise InputError(
            "--adaptive needs --calibrator CKPT (a calibrator of this model's features)", setting="--calibrator"
        )
    for flag in ("shards", "shard", "cached_only"):
        if settings.get(flag):
            raise InputError(f"--adaptive does not run with --{flag.replace('_', '-')}", setting="--adaptive")


def _run_adaptive(settings, tasks, skipped, rubric, source, cache_path, detector):
    """The adaptive extraction of ``tasks`` with the selector of ``--calibrator``."""
    from llmrubric.model.adaptive import Selector
    from llmrubric.model.core.checkpoints import load_model
    from llmrubric.scoring.adaptive_extract import check_rubric, check_source, extract_adaptive

    model = load_model(settings["calibrator"])
    if rubric is not None:
        check_rubric(model.rubric, rubric, settings["calibrator"])
    selector = Selector(model, settings["adaptive"])
    check_source(selector, source, tasks)
    backend = make_backend_from(settings)
    cache = open_cache(backend, cache_path)
    try:
        return extract_adaptive(
            tasks,
            backend,
            cache,
            source,
            selector,
            skipped,
            rubric,
            progress=not settings.get("no_progress"),
            min_label_mass=float(settings["min_label_mass"]),
            detector=detector,
        )
    finally:
        cache.close()
        backend.close()


def _tasks(settings: dict, texts: pd.DataFrame) -> tuple:
    """The family's tasks of ``texts``: ``(tasks, skipped, rubric, template, importance, bank_warnings)``."""
    from llmrubric.extract.families import FAMILIES, item_tasks, likert_tasks
    from llmrubric.extract.prompts import PromptTemplate
    from llmrubric.extract.testbank import read_bank
    from llmrubric.io.rubric import Rubric

    family = settings["family"]
    rubric, skipped, bank_warnings, importance = None, [], [], None
    if family == "likert":
        if not settings.get("rubric"):
            raise InputError("the likert family needs --rubric")
        rubric = Rubric.load(settings["rubric"])
        template = PromptTemplate(settings.get("template") or "llm_rubric")
        tasks, skipped = likert_tasks(texts, rubric, template, int(settings["orders"]))
    else:
        if not settings.get("bank"):
            raise InputError(f"the {family} family needs --bank")
        bank, bank_warnings = read_bank(settings["bank"], on_error=settings.get("bank_errors", "raise"))
        importance = {i.item_id: i.importance for i in bank}
        template = PromptTemplate(settings.get("template") or FAMILIES[family].template)
        tasks = item_tasks(family, texts, bank, template)
    if not tasks:
        raise InputError("nothing to ask: no (text, question) pair applies", file=str(settings["texts"]))
    return tasks, skipped, rubric, template, importance, bank_warnings


def run_bank(args) -> int:
    from llmrubric.extract.testbank import generate_questions, nuggetize, write_bank

    settings = _settings(args)
    backend = make_backend_from(settings)
    if settings["backend"] == "transformers":
        from llmrubric.extract.backends.transformers_backend import generate

        gen = lambda prompt: generate(backend, prompt)
    else:
        gen = backend.generate
    queries = (
        pd.read_json(args.queries, lines=True)
        if str(args.queries).endswith(".jsonl")
        else read_table(args.queries, "texts")
    )
    for column in ("query_id", "query"):
        if column not in queries.columns:
            raise InputError(f"the queries table needs a {column!r} column", file=str(args.queries), column=column)
    passages = read_table(args.passages, "texts") if args.passages else None
    items = []
    if args.kind == "nugget" and passages is None:
        raise InputError("nuggetization needs --passages")
    for n, row in enumerate(queries.itertuples()):
        try:
            if args.kind == "question":
                items += generate_questions(gen, str(row.query_id), str(row.query), args.n)
            else:
                texts = passages[passages.query_id.astype(str) == str(row.query_id)].text.astype(str).tolist()
                items += nuggetize(gen, str(row.query_id), str(row.query), texts)
        except ValueError as e:
            raise InputError(f"query {row.query_id}: {e}; nothing written", file=str(args.queries), row=n + 1) from e
    write_bank(items, args.out)
    print(f"{len(items)} items → {args.out}")
    return 0


def run_summaries(args) -> int:
    from llmrubric.extract.summaries import summarise
    from llmrubric.extract.testbank import read_bank
    from llmrubric.io.tables import validate_features

    features = validate_features(read_table(args.features, "features"))
    importance = {i.item_id: i.importance for i in read_bank(args.bank)[0]} if args.bank else None
    summary = summarise(features, args.family, importance)
    if summary.empty:
        raise InputError(
            f"no {args.family} item blocks (question_id {args.family}:<item_id>) to summarise",
            file=str(args.features),
            column="question_id",
        )
    summary.attrs["source"] = str(args.out)
    write_table(validate_features(summary), args.out)
    print(
        f"{summary.text_id.nunique()} texts, {summary.groupby(['source', 'question_id']).ngroups} summary blocks → {args.out}"
    )
    return 0
