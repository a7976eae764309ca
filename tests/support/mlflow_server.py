"""A real MLflow tracking server on 127.0.0.1 for the tests that need one: a SQLite backend store and a local
artifact root in a temporary folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .postgres_server import free_port

SERVER_FLAGS = ("--host", "--port", "--workers", "--backend-store-uri", "--artifacts-destination")  # as started here


def start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` on a free port with its store in ``tmp``, once it answers ``/health``: (process, URL)."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{tmp / 'server.db'}",
        "--artifacts-destination",
        str(tmp / "artifacts"),
    ]
    # no job runner (its process and a huey consumer: scheduled scorers, which no test here asks for)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return server, url
        except OSError:
            time.sleep(0.5)
    stop_server(server)
    pytest.fail(f"mlflow server did not come up on {url}")


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)  # the server and its workers
    server.wait()
