"""One rate limit per provider endpoint and model, shared by every LLM call of an evolver command.

Every call of every role (agent, user, judge, meta) goes through evolver.llm.retrying, which asks
this module for a permit before it calls the provider and tells it afterwards what the provider
answered. The permits come from one Limiter per command:

- in the controller process, the Limiter itself (`install`); the local backend serves it to its
  workers on a Unix socket in the runtime directory (Service), whose path the workers get in their
  environment (EVOLVER_RATE_LIMITER); a worker's threads each hold a connection (SocketClient);
- on Ray, a Ray actor holds it for the whole cluster; each node's groups relay their workers'
  socket to it (evolver.evaluation.backends.ray_limits), falling back to a per-node share if it is lost.

A lane (one provider endpoint and model) hands out permits first come, first served, spaced by
its rate (GCRA: a burst of about a second, then evenly), for requests and for tokens per minute; a
call waiting keeps its place in the queue when the rate changes (Lane).
Its rate is the smallest of what is configured (`rate_limits`), what the provider's
x-ratelimit-limit-* headers declare, and what the lane has learnt from 429s; none of them: no
limit at all. Learning (Learner, chosen by benchmarks/rate_limits.py --controllers over cutting to
a share of the measured throughput each time, and over additive increase): the first 429 sets the
rate to half of what the provider let through over the last seconds, each later one halves it, at
most once per HOLD seconds (the calls already in flight cut no more), and Retry-After pauses the
lane; every second of answers without a 429 while calls wait for their turn grows the rate by 5 %.
A call waits for its permit instead of failing, and a 429 is retried through the lane.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

from evolver.data import RateTally

ENV = "EVOLVER_RATE_LIMITER"  # a worker's way to its command's limiter: the socket's path (or "off")
OFF = "off"
BURST = 1.0  # seconds of a lane's rate handed out at once, at most, before permits are spaced
HOLD = 2.0  # seconds after a cut in which further 429s (calls already in flight) cut no more
WINDOW = 10.0  # seconds of answers from which the first cut measures what the provider let through
CUT = 0.5  # a cut: this share of the rate (the first: of what the provider let through lately)
GROWTH = 0.05  # share of the rate added per second of answers without a 429
HEADROOM = 0.98  # share of a limit a provider declares (x-ratelimit-limit-*) that the lane uses
FLOOR = 1.0 / 60  # requests per second a learnt rate never goes below: one a minute
CHARS_PER_TOKEN = 4
ASK_AGAIN = 1.0  # seconds a waiting call sleeps at most before it asks again (a rate that grew lets it go sooner)


# ---- what people configure --------------------------------------------------------------------

@dataclass(frozen=True)
class Limit:
    """A configured limit: requests and tokens per minute (None: not configured)."""

    rpm: Optional[float] = None
    tpm: Optional[float] = None


def lane_key(model: str, api_base: Optional[str] = None) -> str:
    """The lane of a call: its model string, and its endpoint when the call names one
    ("openai/gpt-4.1-mini", "openai/qwen @ http://127.0.0.1:8000/v1")."""
    return f"{model} @ {api_base.rstrip('/')}" if api_base else model


def matches(configured: str, key: str) -> bool:
    """Whether a configured name ("openai/gpt-4.1-mini", "gpt-4.1-mini", or a whole lane with its endpoint)
    names this lane: the same model, with or without the provider in front, on any endpoint unless named."""
    model, _, base = key.partition(" @ ")
    name, _, want = configured.partition(" @ ")
    if want and want.rstrip("/") != base:
        return False
    return name in (model, model.split("/", 1)[-1]) or model in (name, name.split("/", 1)[-1])


# ---- what the provider says -------------------------------------------------------------------

@dataclass
class Answer:
    """What one call's answer told the lane."""

    limited: bool = False  # a 429
    retry_after: Optional[float] = None  # seconds, from Retry-After
    limit_requests: Optional[float] = None  # x-ratelimit-limit-requests: per minute
    limit_tokens: Optional[float] = None  # x-ratelimit-limit-tokens: per minute
    tokens: Optional[int] = None  # what the call used (prompt and completion), once answered


