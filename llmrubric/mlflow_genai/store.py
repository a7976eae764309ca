"""The MLflow tracking store the commands talk to: checked before any work, failures as one line.

:func:`tracking_client` points MLflow at ``--tracking-uri`` (else ``MLFLOW_TRACKING_URI``) and, for a
tracking server (``http(s)://``), asks its ``/health`` once, with MLflow's own request timeout
(``MLFLOW_HTTP_REQUEST_TIMEOUT``): a server that is down or does not answer is one error before
anything is read or written; a local store (``sqlite:`` file, ``file:`` or plain folder) that does not exist is one
error too where the command only reads or adds to one (MLflow would create an empty store and then find nothing),
and is created only by a command that writes a new experiment (``create``). :func:`store_errors` turns what MLflow
raises later (a server that dies mid-run, after MLflow's retries: ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, default 7,
about 4 minutes) into one error line. :func:`size_http_pool` gives MLflow's HTTP connection pool as many connections
as MLflow's own thread pools use at once (trace search downloads with up to
``MLFLOW_SEARCH_TRACES_MAX_THREADS`` threads, 32 or more, against a pool of 10: urllib3 then discards a
connection per request and warns "Connection pool is full" for each).
"""

from __future__ import annotations

import contextlib
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from llmrubric.io.errors import InputError

HEALTH = "/health"
SPECIAL_URIS = ("databricks", "databricks-uc", "uc")  # MLflow's hosted stores, named without a scheme


def size_http_pool() -> None:
    """``MLFLOW_HTTP_POOL_MAXSIZE`` (unless set) = the most threads MLflow runs against the store at once: trace
    search's downloads, or evaluate's scorers with the asynchronous trace logging."""
    from mlflow import environment_variables as env

    if env.MLFLOW_HTTP_POOL_MAXSIZE.is_set():
        return
    threads = max(
        env.MLFLOW_SEARCH_TRACES_MAX_THREADS.get(),
        env.MLFLOW_GENAI_EVAL_MAX_WORKERS.get() + env.MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS.get(),
    )
    os.environ[env.MLFLOW_HTTP_POOL_MAXSIZE.name] = str(max(threads, env.MLFLOW_HTTP_POOL_MAXSIZE.get()))


def tracking_client(uri: str | None = None, setting: str = "--tracking-uri", create: bool = False):
    """An ``MlflowClient`` of ``uri`` (default: the current tracking URI), its server checked and, unless
    ``create``, its local store required to exist (module doc)."""
    import mlflow

    if uri:
        mlflow.set_tracking_uri(uri)
    current = mlflow.get_tracking_uri()
    check_server(current, setting)
    if not create:
        check_local_store(current, setting)
    return mlflow.MlflowClient()


def local_store(uri: str) -> Path | None:
    """The file or folder of a local tracking store (``sqlite:///FILE``, ``file:FOLDER``, a plain path); None for a
    server, an in-memory database or another database."""
    if uri in SPECIAL_URIS:
        return None
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "sqlite":
        path = uri.split("?", 1)[0].removeprefix("sqlite:///")
        return None if path in ("", ":memory:") or path.startswith("sqlite:") else Path(path)
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path))
    return Path(uri) if not parsed.scheme or len(parsed.scheme) == 1 else None  # a Windows drive letter is a path


def check_local_store(uri: str, setting: str = "--tracking-uri") -> None:
    """An error naming ``uri`` where it is a local store that does not exist (nothing is created)."""
    path = local_store(uri)
    if path is not None and not path.exists():
        raise InputError(
            f"MLflow store {uri} does not exist ({path}): point --tracking-uri or MLFLOW_TRACKING_URI at the store "
            "that holds the experiment",
            setting=setting,
        )


def check_server(uri: str, setting: str = "--tracking-uri") -> None:
    """An error naming ``uri`` where it is a tracking server that does not answer ``/health`` within
    ``MLFLOW_HTTP_REQUEST_TIMEOUT`` seconds; a local store (``sqlite:``, a folder) is not checked."""
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_TIMEOUT

    if not uri.startswith(("http://", "https://")):
        return
    timeout = MLFLOW_HTTP_REQUEST_TIMEOUT.get()
    try:
        with urllib.request.urlopen(uri.rstrip("/") + HEALTH, timeout=timeout) as response:
            if response.status == 200:
                return
            problem = f"/health answered HTTP {response.status}"
    except urllib.error.HTTPError as e:
        problem = f"/health answered HTTP {e.code}"
    except (OSError, ValueError) as e:  # refused, unreachable, timed out (MLFLOW_HTTP_REQUEST_TIMEOUT), bad URL
        problem = " ".join(str(getattr(e, "reason", None) or e).split()) or type(e).__name__
    raise InputError(
        f"MLflow tracking server {uri} is not answering ({problem}; waited at most {timeout} s, "
        "MLFLOW_HTTP_REQUEST_TIMEOUT): start it (docs/mlflow.md) or point MLFLOW_TRACKING_URI at one",
        setting=setting,
    )


@contextlib.contextmanager
def store_errors(uri_setting: str = "--tracking-uri"):
    """What MLflow raises while talking to the store (a server that died mid-run, after its retries) as one
    :class:`InputError` naming the store."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from requests.exceptions import RequestException

    try:
        yield
    except (MlflowException, RequestException) as e:
        first = " ".join(str(e).split())[:300]
        raise InputError(f"MLflow tracking store {mlflow.get_tracking_uri()}: {first}", setting=uri_setting) from e
