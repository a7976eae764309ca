"""Servers that fail an extraction, on loopback servers whose answers are scripted (tests/support/judge_server.py)
behind a proxy that counts them (tests/support/counting_proxy.py): one that is down from the start, dies mid-run
or hangs ends within ``down_after`` as counted ``server_down`` blocks, and a rerun pays only for the answers it
lacks; Ctrl-C sends nothing more and keeps what was in flight; a rerun asks the blocks without a result with new
seeds. The same against llama.cpp's real server: tests/test_llama_failures.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest
from support.counting_proxy import CountingProxy, stored_answers
from support.judge_server import judge
from support.llama_server import free_port
from support.paths import ROOT
from threadpoolctl import threadpool_limits

from llmrubric.cli import main
from llmrubric.extract.backends.openai_backend import OpenAIBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.prompts import text_hash
from llmrubric.extract.runner import extract, stop_on_interrupt
from llmrubric.extract.tasks import Task

LABELS = ("1", "2", "3", "4")
BLOCKS = 18  # two demo texts, nine questions
THREE = {"role": "assistant", "content": "3"}


def cli_args(tmp_path, url: str, *extra: str) -> list[str]:
    """``extract features`` of two demo texts, sampled, against the server at ``url`` (quick retries)."""
    texts = pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv").head(2)
    texts.to_csv(tmp_path / "t.csv", index=False)
    argv = ["extract", "features", str(tmp_path / "t.csv"), "--config", str(ROOT / "conf" / "extract" / "openai.yaml")]
    argv += ["--out", str(tmp_path / "f.csv"), "--mode", "sampled", "--samples-per-request", "1", "--no-progress"]
    argv += ["--set", f"base_url={url}", "--set", "api_key_env=null", "--set", "backoff=0.05"]
    return [*argv, "--set", "pause=0.05", "--set", "max_pause=0.1", *extra]


def test_a_server_down_from_the_start_is_one_line_and_leaves_no_cache(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    assert main(cli_args(tmp_path, url, "--samples", "2")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: extract setting base_url: no endpoint is reachable")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


@pytest.mark.slow
def test_an_extraction_from_a_server_does_not_import_torch(tmp_path):
    """Torch is seconds of start-up that a run against a server never uses: it stops at a server that is down
    without it."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    code = (
        "import sys; from llmrubric.cli import main; "
        f"code = main({cli_args(tmp_path, url, '--samples', '2')!r}); print(code, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["2", "False"], done.stderr[-2000:]


@pytest.mark.slow
def test_a_server_that_dies_mid_run_ends_in_counted_blocks_and_a_rerun_pays_only_for_what_it_lacks(tmp_path, capsys):
    samples, kill_at = 3, 20  # answers per block; the server dies after answering this many requests
    replies = []

    def reply(prompt):
        replies.append(prompt)
        if len(replies) == kill_at:
            threading.Thread(target=proxy.kill, daemon=True).start()
        return THREE

    with judge(reply) as upstream:
        with CountingProxy(upstream) as proxy:
            argv = cli_args(
                tmp_path, proxy.url, "--samples", str(samples), "--set", "down_after=0.5", "--set", "concurrency=2"
            )
            assert main(argv) == 0  # what was obtained is written, with its summary
        answered = len(proxy.answered())
        summary = json.loads((tmp_path / "f.summary.json").read_text())
        failures = pd.read_csv(tmp_path / "f.failures.csv")
        down = failures[failures.status == "server_down"]
        assert summary["server_down"] == len(down) > 0 and summary["done"] + len(down) == BLOCKS
        assert down.reason.str.startswith("server down: no endpoint answered for 0.5 s (down_after)").all()
        assert stored_answers(tmp_path / "f.csv.cache.sqlite") == answered  # every answer obtained is kept
        replies.clear()
        with CountingProxy(upstream, port=proxy.port) as back:  # the server is back at the same URL
            capsys.readouterr()
            assert main(argv) == 0
        rerun = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rerun["done"] == BLOCKS and rerun["cached"] == summary["done"]
    assert len(back.arrived()) == rerun["this_run"]["requests"] == BLOCKS * samples - answered
    assert sum(rerun["this_run"]["answers"].values()) == BLOCKS * samples - answered  # the earlier ones not again


