"""llama.cpp's real server (SmolLM2-135M-Instruct; tests/support/llama_server.py) failing an extraction as servers
do: killed mid-run, stopped (SIGSTOP: it hangs), and the extraction interrupted by Ctrl-C, each through
``llmrubric extract features`` with a counting proxy in front of the server (tests/support/counting_proxy.py), so
that the URL outlives the server and what it answered after a signal is counted. A server that is killed or stopped
is started for its test; the reruns and Ctrl-C share one for the module. The same logic on scripted servers, fast:
tests/test_extract_failures.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
import yaml
from support.counting_proxy import CountingProxy, stored_answers
from support.llama_server import LlamaServer, unavailable
from support.paths import ROOT

from llmrubric.cli import main
from llmrubric.config import load_file
from llmrubric.extract.runner import MODE_STATUSES

REASON = unavailable()
if REASON:
    pytest.skip(REASON, allow_module_level=True)

pytestmark = [pytest.mark.llm, pytest.mark.llama_server, pytest.mark.xdist_group("smollm2")]
TEXT = "d06"  # one short demo text (45 tokens: a prompt is mostly the rubric's instructions and question)
# four questions of the shipped rubric that need no references, asked in this order: sampled (seed 0), SmolLM2 answers
# Q7 and Q8 on this text in a form that parses (Q7 both answers, Q8 one), so the first two blocks end with a result
QUESTIONS = ["Q7", "Q8", "Q0", "Q1"]
BLOCKS = len(QUESTIONS)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A server for the tests that neither kill nor stop it (its slots keep their last prompts, of the same text: a
    later run reads their common prefix from there)."""
    with LlamaServer(tmp_path_factory.mktemp("llama") / "server.log") as s:
        yield s


@pytest.fixture
def server(shared):
    """The module's server, alive before the test and after it (else the test fails naming its exit status and log,
    not the clients' "Connection refused")."""
    assert not shared.death(), shared.death()
    yield shared
    assert not shared.death(), shared.death()


def cli_args(tmp_path, url: str, *extra: str) -> list[str]:
    """``extract features`` of :data:`TEXT` on :data:`QUESTIONS` with the shipped llama.cpp config, against ``url``."""
    texts = pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv")
    texts[texts.text_id == TEXT].to_csv(tmp_path / "t.csv", index=False)
    questions = {
        q["id"]: q for q in yaml.safe_load((ROOT / "conf" / "rubric" / "llm_rubric.yaml").read_text())["questions"]
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"name": "four", "questions": [questions[q] for q in QUESTIONS]}))
    argv = [
        "extract",
        "features",
        str(tmp_path / "t.csv"),
        "--config",
        str(ROOT / "conf" / "extract" / "llama_cpp.yaml"),
    ]
    argv += ["--rubric", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "f.csv")]
    argv += ["--no-progress", "--set", f"base_url={url}"]
    return [*argv, "--set", "backoff=0.1", "--set", "pause=0.1", "--set", "max_pause=0.5", *extra]


class AfterAnswers(threading.Thread):
    """``with AfterAnswers(proxy, n, act)``: calls ``act()`` once the server answered ``n`` requests (unless the
    block ends first); ``acted`` says whether it did."""

    def __init__(self, proxy: CountingProxy, n: int, act):
        super().__init__(daemon=True)
        self.proxy, self.n, self.act, self.done, self.acted = proxy, n, act, threading.Event(), False

    def run(self):
        while len(self.proxy.answered()) < self.n:
            if self.done.wait(0.01):
                return
        self.act()
        self.acted = True

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()


