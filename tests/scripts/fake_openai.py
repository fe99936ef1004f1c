"""A fake OpenAI-compatible provider on 127.0.0.1: the scripted models over real HTTP.

Each request is answered by the scripted script (evolver.scripted, EVOLVER_SCRIPT) for the
model name it names, so `--agent-model openai/agent --api-base URL` plays the same roles as
`scripted/agent`, through litellm's real OpenAI route. Per model, a fault can be set instead:
an HTTP status (400, 401, 500, ...), a number of 429s before it answers, a context limit past
which it answers 400 as OpenAI does for an overflowing context, or a dropped connection. Every
request body is kept (`bodies`), so a test can see what reached the provider. It listens only on
loopback and stops by itself: at close(), or after `lifetime` seconds.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Optional

CONTEXT_MESSAGE = "This model's maximum context length is {limit} tokens. However, your messages resulted in {used} tokens."


@dataclass
class Fault:
    status: Optional[int] = None  # answer every request with this HTTP status
    rate_limited: int = 0  # answer this many requests with 429 first, then normally
    context_chars: Optional[int] = None  # a prompt longer than this is refused as an overflowing context
    drop: bool = False  # close the connection without answering


class FakeOpenAI:
    def __init__(self, faults: Optional[dict[str, Fault]] = None, lifetime: float = 900.0):
        self.faults = dict(faults or {})
        self.requests: Counter = Counter()  # model -> requests received
        self.bodies: list[dict] = []  # every request body, as received
        self.lock = threading.Lock()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-openai").start()
        self.timer = threading.Timer(lifetime, self.close)
        self.timer.daemon = True
        self.timer.start()

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "FakeOpenAI":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def bodies_of(self, model: str) -> list[dict]:
        with self.lock:
            return [b for b in self.bodies if b.get("model") == model]

    def answer(self, body: dict) -> tuple[int, dict]:
        model = body.get("model", "")
        with self.lock:
            self.bodies.append(body)
            self.requests[model] += 1
            seen = self.requests[model]
        fault = self.faults.get(model, Fault())
        if fault.status:
            return fault.status, _error(f"fake provider: status {fault.status}", fault.status)
        if seen <= fault.rate_limited:
            return 429, _error("Rate limit reached for requests", 429)
        chars = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
        if fault.context_chars is not None and chars > fault.context_chars:
            return 400, _error(CONTEXT_MESSAGE.format(limit=fault.context_chars // 4, used=chars // 4), 400, code="context_length_exceeded")
        return 200, _completion(model, body)

    def _handler(self):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # /v1/models: evolver's reachability check
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model"} for name in ("agent", "user", "judge", "meta")]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if fake.faults.get(body.get("model", ""), Fault()).drop:
                    with fake.lock:
                        fake.requests[body.get("model", "")] += 1
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                status, answer = fake.answer(body)
                self._send(status, answer)

            def _send(self, status: int, answer: dict) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        return Handler


def _error(message: str, status: int, code: Optional[str] = None) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error"}.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _completion(model: str, body: dict) -> dict:
    """The scripted reply as an OpenAI chat completion, built as the in-process scripted provider builds it."""
    from evolver.llm import prepare_environment

    prepare_environment()  # before litellm's first import: no price list from the network
    from litellm import ModelResponse

    from evolver.scripted import _to_model_response, load_script

    messages = body.get("messages", [])
    return _to_model_response(ModelResponse, model, messages, load_script()(model, messages, body.get("tools"))).model_dump()