def test_a_server_that_hangs_times_out_once_then_the_rest_is_server_down_unsent():
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) and never replies
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        settings = {"concurrency": 1, "timeout": 0.3, "max_retries": 0, "down_after": 0.2}
        backend = OpenAIBackend("m", url, api_key_env=None, mode="sampled", **settings)
        tasks = [task(f"t{i}") for i in range(6)]
        ex = extract(tasks, backend, ResultCache(None), "s:sampled", progress=False)
    assert ex.failures.status.value_counts().to_dict() == {"server_down": 5, "timeout": 1}
    assert (ex.summary["timeout"], ex.summary["server_down"], ex.summary["this_run"]["requests"]) == (1, 5, 1)


def task(text_id="t1", qid="Q0"):
    prompt = f"Conversation: hi from {text_id}\nQuestion: good?\nAnswer:"
    return Task(text_id, qid, prompt, LABELS, LABELS, text_id, "h", text_hash(prompt, *LABELS))


@pytest.mark.slow
def test_a_rerun_asks_the_blocks_without_a_result_with_new_seeds(tmp_path, capsys):
    seeded = lambda request: THREE if request["seed"] % 2 else {"role": "assistant", "content": "no idea"}
    with judge(seeded, by_request=True) as upstream, CountingProxy(upstream) as proxy:
        argv = cli_args(tmp_path, proxy.url, "--samples", "1")
        assert main(argv) == 0
        first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        absent = first["unparseable"]
        assert 0 < absent < BLOCKS and first["done"] == BLOCKS - absent  # a deterministic server: its seeds decide
        assert main([*argv, "--dry-run"]) == 0
        plan = next(iter(json.loads(capsys.readouterr().out.strip().splitlines()[-1]).values()))
        assert plan["asked_again"] == {"unparseable": absent} and plan["blocks"] == plan["requests"] == absent
        seeds = {e.body["seed"] for e in proxy.arrived()}
        asked = len(proxy.arrived())
        assert main(argv) == 0
        rerun = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    again = proxy.arrived()[asked:]
    assert len(again) == absent and not seeds & {e.body["seed"] for e in again}  # new seeds, never the same
    this_run = rerun["this_run"]["answers"]  # the answers of the blocks asked again; "answers": of every block
    assert sum(this_run.values()) == absent and rerun["answers"]["parsed"] == first["done"] + this_run["parsed"]
    assert rerun["done"] == first["done"] + this_run["parsed"] and rerun["cached"] == first["done"]


