"""The rate limit of a whole Ray cluster: one Limiter (evolver.ratelimit) in a Ray actor, and in every
process that calls a provider (the driver, each node's group relaying its workers' socket) a
RemoteLimiter that books its permits there.

If the actor, or its node, is lost, a RemoteLimiter falls back to a Limiter of its own with a
conservative share of the limits: what is configured, and what the actor had learnt or been told by
the provider, divided by the cluster's nodes. It says so once, and the run goes on. This module
imports ray only inside Ray's processes (the driver, a Ray task).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from evolver.ratelimit.answers import Answer
from evolver.ratelimit.lanes import Limit, Limiter, Throttled, wait_for_permit

CALL_TIMEOUT = 60.0  # seconds an actor's answer may take before it counts as lost (its answers take milliseconds)
REFRESH = 10.0  # seconds between looks at the actor's rates, kept for a fallback


class LimiterActor:
    """The cluster's limiter, as a Ray actor (the driver wraps it with ray.remote): calls that never block."""

    def __init__(self, limits: Optional[dict] = None):
        self.limiter = Limiter(limits)

    def reserve(self, key: str, tokens: int, ticket: Optional[list]) -> tuple[float, tuple]:
        return self.limiter.reserve(key, tokens, tuple(ticket) if ticket else None)

    def report(self, key: str, answer: dict, estimated: int) -> None:
        self.limiter.report(key, Answer(**answer), estimated)

    def snapshot(self) -> dict:
        return self.limiter.snapshot()

    def throttled(self) -> float:
        return self.limiter.throttled()


class RemoteLimiter:
    """This process's way to the cluster's LimiterActor, with the Limiter interface (reserve, acquire,
    report, snapshot, throttled); ``say`` hears, once, that the actor was lost."""

    def __init__(self, actor, limits: Optional[dict] = None, say: Callable[[str], None] = lambda text: None):
        import ray

        self.ray, self.actor, self.limits, self.say = ray, actor, dict(limits or {}), say
        self.fallback: Optional[Limiter] = None
        self.lock = threading.Lock()
        self.rates: dict[str, dict] = {}  # the actor's lanes as last seen
        self.seen_at = 0.0
        self.busy = Throttled()  # the waits of the permits booked through this process

    def reserve(self, key: str, tokens: int = 1, ticket: Optional[tuple] = None) -> tuple[float, tuple]:
        delay, ticket = self._reserve(key, tokens, ticket)
        if delay > 0:
            with self.lock:
                now = time.monotonic()
                self.busy.add(now, now + delay)
        return delay, ticket

    def _reserve(self, key: str, tokens: int, ticket: Optional[tuple]) -> tuple[float, tuple]:
        if self.fallback is None:
            try:
                self._refresh()
                delay, ticket = self.ray.get(
                    self.actor.reserve.remote(key, tokens, list(ticket[1:]) if ticket else None), timeout=CALL_TIMEOUT
                )
                return delay, ("actor", *ticket)
            except Exception as exc:  # noqa: BLE001 - any way of losing the actor (Ray raises a bare Exception for a gone one)
                self._fall_back(exc)
        own = tuple(ticket[1:]) if ticket and ticket[0] == "own" else None  # the actor's tickets mean nothing here
        delay, ticket = self.fallback.reserve(key, tokens, own)
        return delay, ("own", *ticket)

    def acquire(self, key: str, tokens: int = 1) -> float:
        return wait_for_permit(self.reserve, key, tokens)

    def report(self, key: str, answer: Answer, estimated: int = 1) -> None:
        if self.fallback is not None:
            self.fallback.report(key, answer, estimated)
            return
        try:
            self.actor.report.remote(key, answer.__dict__, estimated)  # the answer is not awaited
        except Exception as exc:  # noqa: BLE001 - as in _reserve
            self._fall_back(exc)
            self.fallback.report(key, answer, estimated)

    def snapshot(self) -> dict:
        if self.fallback is None:
            try:
                return self.ray.get(self.actor.snapshot.remote(), timeout=CALL_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - any way of losing the actor (Ray raises a bare Exception for a gone one)
                self._fall_back(exc)
        return self.fallback.snapshot()

    def throttled(self) -> float:
        """Seconds during which some call of this process waited for a permit (its workers' included)."""
        with self.lock:
            return self.busy.seconds()

    def _refresh(self) -> None:
        """The actor's rates, every REFRESH seconds: what a fallback divides."""
        if time.monotonic() - self.seen_at < REFRESH:
            return
        self.seen_at = time.monotonic()
        self.rates = self.ray.get(self.actor.snapshot.remote(), timeout=CALL_TIMEOUT)

    def _fall_back(self, exc: BaseException) -> None:
        with self.lock:
            if self.fallback is not None:
                return
            nodes = max(1, sum(1 for node in self._nodes() if node.get("Alive")))
            share = {name: Limit(**{k: v / nodes for k, v in limit.items()}) for name, limit in self.limits.items()}
            for key, lane in self.rates.items():  # what the actor had learnt or been told, for lanes not configured
                if lane.get("rpm") or lane.get("tpm"):
                    share.setdefault(
                        key,
                        Limit(rpm=lane["rpm"] / nodes if lane.get("rpm") else None, tpm=lane["tpm"] / nodes if lane.get("tpm") else None),
                    )
            self.fallback = Limiter(share)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        self.say(
            f"the cluster's rate limiter was lost ({type(exc).__name__}: {reason}); this process goes on with 1/{nodes} "
            f"of the limits on its own ({', '.join(f'{k}: {_text(v)}' for k, v in share.items()) or 'none known yet: learnt again'})"
        )

    def _nodes(self) -> list[dict]:
        try:
            return self.ray.nodes()
        except Exception:  # noqa: BLE001 - the head itself is unreachable: count this node alone
            return [{"Alive": True}]


def _text(limit: Limit) -> str:
    return " ".join(f"{v:g} {k}" for k, v in (("rpm", limit.rpm), ("tpm", limit.tpm)) if v)
