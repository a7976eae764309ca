"""A loopback HTTP proxy (127.0.0.1 only) in front of one server that records every request it forwards: when it
arrived, when its answer went back, and its JSON body, so a test counts what a server answered after a signal.
A request the server does not answer (dropped, refused) is dropped here too, as the client would see it;
:meth:`CountingProxy.kill` makes the server look dead (nothing listens, the requests in flight drop), and a new
proxy on the same ``port`` brings it back under the same URL."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from llmrubric.extract.cache import ResultCache


@dataclass
class Exchange:
    """One forwarded request: ``arrived`` and ``answered`` (``time.monotonic()``; None: no answer went back)."""

    path: str
    body: dict
    arrived: float
    answered: float | None = None
    status: int | None = None


@dataclass
class CountingProxy:
    """``with CountingProxy(upstream) as proxy``: ``proxy.url`` forwards to ``upstream`` (a base URL such as
    ``http://127.0.0.1:8000/v1``); ``proxy.exchanges`` lists what passed."""

    upstream: str
    port: int = 0
    timeout: float = 600.0
    exchanges: list[Exchange] = field(default_factory=list)

    def __post_init__(self):
        self.lock = threading.Lock()
        self.dead = False
        target = urllib.parse.urlsplit(self.upstream)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.forward(None)

            def do_POST(self):
                self.forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def forward(self, data: bytes | None):
                exchange = Exchange(self.path, json.loads(data) if data else {}, time.monotonic())
                with proxy.lock:
                    proxy.exchanges.append(exchange)
                try:
                    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=proxy.timeout)
                    headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
                    connection.request(self.command, self.path, body=data, headers=headers)
                    response = connection.getresponse()
                    payload = response.read()
                except OSError:
                    self.close_connection = True  # the server gave no answer: neither does the proxy
                    return
                if proxy.dead:  # killed while the request was in flight
                    self.close_connection = True
                    return
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                exchange.answered, exchange.status = time.monotonic(), response.status

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        prefix = target.path.rstrip("/")
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{prefix}"

    def __enter__(self) -> CountingProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.kill()

    def kill(self) -> None:
        """Stop listening (connections are refused) and drop the requests in flight."""
        with self.lock:
            first, self.dead = not self.dead, True
        if first:
            self.server.shutdown()
            self.server.server_close()

    def answered(self, since: float = 0.0) -> list[Exchange]:
        """The requests whose answer went back at or after ``since`` (a ``time.monotonic()``)."""
        with self.lock:
            return [e for e in self.exchanges if e.answered is not None and e.answered >= since]

    def arrived(self, since: float = 0.0) -> list[Exchange]:
        """The requests that reached the proxy at or after ``since``."""
        with self.lock:
            return [e for e in self.exchanges if e.arrived >= since]

    def wait_answered(self, n: int, limit: float = 120.0) -> None:
        """Until ``n`` requests were answered (a RuntimeError after ``limit`` seconds: the server is stuck)."""
        deadline = time.monotonic() + limit
        while len(self.answered()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(self.answered())} of {n} requests answered in {limit:g} s")
            time.sleep(0.01)


def stored_answers(cache_path) -> int:
    """The answers a run's cache holds (of finished blocks and of blocks cut short): what a test holds against the
    answers the proxy saw go back."""
    cache = ResultCache(cache_path)
    try:
        return sum(len(json.loads(d)["answers"]) for (d,) in cache.db.execute("SELECT detail FROM details"))
    finally:
        cache.close()
