"""The evolution loop: the baseline, then iterations until a stop condition, then the audit and the holdout.

    measure the baseline -> repeat: an iteration of the run's search -> (end) audit, holdout and report

Two searches, as the run's gate policy says (gate.search): one lineage (audited, per-decision: K candidates from
the incumbent, the gate beside it, at most one kept) or a population (a pool of candidates, each iteration's parent
drawn from it, children screened before any gate trial). Every step writes its result to the run directory before
the next starts, and every step first looks there for its own result, so a run killed at any point resumes where it
stopped without redoing finished simulations or duplicating candidates.

Loop is the orchestration: drive() runs the run, iterate() one iteration. It holds its steps, each a module of this
package given the run's context (context.RunContext: the run, its state, settings, backend, lineage and events, and
the measure / checkout / save / step operations): incumbent (the baseline, the analysis results, the gate
reference), proposing, validation (commit, refuse the inert, smoke test), gating, outcome (the iteration recorded),
run_end (audit and holdout) and stops; lineage and population are the two searches made of them.
"""

from __future__ import annotations

import threading

from evolver import events as ev
from evolver import ratelimit
from evolver.errors import UsageError
from evolver.evolution.loop.context import RunContext
from evolver.evolution.loop.incumbent import Incumbent
from evolver.evolution.loop.lineage import LineageSearch
from evolver.evolution.loop.outcome import Outcome
from evolver.evolution.loop.population import PopulationSearch
from evolver.evolution.loop.proposing import Proposing
from evolver.evolution.loop.run_end import RunEnd
from evolver.evolution.loop.stops import StopConditions, StopRun
from evolver.evolution.loop.validation import Validation
from evolver.llm import ConfigurationError, ProviderError
from evolver.store.runstate import FINAL_STATUSES

RATE_LIMITS_EVERY = 2.0  # seconds between looks at the rate limiter while a run is driven


class Loop:
    """A run, driven: its context and the steps that act on it."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.incumbent = Incumbent(ctx)
        proposing, validation, outcome = Proposing(ctx), Validation(ctx), Outcome(ctx)
        search = PopulationSearch if ctx.policy.population is not None else LineageSearch
        self.search = search(ctx, self.incumbent, proposing, validation, outcome)
        self.run_end = RunEnd(ctx)
        self.stops = StopConditions(ctx)

    # What callers read of a run they drove (tests, benchmarks): its folder, state and git lineage.
    @property
    def run(self):
        return self.ctx.run

    @property
    def state(self):
        return self.ctx.state

    @property
    def manifest(self):
        return self.ctx.manifest

    @property
    def lineage(self):
        return self.ctx.lineage

    def drive(self) -> None:
        """Run until a stop condition."""
        ctx = self.ctx
        watching = threading.Event()  # set when the run stops being driven
        threading.Thread(target=self.watch_rate_limits, args=(watching,), name="rate-limits", daemon=True).start()
        try:
            self.measure_baseline()
            try:
                while True:
                    self.stops.check()
                    self.iterate(ctx.state.next_iteration)
            except StopRun:
                self.run_end.audit()  # in the run's own try: a kill during it is an interruption like any other
                raise
        except StopRun as stop:
            ctx.state.stop_reason = str(stop)
            ctx.state.status = "finished"
            ctx.save_state()
            ctx.run.log("stopped", reason=str(stop))
            ctx.events.emit(ev.Ended("stopped", str(stop), ctx.run.run_id))
            self.run_end.holdout()
        except ConfigurationError as exc:  # the meta-LLM refuses its settings: no retry or wait can fix it, said at once
            ctx.state.status, ctx.state.stop_reason = "interrupted", str(exc)
            ctx.save_state()
            ctx.run.log("interrupted", reason=str(exc))
            ctx.events.emit(ev.Ended("failed", str(exc), ctx.run.run_id))
            raise UsageError(
                f"{exc}; the run stopped (resume it with `evolver run --resume {ctx.run.run_id}` once the setting is fixed)"
            ) from None
        except ProviderError as exc:  # the meta-LLM stayed down through its retries: nothing is lost, resume later
            ctx.state.status, ctx.state.stop_reason = "paused", f"the meta-LLM failed: {exc}"
            ctx.save_state()
            ctx.run.log("paused", reason=str(exc))
            ctx.events.emit(ev.Ended("paused", str(exc), ctx.run.run_id))
        except KeyboardInterrupt:
            ctx.state.status = "interrupted"
            ctx.save_state()
            ctx.run.log("interrupted")
            ctx.events.emit(ev.Ended("interrupted", "", ctx.run.run_id))
            raise
        except BaseException as exc:  # the command reports it; the views only close
            ctx.events.emit(ev.Ended("failed", str(exc), ctx.run.run_id))
            raise
        finally:
            watching.set()

    def watch_rate_limits(self, stop: threading.Event, every: float = RATE_LIMITS_EVERY) -> None:
        """Every few seconds while the run is driven: the command's rate limiter, per provider endpoint and
        model, to the views and to the run directory (for `evolver status`)."""
        while not stop.wait(every):
            limiter = ratelimit.current()
            try:
                lanes = limiter.snapshot() if limiter is not None else {}
            except OSError:
                continue
            if lanes:
                self.ctx.run.save_rate_limits(lanes)
                self.ctx.events.emit(ev.RateLimits(lanes))

    def measure_baseline(self) -> None:
        self.search.baseline()

    def iterate(self, n: int) -> None:
        ctx = self.ctx
        record = ctx.run.iteration(n) or self.search.new_iteration(n)
        ctx.save(record)
        if record.status not in FINAL_STATUSES:
            self.search.run(record)
        self.search.finish(record)
