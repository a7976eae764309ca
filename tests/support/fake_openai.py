"""A local OpenAI-compatible server (127.0.0.1 only) answering with a tiny model's real
next-token logprobs; it can answer 429 or stall for the first requests, take ``latency``
seconds per request, and die (stop listening, drop the requests in flight) after answering
``die_after`` requests or on :meth:`FakeOpenAI.kill`."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


class FakeOpenAI:
    def __init__(
        self,
        model,
        tokenizer,
        fail_first: int = 0,
        stall_first: int = 0,
        stall_s: float = 2.0,
        retry_after: str | None = "0",
        latency: float = 0.0,
        die_after: int | None = None,
        port: int = 0,
        memo: dict | None = None,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.fail_first, self.stall_first, self.stall_s, self.retry_after = (
            fail_first,
            stall_first,
            stall_s,
            retry_after,
        )
        self.latency, self.die_after, self.dead = latency, die_after, False
        self.memo = memo  # a dict (shared by servers): each prompt's logprobs computed once, then only the latency
        self.requests = 0
        self.answered: list[str] = []  # the prompt of every answer sent
        self.lock, self.model_lock, self.closed = threading.Lock(), threading.Lock(), threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if server.dead:
                    self.close_connection = True
                    return
                with server.lock:
                    server.requests += 1
                    n = server.requests
                if n <= server.fail_first:
                    self.send_response(429)
                    if server.retry_after is not None:
                        self.send_header("Retry-After", server.retry_after)
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "rate limited"}}')
                    return
                if n <= server.fail_first + server.stall_first:
                    time.sleep(server.stall_s)
                time.sleep(server.latency)
                try:
                    payload = server.answer(self.path, body)
                except Exception as e:  # a bad request: answer 400 like a real server
                    self.send_response(400)
                    self.end_headers()
                    self.wfile.write(json.dumps({"error": {"message": str(e)}}).encode())
                    return
                data = json.dumps(payload).encode()
                with server.lock:
                    spent = server.die_after is not None and len(server.answered) >= server.die_after
                    if server.dead or spent:  # killed (or about to be) while in flight: the connection drops
                        self.close_connection = True
                        return
                    server.answered.append(body.get("prompt") or body["messages"][-1]["content"])
                    die = len(server.answered) == server.die_after
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                if die:
                    threading.Thread(target=server.kill, daemon=True).start()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.kill()

    def kill(self) -> None:
        """Stop listening (new connections are refused) and drop the requests in flight."""
        with self.lock:
            first, self.dead = not self.dead, True
        if first:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.closed.set()
        self.closed.wait()

    def top(self, prompt: str, k: int) -> tuple[list[tuple[str, float]], int]:
        if self.memo is not None:
            if (prompt, k) not in self.memo:
                self.memo[(prompt, k)] = self._top(prompt, k)
            return self.memo[(prompt, k)]
        return self._top(prompt, k)

    def _top(self, prompt: str, k: int) -> tuple[list[tuple[str, float]], int]:
        ids = self.tokenizer(prompt)["input_ids"]
        with self.model_lock, torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        lp = torch.log_softmax(logits, -1)
        values, index = lp.topk(k)
        return [(self.tokenizer.decode([int(i)]), float(v)) for v, i in zip(values, index)], len(ids)

    def answer(self, path: str, body: dict) -> dict:
        if path.endswith("/chat/completions"):
            prompt = body["messages"][-1]["content"]
            top, n = self.top(prompt, int(body.get("top_logprobs", 0)) or 1)
            content = [
                {"token": top[0][0], "logprob": top[0][1], "top_logprobs": [{"token": t, "logprob": v} for t, v in top]}
            ]
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": top[0][0]},
                "logprobs": {"content": content},
            }
        elif path.endswith("/completions"):
            top, n = self.top(body["prompt"], int(body.get("logprobs") or 1))
            tops = {}
            for t, v in top:
                tops.setdefault(t, v)
            choice = {
                "index": 0,
                "text": top[0][0],
                "logprobs": {"tokens": [top[0][0]], "token_logprobs": [top[0][1]], "top_logprobs": [tops]},
            }
        else:
            raise ValueError(f"unknown path {path}")
        return {"choices": [choice], "usage": {"prompt_tokens": n, "completion_tokens": 1}}
