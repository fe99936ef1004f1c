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

Where each part lives: lanes (Limiter, Lane, the configured Limit), learning (Learner), answers (what
a provider's answer says, what a call costs), service (Service, SocketClient); this module: the
process's limiter (install, current) and a call's permit (permit, tracking).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional

from evolver.data import RateTally
from evolver.ratelimit.answers import Answer, answer_of, estimate_tokens
from evolver.ratelimit.lanes import Limiter, lane_key
from evolver.ratelimit.service import SocketClient

ENV = "EVOLVER_RATE_LIMITER"  # a worker's way to its command's limiter: the socket's path (or "off")
OFF = "off"


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