def read_headers(headers) -> Answer:
    """Retry-After and x-ratelimit-limit-* from a response's headers (litellm prefixes a provider's own
    with llm_provider-); anything unreadable is left out."""
    if not headers:
        return Answer()
    flat = {str(k).lower().removeprefix("llm_provider-"): str(v) for k, v in dict(headers).items()}
    return Answer(retry_after=_seconds(flat.get("retry-after-ms"), 0.001) or _seconds(flat.get("retry-after"), 1.0),
                  limit_requests=_number(flat.get("x-ratelimit-limit-requests")),
                  limit_tokens=_number(flat.get("x-ratelimit-limit-tokens")))


def _number(text: Optional[str]) -> Optional[float]:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value and math.isfinite(value) and value > 0 else None


def _seconds(text: Optional[str], unit: float) -> Optional[float]:
    """Retry-After: seconds (or ms), or "1.5s"; an HTTP date is not read (hosted APIs send seconds)."""
    if text is None:
        return None
    found = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s)?\s*", text)
    if not found:
        return None
    try:
        value = float(found.group(1)) * (0.001 if found.group(2) == "ms" else unit)
    except ValueError:
        return None
    return min(value, 120.0) if math.isfinite(value) else None


def answer_of(response=None, error: Optional[BaseException] = None, limited: bool = False) -> Answer:
    """What a litellm response or error says: its headers (litellm keeps a provider's in
    _hidden_params["additional_headers"], and on an error in litellm_response_headers) and its usage."""
    if error is not None:
        headers = getattr(error, "litellm_response_headers", None) or getattr(getattr(error, "response", None), "headers", None)
        found = read_headers(headers)
        found.limited = limited
        return found
    hidden = getattr(response, "_hidden_params", None) or {}
    found = read_headers(hidden.get("additional_headers") if isinstance(hidden, dict) else None)
    usage = getattr(response, "usage", None)
    total = getattr(usage, "total_tokens", None) if usage is not None else None
    found.tokens = int(total) if isinstance(total, (int, float)) else None
    return found


