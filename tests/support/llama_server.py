"""llama.cpp's OpenAI-compatible server (``python -m llama_cpp.server`` from llama-cpp-python, the
optional group ``server``) on 127.0.0.1 and a free port, for tests and benchmarks. Settings:
``conf/extract/server/llama_cpp.yaml``."""

from __future__ import annotations

import importlib.util
import json
import os
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

from llmrubric.config import load_file

from .paths import ROOT

SETTINGS = ROOT / "conf" / "extract" / "server" / "llama_cpp.yaml"
BUILD_LOG = "llama-cpp-python-build.log"  # written by `make setup` into the venv when the build fails


def unavailable() -> str:
    """Why the server cannot run here ('' if it can)."""
    if importlib.util.find_spec("llama_cpp") is None:
        log = Path(sys.prefix) / BUILD_LOG
        why = f"its build failed, see {log}" if log.is_file() else "not installed"
        return f"llama-cpp-python (optional group [server]): {why}; pip install -e '.[server]' (or make setup)"
    model = ROOT / load_file(SETTINGS)["model"]
    if not model.is_file():
        return f"{model} is missing: run `make setup` (llmrubric models fetch smollm2 models)"
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """Start the server with a GGUF model, wait until ``/v1/models`` answers, stop it on exit.

    ``log``: file for the server's output (its last lines are in the error if it dies while starting).
    """

    def __init__(self, log: Path, model: str | Path | None = None, **overrides):
        self.settings = {**load_file(SETTINGS), **overrides}
        self.model = Path(model or ROOT / self.settings["model"])
        self.log, self.port = Path(log), free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        s = self.settings
        threads = s["n_threads"] or int(os.environ.get("OMP_NUM_THREADS", 0)) or len(os.sched_getaffinity(0))
        return [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model),
            "--model_alias",
            s["alias"],
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(s["n_ctx"]),
            "--n_batch",
            str(s["n_batch"]),
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
        ]

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
        """The ``CPU :`` features that the server's build uses, as its start-up log lists them (``AVX2 = 1 | ...``)."""
        for line in self.log.read_text(errors="replace").splitlines():
            if "CPU :" in line:
                pairs = (p.split("=") for p in line.split("CPU :", 1)[1].split("|") if p.count("=") == 1)
                return {k.strip(): int(v) for k, v in pairs if v.strip().isdigit()}
        return {}

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def post(self, path: str, body: dict) -> dict:
        """One raw request (``path`` under ``/v1``): the JSON answer, or ``{"http_status": N, "error": …}``."""
        request = urllib.request.Request(
            f"{self.url}/{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            return {"http_status": e.code, "error": json.loads(e.read() or b"null")}
        except OSError as e:
            raise RuntimeError(self.death() or f"{self.url}/{path}: {e}") from e


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
