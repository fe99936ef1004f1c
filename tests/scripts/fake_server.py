"""What every fake hosted provider shares: a loopback HTTP server that answers from the scripted models.

A provider's fake (fake_openai.FakeOpenAI, fake_anthropic.FakeAnthropic, fake_gemini.FakeGemini) speaks
its wire format and enforces its rules; this base holds the rest, once: it listens on 127.0.0.1 only,
stops by itself (at close(), or after ``lifetime`` seconds), records every request (path, headers with
any key replaced by REDACTED, body), injects the faults of a `Fault` per model name, and asks the
script (evolver.scripted, EVOLVER_SCRIPT) for the reply, in the OpenAI chat shape the scripts read.

``roles`` maps the provider's model names to the script's role that answers each, e.g.
{"gpt-5": "meta", "claude-sonnet-4-5": "meta", "gpt-5-mini": "agent"}; with a map, a model that is
not in it does not exist (the provider's 404); without one, the model's name is the role.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import os
import threading
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from typing import Optional

from evolver.scripted import Reply

REDACTED = "<redacted>"
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "x-goog-api-key", "api-key"})
SECRET_QUERY = frozenset({"key"})


@dataclass
class Fault:
    status: Optional[int] = None  # answer every request with this HTTP status
    rate_limited: int = 0  # answer this many requests with 429 first, then normally
    failing: int = 0  # answer this many requests with 500 first, then normally
    context_chars: Optional[int] = None  # a prompt longer than this is refused as an overflowing context (OpenAI's fake)
    drop: bool = False  # close the connection without answering


@dataclass
class Received:
    """One request as the provider saw it, keys left out."""

    path: str
    headers: dict
    body: dict
    model: str
    seen: int = 0  # the how-many-th request for its model this is (set when it is recorded)


Answer = tuple[int, dict, dict]  # HTTP status, JSON body, extra headers


def tokens(text: str) -> int:
    """The fakes' tokenizer: four characters a token, as evolver's estimates count them."""
    return len(text) // 4


class Signer:
    """Signatures only this server can issue (an HMAC under a secret of its own), so a thinking block or a thought
    signature that comes back changed, moved from another server or invented is told apart from one it gave."""

    def __init__(self):
        self.secret = os.urandom(32)

    def sign(self, text: str) -> str:
        return base64.b64encode(hmac.new(self.secret, text.encode(), hashlib.sha256).digest()).decode()

    def signed(self, text, signature) -> bool:
        return isinstance(text, str) and isinstance(signature, str) and hmac.compare_digest(self.sign(text), signature)


class _Server(http.server.ThreadingHTTPServer):
    """A provider's front accepts every connection: with the standard library's backlog of 5, two dozen
    simulations calling at once on a loaded machine had connections reset before the provider read them,
    and evolver's retry then counted a call the provider never saw (measured: 223 of 2,000 calls reset at
    64 at once under load, 0 with 128)."""

    request_queue_size = 128


class FakeProvider:
    """The server and its bookkeeping; a subclass answers (``answer``) in its provider's format and
    says what its errors look like (``error``)."""

    thread_name = "fake-provider"

    def __init__(self, roles: Optional[dict[str, str]] = None, faults: Optional[dict[str, Fault]] = None, lifetime: float = 900.0):
        self.roles = dict(roles or {})
        self.faults = dict(faults or {})
        self.requests: Counter = Counter()  # model -> requests received
        self.received: list[Received] = []  # every request, in order
        self.lock = threading.Lock()
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name=self.thread_name).start()
        self.timer = threading.Timer(lifetime, self.close)
        self.timer.daemon = True
        self.timer.start()

    # ---- what a provider's fake says ----------------------------------------------------------

    def answer(self, request: Received, headers: dict) -> Answer:
        """The answer to one request; ``headers`` are the request's own, keys included (never store them)."""
        raise NotImplementedError

    def error(self, status: int, message: str) -> dict:
        """The provider's error body for ``status``."""
        raise NotImplementedError

    def model_of(self, path: str, body: dict) -> str:
        return str(body.get("model") or "")

    def listing(self) -> dict:
        """The answer to a GET (a model listing): evolver's reachability check only needs an answer."""
        return {"object": "list", "data": [{"id": name, "object": "model"} for name in self.roles or ("agent", "user", "judge", "meta")]}

    # ---- shared -------------------------------------------------------------------------------

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def bodies(self) -> list[dict]:
        with self.lock:
            return [r.body for r in self.received]

    def bodies_of(self, model: str) -> list[dict]:
        with self.lock:
            return [r.body for r in self.received if r.model == model]

    def role_of(self, model: str) -> Optional[str]:
        """The script's role that answers ``model``; None when the provider has no such model."""
        return self.roles.get(model) if self.roles else model

    def reply(self, role: str, messages: list[dict], tools: Optional[list[dict]]) -> Reply:
        """The script's reply to an OpenAI-shaped conversation (read per call: tests switch scripts)."""
        from evolver.scripted import load_script

        return load_script()(role, messages, tools)

    def injected(self, request: Received) -> Optional[Answer]:
        """The answer a Fault forces on this request, or None."""
        fault, seen = self.faults.get(request.model, Fault()), request.seen
        if fault.status:
            return fault.status, self.error(fault.status, f"fake provider: status {fault.status}"), {}
        if seen <= fault.rate_limited:
            return 429, self.error(429, "Rate limit reached for requests"), {"Retry-After": "0"}
        if seen <= fault.failing:
            return 500, self.error(500, "fake provider: down for now"), {}
        return None

    def _record(self, request: Received) -> None:
        with self.lock:
            self.received.append(request)
            self.requests[request.model] += 1
            request.seen = self.requests[request.model]

    def _handler(self):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self._send(200, fake.listing())

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    return self._send(400, fake.error(400, "The request body is not valid JSON."))
                if not isinstance(body, dict):
                    return self._send(400, fake.error(400, "The request body must be a JSON object."))
                path = _without_secrets(self.path)
                request = Received(path, _redacted(self.headers), body, fake.model_of(path, body))
                fake._record(request)
                if fake.faults.get(request.model, Fault()).drop:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                try:
                    answer = fake.answer(request, {k.lower(): v for k, v in self.headers.items()} | _query(self.path))
                except Exception as exc:  # a script's or the fake's own fault: said, not a dropped connection
                    answer = 500, fake.error(500, f"fake provider: {type(exc).__name__}: {exc}"), {}
                self._send(*answer)

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


def _redacted(headers) -> dict:
    return {k.lower(): (REDACTED if k.lower() in SECRET_HEADERS else v) for k, v in headers.items()}


def _query(path: str) -> dict:
    """A key sent in the query string (Gemini's ?key=), offered to ``answer`` beside the headers as ``query:key``."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    return {f"query:{name}": values[0] for name, values in query.items() if name in SECRET_QUERY}


def _without_secrets(path: str) -> str:
    parts = urllib.parse.urlsplit(path)
    query = [(k, REDACTED if k in SECRET_QUERY else v) for k, v in urllib.parse.parse_qsl(parts.query)]
    return urllib.parse.urlunsplit(("", "", parts.path, urllib.parse.urlencode(query), ""))
