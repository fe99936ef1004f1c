"""A fake OpenAI-compatible provider on 127.0.0.1: the scripted models over real HTTP.

Each request is answered by the scripted script (evolver.scripted, EVOLVER_SCRIPT) for the
model name it names, so `--agent-model openai/agent --api-base URL` plays the same roles as
`scripted/agent`, through litellm's real OpenAI route. Per model, a fault can be set instead:
an HTTP status (400, 401, 500, ...), a number of 429s before it answers, a context limit past
which it answers 400 as OpenAI does for an overflowing context, or a dropped connection. Every
request body is kept (`bodies`), so a test can see what reached the provider. It listens only on
loopback and stops by itself: at close(), or after `lifetime` seconds.

A `Limit` makes it a rate-limited hosted API: a token bucket per model for requests and one for
tokens per minute (a prompt counts its characters / 4, plus its max_tokens), answering 429 with
Retry-After (and, like OpenAI, x-ratelimit-* headers on every answer when `headers` is on) while
a bucket is empty; a fixed latency per call, and an optional share of 500s and slow answers.
"""

from __future__ import annotations

import http.server
import json
import math
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Optional

# A request body may name the scripted role that answers it (sent with --agent-arg 'extra_body={fake_role = "agent"}'),
# so that every role can call one model name: one provider limit, as for a user running every role on gpt-4.1-mini.
ROLE = "fake_role"
CONTEXT_MESSAGE = "This model's maximum context length is {limit} tokens. However, your messages resulted in {used} tokens."


@dataclass
class Fault:
    status: Optional[int] = None  # answer every request with this HTTP status
    rate_limited: int = 0  # answer this many requests with 429 first, then normally
    failing: int = 0  # answer this many requests with 500 first, then normally
    context_chars: Optional[int] = None  # a prompt longer than this is refused as an overflowing context
    drop: bool = False  # close the connection without answering


@dataclass
class Limit:
    """What a hosted API allows each model: requests and tokens per minute, as token buckets that hold
    ``burst`` seconds of the limit (OpenAI's hold a minute; a short one keeps a benchmark honest)."""

    rpm: float = 0.0  # 0: no request limit
    tpm: float = 0.0  # 0: no token limit
    burst: float = 2.0  # seconds of the limit a full bucket holds (it starts full)
    latency: float = 0.0  # seconds each answered call takes
    errors: float = 0.0  # share of calls answered 500
    slow: float = 0.0  # share of calls that take ``slow_seconds`` more
    slow_seconds: float = 2.0
    headers: bool = False  # x-ratelimit-limit/remaining/reset-* on every answer, as OpenAI sends them
    seed: int = 0


class _Bucket:
    def __init__(self, per_minute: float, burst: float, now: float):
        self.rate, self.capacity = per_minute / 60.0, max(1.0, per_minute / 60.0 * burst)
        self.level, self.at = self.capacity, now

    def fill(self, now: float) -> None:
        self.level, self.at = min(self.capacity, self.level + (now - self.at) * self.rate), now

    def wait(self, amount: float) -> float:
        """Seconds until ``amount`` is there (0: it is)."""
        return max(0.0, (min(amount, self.capacity) - self.level) / self.rate)


class FakeOpenAI:
    def __init__(self, faults: Optional[dict[str, Fault]] = None, lifetime: float = 900.0, limit: Optional[Limit] = None):
        self.faults = dict(faults or {})
        self.limit = limit
        self.buckets: dict[str, tuple[Optional[_Bucket], Optional[_Bucket]]] = {}
        self.random = random.Random(limit.seed if limit else 0)
        self.limited: Counter = Counter()  # model -> 429s answered by the limit
        self.refused: list[float] = []  # when each of them was answered (time.monotonic())
        self.answered: list[float] = []  # when each call the limit let through was answered (time.monotonic())
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

    def answer(self, body: dict) -> tuple[int, dict, dict]:
        """(HTTP status, body, headers) for one request."""
        model = body.get("model", "")
        with self.lock:
            self.bodies.append(body)
            self.requests[model] += 1
            seen = self.requests[model]
        fault, headers = self.faults.get(model, Fault()), {}
        if self.limit is not None:
            refused, headers = self._over_limit(model, body)
            if refused is not None:
                return (*refused, headers)
        if fault.status:
            return fault.status, _error(f"fake provider: status {fault.status}", fault.status), {}
        if seen <= fault.rate_limited:
            return 429, _error("Rate limit reached for requests", 429), {"Retry-After": "0"}
        if seen <= fault.failing:
            return 500, _error("fake provider: down for now", 500), {}
        chars = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
        if fault.context_chars is not None and chars > fault.context_chars:
            return 400, _error(CONTEXT_MESSAGE.format(limit=fault.context_chars // 4, used=chars // 4), 400, code="context_length_exceeded"), {}
        return 200, _completion(body.get(ROLE) or model, body), headers

    def _over_limit(self, model: str, body: dict) -> tuple[Optional[tuple[int, dict]], dict]:
        """The limit's word on one call: (a 429 or an injected 500 to answer, or None to answer it; its headers)."""
        limit, now = self.limit, time.monotonic()
        tokens = sum(len(str(m.get("content") or "")) for m in body.get("messages", [])) / 4 + (body.get("max_tokens") or 0)
        with self.lock:
            if model not in self.buckets:
                self.buckets[model] = (_Bucket(limit.rpm, limit.burst, now) if limit.rpm else None,
                                       _Bucket(limit.tpm, limit.burst, now) if limit.tpm else None)
            requests, words = self.buckets[model]
            waits = []
            for bucket, amount in ((requests, 1.0), (words, tokens)):
                if bucket is not None:
                    bucket.fill(now)
                    waits.append(bucket.wait(amount))
            headers = self._rate_headers(requests, words)
            if any(waits):
                self.limited[model] += 1
                self.refused.append(now)
                return (429, _error("Rate limit reached for requests", 429)), {"Retry-After": f"{max(waits):.3f}", **headers}
            for bucket, amount in ((requests, 1.0), (words, tokens)):
                if bucket is not None:
                    bucket.level -= min(amount, bucket.capacity)
            fail, slow = self.random.random() < limit.errors, self.random.random() < limit.slow
        time.sleep(limit.latency + (limit.slow_seconds if slow else 0.0))
        if fail:
            return (500, _error("fake provider: an injected server error", 500)), headers
        with self.lock:
            self.answered.append(time.monotonic())
        return None, headers

    def _rate_headers(self, requests: Optional[_Bucket], words: Optional[_Bucket]) -> dict:
        if not self.limit.headers:
            return {}
        out = {}
        for name, bucket in (("requests", requests), ("tokens", words)):
            if bucket is not None:
                out[f"x-ratelimit-limit-{name}"] = str(round(bucket.rate * 60))
                out[f"x-ratelimit-remaining-{name}"] = str(math.floor(bucket.level))
                out[f"x-ratelimit-reset-{name}"] = f"{(bucket.capacity - bucket.level) / bucket.rate:.3f}s"
        return out

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
                self._send(*fake.answer(body))

            def _send(self, status: int, answer: dict, headers: Optional[dict] = None) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
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

    from evolver.scripted import _to_model_response, answer

    messages = body.get("messages", [])
    return _to_model_response(ModelResponse, model, messages, answer(model, messages, body.get("tools"))).model_dump()
