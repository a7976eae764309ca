"""llama.cpp's own OpenAI-compatible server as ``llmrubric models serve`` starts it (the xllamacpp wheel, the optional
group ``server``), a child process on 127.0.0.1 and a free port, for tests and benchmarks. Settings:
``conf/extract/server/llama_cpp.yaml``."""

from __future__ import annotations

import importlib.util
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd

from llmrubric.extract.serve import missing_cpu_features, model_file, settings

from .paths import ROOT
from .xdist import several_workers

MODELS = ROOT / "models"
MODEL = "smollm2"  # served by default: fetched into models/ by `make setup`
FLAGS = ("context", "parallel", "threads", "alias", "chat_template", "reasoning_format")  # settings with a flag


def unavailable() -> str:
    """Why the server cannot run here ('' if it can)."""
    if importlib.util.find_spec("xllamacpp") is None:
        return "xllamacpp (optional group [server]) is not installed: pip install -e '.[server]' (or make setup)"
    if missing_cpu_features():
        return f"this CPU lacks {missing_cpu_features()}, which the xllamacpp wheel needs"
    try:
        model_file(MODEL, MODELS)
    except ValueError as e:
        return str(e)
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """``llmrubric models serve`` of a GGUF model in a child process (``.process``, which signals may stop, pause or
    kill); waits until ``/v1/models`` answers, stops it on exit.

    ``log``: file for the server's output (its last lines are in the error if it dies while starting);
    ``model``: a fetched model's name or a GGUF file (default smollm2); ``overrides``: settings over the shipped ones
    (under ``pytest -n N``, one thread unless given).
    """

    def __init__(self, log: Path, model: str | Path | None = None, **overrides):
        if several_workers():  # one core a worker: two threads that spin
            overrides.setdefault("threads", 1)  # on a core the other worker uses made prompts 1.4x slower
        self.port = free_port()
        self.settings = settings(**overrides, port=self.port)
        self.model, name = model_file(model or MODEL, MODELS)
        self.settings["alias"] = self.settings["alias"] or name
        self.log = Path(log)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        s = self.settings
        given = [(f"--{k.replace('_', '-')}", str(s[k])) for k in FLAGS if s[k] is not None]
        serve = [sys.executable, "-m", "llmrubric.cli", "models", "serve", str(self.model), "--port", str(self.port)]
        return serve + [part for flag in given for part in flag]

    def __enter__(self) -> LlamaServer:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + float(self.settings["startup_timeout"])
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.death())
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2) as r:
                    if json.loads(r.read()).get("data"):
                        return self
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(
            f"llama.cpp server did not answer within {self.settings['startup_timeout']} s (log {self.log})"
        )

    def death(self, lines: int = 8) -> str:
        """Why the server is gone, '' while it runs: its exit status (a signal by name) and the last lines of its log."""
        code = self.process.poll() if self.process else None
        if code is None:
            return ""
        status = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        tail = self.log.read_text(errors="replace").strip().splitlines()[-lines:]
        return f"llama.cpp server died ({status}); last lines of {self.log}: " + " | ".join(tail)

    def cpu_features(self) -> dict[str, int]:
        """The ``CPU :`` features that the server's build uses, as its launcher logs them (``AVX2 = 1 | ...``)."""
        for line in self.log.read_text(errors="replace").splitlines():
            if "CPU :" in line:
                pairs = (p.split("=") for p in line.split("CPU :", 1)[1].split("|") if p.count("=") == 1)
                return {k.strip(): int(v) for k, v in pairs if v.strip().isdigit()}
        return {}

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.send_signal(signal.SIGCONT)  # a paused server stops too
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def post(self, path: str, body: dict) -> dict:
        """One raw request (``path`` under ``/v1``, or from the root with a leading ``/``: ``/tokenize``): the JSON
        answer, or ``{"http_status": N, "error": …}``."""
        url = self.url.removesuffix("/v1") + path if path.startswith("/") else f"{self.url}/{path}"
        request = urllib.request.Request(
            url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            return {"http_status": e.code, "error": json.loads(e.read() or b"null")}
        except OSError as e:
            raise RuntimeError(self.death() or f"{url}: {e}") from e


def expected_answers(features: pd.DataFrame) -> pd.Series:
    """Per (text_id, question_id): the expected answer under the labels' normalised probabilities."""
    f = features.assign(value=pd.to_numeric(features.option), p=features.prob.astype(float))
    g = f.assign(vp=f.value * f.p).groupby(["text_id", "question_id"])
    return g.vp.sum() / g.p.sum()


def compare(server: pd.DataFrame, local: pd.DataFrame) -> dict:
    """Two features tables of the same prompts (blocks missing from either are counted, not compared):
    the largest probability difference and where, the mean one, and per question the Pearson
    correlation of expected answers (None where either side is constant) and the largest
    difference of expected answers."""
    keys = ["text_id", "question_id", "option"]
    both = server.merge(local, on=keys, suffixes=("_server", "_local"))
    diff = (both.prob_server - both.prob_local).abs()
    worst = both.loc[diff.idxmax()]
    e = pd.concat({"server": expected_answers(server), "local": expected_answers(local)}, axis=1).dropna()
    questions = {}
    for q, g in e.groupby(level="question_id"):
        constant = g.server.std() == 0 or g.local.std() == 0 or len(g) < 2
        questions[q] = {
            "blocks": len(g),
            "pearson": None if constant else round(float(np.corrcoef(g.server, g.local)[0, 1]), 4),
            "max_expected_diff": round(float((g.server - g.local).abs().max()), 4),
        }
    mass = lambda f: f.groupby(["text_id", "question_id"]).prob.sum()
    return {
        "blocks_compared": len(e),
        "blocks_only_one_side": int(len(set(mass(server).index) ^ set(mass(local).index))),
        "max_abs_prob_diff": round(float(diff.max()), 4),
        "max_at": {k: str(worst[k]) for k in keys},
        "mean_abs_prob_diff": round(float(diff.mean()), 5),
        "min_pearson": min((v["pearson"] for v in questions.values() if v["pearson"] is not None), default=None),
        "label_mass_median": {
            "server": round(float(mass(server).median()), 4),
            "local": round(float(mass(local).median()), 4),
        },
        "questions": questions,
    }
