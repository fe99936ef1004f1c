"""The limiter: one lane per provider endpoint and model, handing out permits at the lane's rate (GCRA),
thread-safe and never blocking; the configured limits it starts from."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

from evolver.data import RateTally
from evolver.ratelimit.answers import Answer
from evolver.ratelimit.learning import FLOOR, Learner

BURST = 1.0  # seconds of a lane's rate handed out at once, at most, before permits are spaced
WINDOW = 10.0  # seconds of answers from which the first cut measures what the provider let through
HEADROOM = 0.98  # share of a limit a provider declares (x-ratelimit-limit-*) that the lane uses
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
        return {
            "rpm": None if requests is None else round(requests * 60, 1),
            "tpm": None if per_token is None else round(per_token * 60),
            "source": source,
            "in_use_rpm": float(sum(1 for t in self.granted if t <= now)),
            "waiting": self.waiting(now),
            **self.tally.model_dump(),
        }


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

    def __init__(
        self, limits: Optional[dict] = None, learner: Callable[[], Learner] = Learner, clock: Callable[[], float] = time.monotonic
    ):
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
