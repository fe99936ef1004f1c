"""What a run reports as it goes: typed events, and the bus the loop emits them on.

The loop never prints. Subscribers render the events: the terminal view
(evolver.cli.console.ConsoleView) today; a live dashboard, a log or an experiment
tracker can subscribe the same way. Events are plain data, emitted from the
loop's thread and from the threads that evaluate candidates at once, so a
subscriber must be thread-safe.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class Phase:
    text: str  # "iteration 3: gate stage 2/5 (2 trial(s) per task, 2 candidates)"


@dataclass(frozen=True)
class Baseline:
    analysis: Optional[float]
    gate: Optional[float]


@dataclass(frozen=True)
class NoiseFloor:
    tasks: int
    trials: int
    points: Optional[float]  # smallest effect with 80% power, points; None: no effect reaches it
    min_effect_points: float


@dataclass(frozen=True)
class Estimate:
    forecast: object  # evolver.evolution.plan.Forecast of the rest of the run, priced by the baseline's simulations
    seconds_per_simulation: float  # the baseline's analysis evaluation: wall time / simulations
    concurrency: int
    budget_usd: float = 0.0
    budget_tokens: int = 0


@dataclass(frozen=True)
class Spent:
    usage: dict  # role -> RoleUsage: the run's tokens and dollars so far, the iteration in progress included
    budget_usd: float = 0.0  # the run's limits (0: none), for the views to show what is left
    budget_tokens: int = 0


@dataclass(frozen=True)
class EvalProgress:
    name: str  # the evaluation, e.g. "iter-003b-gate"
    done: int
    total: int
    mean: Optional[float] = None  # mean reward of the finished simulations (infrastructure errors left out)


@dataclass(frozen=True)
class EvalFinished:
    name: str


@dataclass(frozen=True)
class Proposing:
    label: str  # the candidate being proposed
    turn: int  # the meta-LLM's turn, from 1
    turns: int  # at most this many
    doing: str  # the tool it called last, or "thinking"


@dataclass(frozen=True)
class Decided:
    label: str  # the candidate
    status: str
    title: str
    reason: str


@dataclass(frozen=True)
class Holdout:
    base: Optional[float]
    best: Optional[float]


@dataclass(frozen=True)
class Ended:
    how: str  # "stopped", "paused" (the meta-LLM stayed down), "interrupted", or "failed" (an error the command reports)
    reason: str
    run_id: str


@dataclass(frozen=True)
class RateLimits:
    lanes: dict  # provider endpoint and model -> the rate in use, calls waiting, 429s, seconds waited (evolver.ratelimit's snapshot)


Event = Phase | Baseline | NoiseFloor | Estimate | Spent | EvalProgress | EvalFinished | Proposing | Decided | Holdout | Ended | RateLimits


class Events:
    def __init__(self) -> None:
        self.subscribers: list[Callable[[Event], None]] = []
        self.lock = threading.Lock()
        self.failed: set[int] = set()

    def subscribe(self, subscriber: Callable[[Event], None]) -> None:
        with self.lock:
            self.subscribers.append(subscriber)

    def emit(self, event: Event) -> None:
        """Tell every subscriber; one that fails is reported on stderr and the others, and the loop, go on:
        a view or a tracker is never worth a run."""
        with self.lock:
            subscribers = list(self.subscribers)
        for subscriber in subscribers:
            try:
                subscriber(event)
            except Exception as exc:  # noqa: BLE001
                if id(subscriber) not in self.failed:  # once per subscriber: a broken view would repeat it at every event
                    self.failed.add(id(subscriber))
                    print(
                        f"evolver: warning: {type(subscriber).__name__} failed on {type(event).__name__} ({type(exc).__name__}: {exc}); "
                        "the run goes on",
                        file=sys.stderr,
                    )
