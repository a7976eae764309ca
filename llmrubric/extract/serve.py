"""``llmrubric models serve NAME|PATH``: llama.cpp's own OpenAI-compatible server (the prebuilt ``xllamacpp`` wheel,
the optional group ``server``) for a local GGUF, in the foreground until SIGINT or SIGTERM.

Each of its ``parallel`` slots holds ``context`` tokens (the server's context is their product), and the slots
answer their requests together (continuous batching). Settings: ``conf/extract/server/llama_cpp.yaml``; the
client's: ``conf/extract/llama_cpp.yaml``.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from llmrubric.config import conf_path, load_file
from llmrubric.extract.models import MODELS_DIR, spec
from llmrubric.io.errors import InputError

SETTINGS = conf_path("extract", "server", "llama_cpp.yaml")
# the kernels of the wheel's CPU build (GGML_NATIVE=OFF: AVX2, FMA, F16C; no AVX-512 or AMX)
CPU_NEEDS = ("avx", "avx2", "fma", "f16c")
REASONING_FORMATS = ("none", "auto", "deepseek")


def settings(**given) -> dict:
    """The shipped settings with those ``given`` (None: not given) over them, checked."""
    shipped = load_file(SETTINGS)
    unknown = sorted(set(given) - set(shipped))
    if unknown:
        raise InputError(f"unknown settings {unknown} (known: {sorted(shipped)})", file=str(SETTINGS))
    s = {**shipped, **{k: v for k, v in given.items() if v is not None}}
    for key, low in (("port", 1), ("context", 1), ("parallel", 1), ("threads", 1)):
        value = s[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise InputError(f"{value!r} is not an integer >= {low}", setting=key)
    if s["port"] > 65535:
        raise InputError(f"{s['port']} is not a port (1 to 65535)", setting="port")
    if s["reasoning_format"] not in REASONING_FORMATS:
        raise InputError(f"{s['reasoning_format']!r} is not one of {REASONING_FORMATS}", setting="reasoning_format")
    return s


def model_file(model: str | Path, models_dir: str | Path) -> tuple[Path, str]:
    """(the GGUF file, the name requests use) of a fetched model's NAME (``conf/models/NAME.yaml``, in
    ``models_dir``) or of a GGUF file's PATH (named by its stem)."""
    model = str(model)
    if not model.endswith(".gguf") and (MODELS_DIR / f"{model}.yaml").is_file():
        path = Path(models_dir) / Path(spec(model)["member"]).name
        if not path.is_file():
            raise InputError(
                f"model {model} is not fetched into {models_dir}: run `llmrubric models fetch {model} {models_dir}`",
                file=str(path),
            )
        return path, model
    path = Path(model)
    if path.suffix != ".gguf":
        known = sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))
        raise InputError(f"{model!r} is neither a fetched model's name {known} nor a .gguf file")
    if not path.is_file():
        raise InputError("model not found", file=str(path))
    return path, path.stem


def missing_cpu_features() -> list[str]:
    """The kernels of :data:`CPU_NEEDS` this x86-64 CPU lacks (``/proc/cpuinfo``; none where it cannot be read)."""
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
    except (OSError, StopIteration):
        return []
    flags = set(line.split(":", 1)[1].split())
    return [f for f in CPU_NEEDS if f not in flags] if "sse2" in flags else []


def check_port(host: str, port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise InputError(f"port {port} on {host} is taken ({e.strerror}): give another with --port") from e


def default_threads() -> int:
    return int(os.environ.get("OMP_NUM_THREADS", 0)) or len(os.sched_getaffinity(0))


def server_params(path: Path, alias: str, s: dict):
    """xllamacpp's ``CommonParams`` of the settings ``s``."""
    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = str(path)
    p.model_alias = {alias}
    p.hostnames = [s["host"]]
    p.port = s["port"]
    p.n_parallel = s["parallel"]
    p.n_ctx = s["context"] * s["parallel"]  # slots split the context (kv_unified off): each gets ``context``
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = s["threads"] or default_threads()
    p.reasoning_format = getattr(
        xllamacpp.common_reasoning_format, f"COMMON_REASONING_FORMAT_{s['reasoning_format']}".upper()
    )
    if s["chat_template"]:
        p.chat_template = Path(s["chat_template"]).read_text()
    return p


def serve(
    model: str | Path, models_dir: str | Path = "models", announce: Callable[[str], None] = print, **given
) -> int:
    """Serve ``model`` (a NAME or PATH, :func:`model_file`) until SIGINT or SIGTERM, then stop it; 0.
    ``given``: settings over the shipped ones (:func:`settings`); ``announce`` gets the line with the URL."""
    s = settings(**given)
    path, name = model_file(model, models_dir)
    alias = s["alias"] or name
    if s["chat_template"] and not Path(s["chat_template"]).is_file():
        raise InputError("chat template not found", file=str(s["chat_template"]), setting="chat_template")
    lacking = missing_cpu_features()
    if lacking:
        raise InputError(f"this CPU lacks {', '.join(lacking)}, which the xllamacpp wheel's llama.cpp build needs")
    try:
        import xllamacpp
    except ImportError as e:
        raise InputError(
            f"llama.cpp's server is not installed ({e}): pip install -e '.[server]' (or make setup)"
        ) from e
    check_port(s["host"], s["port"])
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # the server's threads inherit the mask: the main thread waits
    try:
        print(f"llama.cpp (xllamacpp {xllamacpp.__version__}): {xllamacpp.get_system_info().strip()}", file=sys.stderr)
        try:
            server = xllamacpp.Server(server_params(path, alias, s))
        except RuntimeError as e:
            raise InputError(f"llama.cpp's server did not start ({e}): its log above says why", file=str(path)) from e
        announce(
            f"serving {path} as {alias} on http://{s['host']}:{s['port']}/v1 (slots: {s['parallel']} x "
            f"{s['context']} tokens; threads: {s['threads'] or default_threads()}); Ctrl-C stops it"
        )
        sys.stdout.flush()
        stopped = signal.sigwait(stops)
        del server  # stops the HTTP server and the slots
        print(f"llama.cpp server stopped ({signal.Signals(stopped).name})", file=sys.stderr)
        return 0
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
