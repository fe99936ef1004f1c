"""Where simulations run: the one interface the loop and `evolver eval` use.

A backend evaluates a request (a checkout, tasks, trials, seed, models) into an
EvalResult, lists a domain's tasks and splits, reports progress and can be
cancelled. Whatever the backend, the candidate's agent runs in evolver's
sandbox and only the trusted controller writes the run directory.

- local (evolver.evaluation.backends.local): worker processes forked by this machine's zygote;
- ray (evolver.evaluation.backends.ray): simulations as Ray tasks on a cluster or a local Ray instance;
  ray_node is what one Ray task runs on its node, ray_limits the cluster's one rate limiter.

results turns an evaluation's folder into its EvalResult, whichever backend filled it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

from evolver.data import EvalRequest, EvalResult

Progress = Callable[[int, int, Optional[float]], None]  # (finished simulations, all of them, mean reward of the finished)


class Cancelled(Exception):
    """cancel() was called while this evaluation ran; its workers are stopped, finished simulations kept."""


@dataclass
class TaskListing:
    tasks: list[str]  # the task ids a request selects
    splits: dict[str, list[str]] = field(default_factory=dict)  # the domain's named splits
    identifiers: list[str] = field(default_factory=list)  # ids in its task data, for the static scan


class Backend(Protocol):
    name: str

    def evaluate(self, req: EvalRequest, run_id: str, *, timeout: float, on_progress: Optional[Progress] = None) -> EvalResult:
        """Evaluate; simulations already recorded in req.out_dir are kept, not run again. Thread-safe:
        the candidates of an iteration are evaluated at once."""

    def list_tasks(self, req: EvalRequest) -> TaskListing: ...

    def cancel(self) -> None:
        """From any thread: every evaluation in flight stops and raises Cancelled."""

    def close(self) -> None:
        """Release what the backend started (connections, a local Ray instance)."""

    def __enter__(self) -> "Backend": ...

    def __exit__(self, *exc) -> None: ...


def make_backend(name: str, ray_address: str = "", rate_limits: Optional[dict] = None) -> Backend:
    """The backend of one command (evolver.kinds.BACKENDS). It holds the command's rate limiter (evolver.ratelimit),
    configured with ``rate_limits``: this process's own calls (the meta-LLM) and every worker's wait their turn in it."""
    from evolver.kinds import BACKENDS

    return BACKENDS[name].load(__name__)(ray_address=ray_address, rate_limits=rate_limits)
