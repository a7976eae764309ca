"""A local OpenAI-compatible chat server (127.0.0.1 only) whose every answer is a scripted message: a judge
for the modes without logprobs (``sampled``, ``verbalized``, ``reasoned``) that refuses, answers or reasons as
told, with fixed token counts."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REFUSAL = {"role": "assistant", "content": None, "refusal": "I can't help with that request."}


class _Judge(BaseHTTPRequestHandler):
    """A chat server whose every choice is ``reply(prompt)``'s message (OpenAI's shape; a refusal as OpenAI
    documents it: ``content`` null, the ``refusal`` text), 12 prompt and 7 output tokens per request."""

    reply = staticmethod(lambda prompt: REFUSAL)
    by_request = False  # reply(request): the whole request (its seed, n, ...), not its prompt alone

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        message = self.reply(request) if self.by_request else self.reply(request["messages"][-1]["content"])
        body = {
            "choices": [{"index": i, "message": message, "finish_reason": "stop"} for i in range(request.get("n", 1))],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7},
        }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextmanager
def judge(reply=None, by_request: bool = False):
    """A :class:`_Judge` server answering ``reply(prompt)`` (``reply(request)`` with ``by_request``; default: a
    refusal); yields its base URL."""
    handler = type("Judge", (_Judge,), {"reply": staticmethod(reply), "by_request": by_request}) if reply else _Judge
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