@pytest.mark.slow
def test_ctrl_c_sends_nothing_more_and_keeps_the_answers_in_flight(tmp_path):
    """``extract features`` as a user runs it, in a process of its own: SIGINT after some answers; the server
    answers at most the requests in flight (``concurrency``) after it, all of them kept in the cache."""
    slow = threading.Event()
    slow.set()
    reply = lambda prompt: (slow.is_set() and time.sleep(0.1), THREE)[1]  # slow until the signal
    with judge(reply) as upstream, CountingProxy(upstream) as proxy:
        argv = cli_args(tmp_path, proxy.url, "--samples", "5", "--set", "concurrency=2")
        run = subprocess.Popen(
            [sys.executable, "-c", "import sys; from llmrubric.cli import main; sys.exit(main(sys.argv[1:]))", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        proxy.wait_answered(6)
        sent = time.monotonic()
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
        slow.clear()
        after, total = len(proxy.answered(sent)), len(proxy.answered())
        assert run.returncode == 130, err
        assert len(proxy.arrived(sent)) <= 2 and after <= 2  # at most the requests in flight at the signal
        assert err.strip().splitlines()[-1].startswith("interrupted (Ctrl-C): no request was sent after the signal")
        assert stored_answers(tmp_path / "f.csv.cache.sqlite") == total < BLOCKS * 5  # every answer kept
        assert not (tmp_path / "f.csv").exists() and not out.strip()
        assert main(argv) == 0  # the rerun pays for the rest only
    assert len(proxy.arrived()) == BLOCKS * 5


def test_a_request_thread_sends_nothing_after_ctrl_c_while_the_main_thread_has_not_yet_run_its_handler():
    """The main thread is inside one NumPy product (at least 16 GFLOP: Python runs a signal's handler only after it)
    when SIGINT comes; a request thread asking for an endpoint just after the signal gets none."""
    backend, asked = OpenAIBackend(model="m", base_url="http://127.0.0.1:1/v1", api_key_env=None), {}
    big = np.random.default_rng(0).random((2000, 2000))

    def request_thread():
        time.sleep(0.05)  # the main thread is in the product by now
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        asked["at"], asked["endpoint"] = time.monotonic(), backend.pool.acquire()

    with stop_on_interrupt(backend) as got:
        thread = threading.Thread(target=request_thread)
        thread.start()
        with threadpool_limits(1):  # one core's product lasts past the request (0.2-0.4 s here)
            big @ big  # noqa: B018  (the busy main thread)
        thread.join()
    assert got.at is not None and asked["at"] < got.at  # the handler ran after the request thread asked
    assert asked["endpoint"] is None and backend.pool.halted().startswith("interrupted")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--set", "price.prompt=0.15", "--dry-run"], "price.prompt is given without price.output: give both"),
        (
            ["--set", "price.prompt=0.15", "--set", "price.output=-1"],
            "price.output: -1.0 is not allowed (a number >= 0",
        ),
        (["--set", "down_after=0", "--dry-run"], "extract setting down_after: 0 is not allowed (seconds > 0)"),
        (["--samples", "0"], "extract setting samples: 0 is not allowed (a whole number >= 1)"),
        (["--tolerance", "1.5"], "tolerance: 1.5 is not allowed (a number with 0 < tolerance < 1, or null)"),
        (["--set", "down_after=0"], "extract setting down_after: 0 is not allowed (seconds > 0)"),
        (["--set", "concurrency=0"], "extract setting concurrency: 0 is not allowed (a whole number >= 1)"),
    ],
    ids=["price-alone", "price-negative", "down-after-dry-run", "samples", "tolerance", "down-after", "concurrency"],
)
def test_a_setting_out_of_range_is_one_line_naming_its_range(tmp_path, capsys, extra, message):
    """In a run and in a dry run (which checks the server's settings too, sending nothing)."""
    with judge(lambda prompt: THREE) as url:
        assert main(cli_args(tmp_path, url, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


@pytest.mark.slow
def test_the_sources_of_other_stops_have_other_names_and_one_table_of_both_says_why_it_fails(tmp_path, capsys):
    names = []
    for stop in (["--samples", "2"], ["--samples", "2", "--tolerance", "0.3"], ["--samples", "3"]):
        capsys.readouterr()
        assert main([*cli_args(tmp_path, "http://127.0.0.1:9/v1", *stop), "--dry-run"]) == 0
        names += json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert names == [f"gpt-4o-mini/llm_rubric:sampled-{s}" for s in ("k2", "k2-tol0.3", "k3")]
    with judge(lambda prompt: THREE) as url:
        assert main(cli_args(tmp_path, url, "--samples", "1", "--source", "judge")) == 0
    twice = pd.concat([pd.read_csv(tmp_path / "f.csv")] * 2)
    twice.to_csv(tmp_path / "twice.csv", index=False)
    argv = ["extract", "summaries", str(tmp_path / "twice.csv"), "--family", "self_rating", "--out", "x.csv"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "option listed twice in the block (text" in err and "source 'judge'" in err
    assert "the whole block is listed twice, as when two extraction runs share a source name" in err


def test_no_features_names_the_commonest_failure_and_counts_not_applicable_blocks_apart():
    from llmrubric.apps.extract import nothing_obtained
    from llmrubric.extract.runner import FAILURE_COLUMNS, Extraction

    rows = [("t1", "s", "Q1", "not_applicable", "has_references is false")]
    rows += [
        (f"t{i}", "s", "Q0", "failed", f"HTTP 400 from the server: prompt {i} exceeds the context") for i in (1, 2)
    ]
    rows += [("t3", "s", "Q0", "timeout", "timeout: no answer within 60 s")]
    result = Extraction(pd.DataFrame(), pd.DataFrame(rows, columns=FAILURE_COLUMNS))
    assert nothing_obtained(result) == (
        "3 blocks without a result (failed 2, timeout 1; failed: HTTP 400 from the server: prompt 1 exceeds the "
        "context); 1 blocks not applicable"
    )