def estimate_tokens(kwargs: dict) -> int:
    """A call's tokens before it is made, as providers count them for a limit: the prompt (about four
    characters a token) and the completion it may write (max_tokens, when given)."""
    chars = 0
    for message in kwargs.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
        chars += len(content) if isinstance(content, str) else len(json.dumps(content, default=str)) if content else 0
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        chars += len(json.dumps(calls, default=str)) if calls else 0
    if kwargs.get("tools"):
        chars += len(json.dumps(kwargs["tools"], default=str))
    most = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens") or 0
    return max(1, chars // CHARS_PER_TOKEN + (most if isinstance(most, int) else 0))


# ---- learning a rate from 429s ----------------------------------------------------------------

class Learner:
    """A lane's learnt request rate (per second; None: nothing learnt, no limit). See the module's
    docstring; ``measured`` cuts every time from what got through (the rule it was measured against)."""

    def __init__(self, cut: float = CUT, growth: float = GROWTH, hold: float = HOLD, measured: bool = False):
        self.cut, self.growth, self.hold, self.measured = cut, growth, hold, measured
        self.rate: Optional[float] = None
        self.cut_at = -math.inf
        self.grown_at = 0.0
        self.pressed = False  # whether calls were waiting at the last answer

    def limited(self, now: float, through: float) -> bool:
        """A 429 at ``now``, the provider having let ``through`` calls a second through lately; True when it cut."""
        if now - self.cut_at < self.hold:
            return False
        if self.rate is None:
            base = through  # the first 429: what got through is all that is known
        else:  # measured: what got through, never more than the rate; plain AIMD: the rate
            base = min(self.rate, through) if self.measured else self.rate
        self.rate = max(FLOOR, base * self.cut)
        self.cut_at = self.grown_at = now
        return True

    def answered(self, now: float, pressed: bool = True) -> None:
        """An answer without a 429: the rate grows over the time since the last answer, once the hold after the last
        cut has passed, if calls were waiting for their turn (``pressed``) at both answers. A rate nobody presses on
        is not raised: it would be untested, and the next burst of demand (a run's next evaluation, after a quiet
        stretch) would meet the provider's limit all at once."""
        if self.rate is not None and pressed and self.pressed:
            self.rate *= (1 + self.growth) ** max(0.0, now - max(self.grown_at, self.cut_at + self.hold))
        self.grown_at, self.pressed = now, pressed


# ---- one lane ---------------------------------------------------------------------------------

class Lane:
    """One provider endpoint and model: its permits, rate and counts. Not thread-safe: Limiter locks.

    A call books a position in the lane's queue (one for requests, its tokens for tokens) and may go once
    the lane's frontier, which moves at the lane's current rate (not while Retry-After pauses it), is within
    a burst of it (GCRA, counted in calls and tokens rather than in time). A call waiting when the rate
    changes keeps its place: a faster rate lets it go sooner at once, a slower one later."""

    def __init__(self, key: str, configured: Limit, learner: Callable[[], Learner]):
        self.key, self.configured, self.learner = key, configured, learner()
        self.declared = Limit()  # what the provider's headers say
        self.front = [0.0, 0.0]  # the frontier, for requests and for tokens: calls and tokens released so far
        self.next = [0.0, 0.0]  # the next position to book, for requests and for tokens
        self.moved_at = -math.inf  # when the frontier was last moved
        self.paused_until = 0.0  # Retry-After
        self.due_at: dict[int, float] = {}  # calls waiting now: when each is expected to go
        self.tally = RateTally()
        self.answers: deque[float] = deque()  # when calls were answered without a 429, the last WINDOW seconds
        self.granted: deque[float] = deque()  # permits of the last minute, for the rate in use

    def rates(self) -> tuple[Optional[float], Optional[float], str]:
        """(requests per second, tokens per second, where the request rate comes from); None: no limit."""
        candidates = []
        if self.configured.rpm:
            candidates.append((self.configured.rpm / 60, "configured"))
        if self.declared.rpm:
            candidates.append((self.declared.rpm * HEADROOM / 60, "provider"))
        if self.learner.rate is not None:
            candidates.append((self.learner.rate, "learnt"))
        requests, source = min(candidates) if candidates else (None, "")
        tokens = [t / 60 for t in (self.configured.tpm, self.declared.tpm * HEADROOM if self.declared.tpm else None) if t]
        return requests, (min(tokens) if tokens else None), source or ("configured" if tokens else "")

    def move(self, now: float) -> None:
        """Move the frontier to ``now`` at the current rates; called before every change of them."""
        since = max(self.moved_at, self.paused_until)
        if since < now:
            for i, rate in enumerate(self.rates()[:2]):
                if rate:
                    self.front[i] += (now - since) * rate
        self.moved_at = max(self.moved_at, now)

    def book(self, now: float, tokens: int) -> tuple[float, float]:
        """A new call's positions: behind every call booked before it, and never before the frontier (an idle
        lane saves no more than a burst)."""
        self.move(now)
        booked = []
        for i, cost in enumerate((1, tokens)):
            at = max(self.next[i], self.front[i])
            self.next[i] = at + cost
            booked.append(at)
        return booked[0], booked[1]

    def wait(self, now: float, positions) -> float:
        """Seconds until a call booked at ``positions`` may go (0: now)."""
        self.move(now)
        delay = 0.0
        for i, rate in enumerate(self.rates()[:2]):
            if rate:
                delay = max(delay, (positions[i] - self.front[i]) / rate - BURST)
        delay += max(0.0, self.paused_until - now)
        return delay if delay > 1e-6 else 0.0  # a position the frontier just reached, give or take rounding

    def appeared(self, now: float, before: tuple) -> None:
        """A limit that was not there before (the first 429, the provider's headers): spaced from now on, no burst."""
        for i, (rate, was) in enumerate(zip(self.rates()[:2], before[:2])):
            if rate and not was:
                self.front[i] = self.next[i] - BURST * rate

    def correct(self, estimated: int, used: Optional[int]) -> None:
        """The call used ``used`` tokens where ``estimated`` were booked: book the difference."""
        if used is not None:
            self.next[1] += used - estimated

    def through(self, now: float) -> float:
        """Calls a second the provider answered without a 429 lately (over the last WINDOW seconds); with
        none answered yet, the permits handed out then (nothing else is known: the first answers may still
        be on their way)."""
        while self.answers and self.answers[0] < now - WINDOW:
            self.answers.popleft()
        times = self.answers or [t for t in self.granted if now - WINDOW <= t <= now]
        return max(FLOOR, len(times) / min(WINDOW, max(1.0, now - times[0])) if times else FLOOR)

    def waiting(self, now: float) -> int:
        for ticket in [t for t, at in self.due_at.items() if at <= now]:  # gone, or about to ask again
            del self.due_at[ticket]
        return len(self.due_at)

    def view(self, now: float) -> dict:
        requests, per_token, source = self.rates()
        while self.granted and self.granted[0] < now - 60:
            self.granted.popleft()
        return {"rpm": None if requests is None else round(requests * 60, 1), "tpm": None if per_token is None else round(per_token * 60),
                "source": source, "in_use_rpm": float(sum(1 for t in self.granted if t <= now)), "waiting": self.waiting(now),
                **self.tally.model_dump()}


# ---- the limiter ------------------------------------------------------------------------------

Ticket = tuple  # (number, request position, token position, when booked): what a caller holds while it waits


class Throttled:
    """The union of the spans during which some call waited for its permit: seconds that count against
    no time limit (evolver.evaluation.backends.local)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock, self.until, self.total = clock, 0.0, 0.0

    def add(self, now: float, until: float) -> None:
        if until > self.until:
            self.total += until - max(now, self.until)
            self.until = until

    def seconds(self) -> float:
        return self.total - max(0.0, self.until - self.clock())


class Limiter:
    """Every lane of one command, thread-safe and never blocking: reserve() books a permit and says how
    long to wait for it; the caller waits (wherever it is: a thread, a worker, a Ray node) and comes
    back with its ticket, which stands unless the lane slowed down meanwhile."""

    def __init__(self, limits: Optional[dict] = None, learner: Callable[[], Learner] = Learner,
                 clock: Callable[[], float] = time.monotonic):
        self.limits = {name: _limit(value) for name, value in (limits or {}).items()}
        self.learner, self.clock = learner, clock
        self.lanes: dict[str, Lane] = {}
        self.lock = threading.Lock()
        self.busy = Throttled(clock)
        self.booked = 0  # tickets handed out: each one's number

    def _configured(self, key: str) -> Limit:
        return next((limit for name, limit in self.limits.items() if matches(name, key)), Limit())

    def _lane(self, key: str) -> Lane:
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = Lane(key, self._configured(key), self.learner)
        return lane

    def reserve(self, key: str, tokens: int = 1, ticket: Optional[Ticket] = None) -> tuple[float, Ticket]:
        """(seconds to wait, ticket): 0 when the call may go now. Called again with its ticket once waited."""
        with self.lock:
            lane, now = self._lane(key), self.clock()
            if ticket is None:
                lane.tally.calls += 1
                self.booked += 1
                ticket = (self.booked, *lane.book(now, tokens), now)
            delay = lane.wait(now, ticket[1:3])
            if delay > 0:
                lane.due_at[ticket[0]] = now + delay
                self.busy.add(now, now + delay)
                return delay, ticket
            lane.due_at.pop(ticket[0], None)
            lane.tally.waited += now - ticket[3]
            lane.granted.append(now)
            return 0.0, ticket

    def acquire(self, key: str, tokens: int = 1) -> float:
        return wait_for_permit(self.reserve, key, tokens)

    def report(self, key: str, answer: Answer, estimated: int = 1) -> None:
        """What the provider answered a call that had its permit."""
        with self.lock:
            lane, now = self._lane(key), self.clock()
            lane.move(now)  # what was released at the old rates stays released
            before = lane.rates()
            if answer.limit_requests or answer.limit_tokens:
                lane.declared = Limit(answer.limit_requests or lane.declared.rpm, answer.limit_tokens or lane.declared.tpm)
            if answer.limited:
                lane.tally.limited += 1
                if answer.retry_after:
                    lane.paused_until = max(lane.paused_until, now + answer.retry_after)
                if not (lane.declared.rpm or lane.declared.tpm):  # the provider's own word: nothing to learn
                    lane.learner.limited(now, lane.through(now))
            else:
                lane.answers.append(now)
                lane.learner.answered(now, pressed=lane.waiting(now) > 0)
                lane.correct(estimated, answer.tokens)
            lane.appeared(now, before)

    def throttled(self) -> float:
        """Seconds of this limiter's life during which some call waited for a permit."""
        with self.lock:
            return self.busy.seconds()

    def snapshot(self) -> dict[str, dict]:
        """Per lane: the rate in use (rpm, tpm and where it comes from; permits over the last minute),
        calls waiting now, and so far the permits, 429s and seconds waited."""
        with self.lock:
            now = self.clock()
            return {key: lane.view(now) for key, lane in sorted(self.lanes.items())}


def _limit(value) -> Limit:
    return value if isinstance(value, Limit) else Limit(**value)


def wait_for_permit(reserve: Callable[..., tuple[float, Ticket]], key: str, tokens: int) -> float:
    """Book a permit with ``reserve`` (a Limiter's, over a socket or on a Ray actor), wait for it, confirm
    it (asking again at least every ASK_AGAIN seconds: the lane's rate may have changed); returns the seconds waited."""
    started = time.monotonic()
    delay, ticket = reserve(key, tokens)
    if delay <= 0:
        return 0.0  # its turn at once: asking is no wait
    while delay > 0:
        time.sleep(min(delay, ASK_AGAIN))
        delay, ticket = reserve(key, tokens, ticket)
    return time.monotonic() - started


# ---- reaching the limiter from another process ------------------------------------------------

class Service:
    """A Limiter (or a Ray node's relay to one) on a Unix socket, for worker processes: a thread per
    connection (each worker thread holds one), JSON lines, answered at once (callers wait on their side):
    {"op": "reserve", "key", "tokens", "ticket"} -> {"delay", "ticket"};
    {"op": "report", "key", "answer", "estimated"} -> {}; {"op": "snapshot"} -> {"lanes"}."""

    def __init__(self, limiter, directory: Path):
        self.limiter = limiter
        self.path = Path(directory) / f"limiter-{os.getpid()}-{id(self) & 0xffffff:x}.sock"
        self.path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.sock.listen(256)
        self.closed = False
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, name="rate-limiter", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                if self.closed:
                    conn.close()
                    return
                self.connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="rate-limiter-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            for message in _lines(conn):
                conn.sendall((json.dumps(self.answer(message)) + "\n").encode())
        except (OSError, ValueError):
            pass
        finally:
            with self.lock:
                self.connections.discard(conn)
            conn.close()

    def answer(self, message: dict) -> dict:
        op = message.get("op")
        if op == "reserve":
            ticket = message.get("ticket")
            delay, ticket = self.limiter.reserve(str(message["key"]), int(message.get("tokens") or 1), tuple(ticket) if ticket else None)
            return {"delay": delay, "ticket": list(ticket)}
        if op == "report":
            self.limiter.report(str(message["key"]), Answer(**message.get("answer") or {}), int(message.get("estimated") or 1))
            return {}
        if op == "snapshot":
            return {"lanes": self.limiter.snapshot()}
        return {"error": f"unknown op {op!r}"}

    def close(self) -> None:
        with self.lock:
            self.closed = True
            connections = list(self.connections)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.path.unlink(missing_ok=True)


def _lines(conn: socket.socket) -> Iterator[dict]:
    buffer = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield json.loads(line)


class SocketClient:
    """A worker's side of Service: one connection per thread (tau2 runs simulations in threads)."""

    def __init__(self, path: str):
        self.path = path
        self.local = threading.local()

    def _ask(self, message: dict) -> dict:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(self.path)
            self.local.conn, self.local.lines = conn, _lines(conn)
        try:
            conn.sendall((json.dumps(message) + "\n").encode())
            return next(self.local.lines)
        except (OSError, StopIteration, ValueError):
            conn.close()
            self.local.conn = None
            raise OSError(f"the rate limiter at {self.path} stopped answering")

    def reserve(self, key: str, tokens: int = 1, ticket: Optional[Ticket] = None) -> tuple[float, Ticket]:
        found = self._ask({"op": "reserve", "key": key, "tokens": tokens, "ticket": list(ticket) if ticket else None})
        return float(found["delay"]), tuple(found["ticket"])

    def acquire(self, key: str, tokens: int = 1) -> float:
        return wait_for_permit(self.reserve, key, tokens)

    def report(self, key: str, answer: Answer, estimated: int = 1) -> None:
        self._ask({"op": "report", "key": key, "answer": asdict(answer), "estimated": estimated})

    def snapshot(self) -> dict[str, dict]:
        return self._ask({"op": "snapshot"})["lanes"]


# ---- this process's limiter -------------------------------------------------------------------

_installed = None
_install_lock = threading.Lock()
_tallies = threading.local()


def install(limiter):
    """Make ``limiter`` (a Limiter, or anything with acquire/report/snapshot; None: the default again) this
    process's; the one it replaces is returned, for whoever installed it for a while to put it back."""
    global _installed
    with _install_lock:
        previous, _installed = _installed, limiter
    return previous


def switched_off() -> bool:
    """EVOLVER_RATE_LIMITER=off: no limiter anywhere, every call on its own with backoff (what evolver did
    before it had one; benchmarks/rate_limits.py compares with it)."""
    return os.environ.get(ENV, "").strip().lower() == OFF


def current():
    """This process's limiter: the one installed, else the command's over EVOLVER_RATE_LIMITER (a worker),
    else one of its own (unlimited until a provider says otherwise); None when switched off."""
    global _installed
    if switched_off():
        return None
    with _install_lock:
        if _installed is None:
            path = os.environ.get(ENV)
            _installed = SocketClient(path) if path else Limiter()
        return _installed


@contextmanager
def tracking() -> Iterator[dict[str, RateTally]]:
    """Count, per lane, the calls this thread makes inside the block (a simulation's, a proposal's)."""
    previous = getattr(_tallies, "current", None)
    _tallies.current = found = {}
    try:
        yield found
    finally:
        _tallies.current = previous


def _count(key: str, **more) -> None:
    found = getattr(_tallies, "current", None)
    if found is not None:
        found[key] = found.get(key, RateTally()).add(RateTally(**more))


@dataclass
class Permit:
    """One call's turn: made by ``permit``, told what the provider answered."""

    key: str
    estimated: int
    limiter: object = field(repr=False, default=None)

    def answered(self, response) -> None:
        self._report(answer_of(response=response))

    def failed(self, error: BaseException, limited: bool) -> None:
        self._report(answer_of(error=error, limited=limited))
        if limited:
            _count(self.key, limited=1)

    def _report(self, answer: Answer) -> None:
        if self.limiter is None:
            return
        try:
            self.limiter.report(self.key, answer, self.estimated)
        except OSError:
            pass  # the limiter went with its command: the call's own outcome stands


def permit(model: str, api_base: Optional[str], kwargs: dict) -> Permit:
    """Wait for a call's turn in its lane (blocking); the permit is then told the call's outcome."""
    key, estimated = lane_key(model, api_base), estimate_tokens(kwargs)
    limiter, waited = current(), 0.0
    try:
        waited = limiter.acquire(key, estimated) if limiter is not None else 0.0
    except OSError:  # the command's limiter is gone (it is ending): go on unlimited rather than fail the call
        pass
    _count(key, calls=1, waited=waited)
    return Permit(key, estimated, limiter)