@pytest.mark.parametrize("mode", ["logprob", "sampled"])
def test_a_server_killed_mid_run_ends_in_server_down_blocks_and_a_rerun_resumes(tmp_path, capsys, mode, server):
    """Killed once the first two blocks are answered (the shipped 2 requests in flight: logprob 2 answers, sampled
    each block's 2 answers in turn, 4), while the other two are being asked; the rerun, on the module's server
    behind the same URL, asks only what the first run lacks."""
    extra = ["--set", "down_after=1"] + (["--mode", "sampled", "--samples", "2"] if mode == "sampled" else [])
    with LlamaServer(tmp_path / "server.log") as dying, CountingProxy(dying.url) as proxy:
        argv = cli_args(tmp_path, proxy.url, *extra)
        with AfterAnswers(proxy, 4 if mode == "sampled" else 2, dying.process.kill) as killer:
            code = main(argv)
    assert killer.acted
    answered = len(proxy.answered())
    assert code == 0, capsys.readouterr().err  # what was obtained is written with its summary
    summary = json.loads((tmp_path / "f.summary.json").read_text())
    absent = summary["failed"] + sum(summary[status] for status in MODE_STATUSES)  # server_down, unparseable, ...
    assert summary["server_down"] > 0 and summary["done"] + absent == BLOCKS
    if mode == "sampled":
        assert stored_answers(tmp_path / "f.csv.cache.sqlite") == answered  # every answer obtained is kept
    with CountingProxy(server.url, port=proxy.port) as back:
        capsys.readouterr()
        assert main(argv) == 0
    rerun = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rerun["cached"] == summary["done"] and rerun["this_run"]["requests"] == len(back.arrived())
    if mode == "sampled":  # a rerun pays for the answers it lacks, and anew for blocks whose answers gave no result
        # blocks whose every answer came back and gave no result; server_down, failed (no result kept) and timeout
        # blocks lack answers, which BLOCKS * 2 - answered already counts
        asked_again = absent - summary["server_down"] - summary["failed"] - summary["timeout"]
        assert len(back.arrived()) == BLOCKS * 2 - answered + 2 * asked_again


def test_a_server_that_hangs_ends_within_its_timeout_as_counted_blocks(tmp_path, capsys):
    """The request in flight when the server stops gets its ``timeout``; then no endpoint has answered for
    ``down_after`` seconds and every block not yet answered is ``server_down``, the rest never sent."""
    with LlamaServer(tmp_path / "server.log") as server, CountingProxy(server.url) as proxy:
        try:
            with AfterAnswers(proxy, 1, lambda: server.process.send_signal(signal.SIGSTOP)) as stopper:
                code = main(cli_args(tmp_path, proxy.url, "--set", "timeout=15", "--set", "down_after=1"))
        finally:  # resumed, it would first finish the prompt it was given (a stop waits for that): killed instead
            server.process.kill()
            server.process.wait()
    assert stopper.acted
    assert code == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "f.summary.json").read_text())
    failures = pd.read_csv(tmp_path / "f.failures.csv")
    assert summary["done"] >= 1 and summary["server_down"] == BLOCKS - summary["done"] == len(failures)
    assert failures.reason.str.contains("timeout: no answer within 15 s").any()
    assert len(proxy.arrived()) <= summary["done"] + 2  # the one in flight and its retry: the rest never sent


def test_ctrl_c_stops_spending_at_once_and_keeps_the_answers_in_flight(tmp_path, server):
    with CountingProxy(server.url) as proxy:
        argv = cli_args(tmp_path, proxy.url, "--mode", "sampled", "--samples", "5")
        run = subprocess.Popen(
            [sys.executable, "-c", "import sys; from llmrubric.cli import main; sys.exit(main(sys.argv[1:]))", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        proxy.wait_answered(3, limit=300)
        sent = time.monotonic()
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=300)
        after, total = len(proxy.answered(sent)), len(proxy.answered())
    assert run.returncode == 130, err
    in_flight = load_file(ROOT / "conf" / "extract" / "llama_cpp.yaml")["concurrency"]
    # a request on its way at the signal may reach the proxy just after it: at most the requests in flight
    assert len(proxy.arrived(sent)) <= in_flight and after <= in_flight
    assert err.strip().splitlines()[-1].startswith("interrupted (Ctrl-C): no request was sent after the signal")
    assert stored_answers(tmp_path / "f.csv.cache.sqlite") == total < BLOCKS * 5
    assert not (tmp_path / "f.csv").exists() and not out.strip()
