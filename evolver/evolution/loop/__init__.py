"""The evolution loop: one iteration = K candidates from the same parent, at most one kept.

    measure the baseline -> repeat: digest -> propose K (at once) -> validate -> commit
    -> smoke -> staged gate over the K -> keep one or none -> (end) holdout and report

Every step writes its result to the run directory before the next starts, and
every step first looks there for its own result, so a run killed at any point
resumes where it stopped without redoing finished simulations or duplicating
candidates.

Loop is the orchestration: drive() runs the run, iterate() one iteration. Each part of them is a
module of this package, whose class Loop takes in: incumbent (the baseline, the analysis results,
the gate reference), proposing, validation (commit, refuse the inert, smoke test), gating,
outcome (the iteration recorded), run_end (audit and holdout), stops (the stop conditions),
measuring (every evaluation) and bookkeeping (the files saved, usage, the step shown).
"""

from __future__ import annotations

import dataclasses
import string
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from evolver import events as ev
from evolver import ratelimit
from evolver.config import Config
from evolver.errors import UsageError
from evolver.evaluation.backends import Backend
from evolver.evolution.gate import search
from evolver.evolution.loop.bookkeeping import Bookkeeping, count
from evolver.evolution.loop.gating import Gating
from evolver.evolution.loop.incumbent import Incumbent
from evolver.evolution.loop.measuring import Measuring
from evolver.evolution.loop.outcome import Outcome
from evolver.evolution.loop.proposing import Proposing
from evolver.evolution.loop.run_end import RunEnd
from evolver.evolution.loop.stops import StopConditions, StopRun
from evolver.evolution.loop.validation import Validation
from evolver.evolution.proposers import Proposer
from evolver.llm import ConfigurationError, ProviderError
from evolver.store.lineage import Lineage
from evolver.store.runstate import FINAL_STATUSES, CandidateRecord, IterationRecord, Manifest, RunState
from evolver.store.rundir import RunDir

RATE_LIMITS_EVERY = 2.0  # seconds between looks at the rate limiter while a run is driven


@dataclasses.dataclass
class Loop(Incumbent, Proposing, Validation, Gating, Outcome, RunEnd, StopConditions, Measuring, Bookkeeping):
    run: RunDir
    manifest: Manifest
    state: RunState
    cfg: Config
    policy: search.Policy  # what the run's gate bounds: each decision, or the run through an audit (gate.search)
    lineage: Lineage
    prompts_dir: Path
    guide: str
    events: ev.Events
    identifiers: frozenset = frozenset()  # the domain's task-data identifiers, for the static scan
    proposer: Optional[Proposer] = None  # evolver.evolution.proposers, as the run's settings choose
    backend: Optional[Backend] = None  # where simulations run; set by the command that drives the loop
    local_api_base: Optional[str] = None  # the embedded model's server, when the command serves one: given to drive()
    started: float = dataclasses.field(default_factory=time.monotonic)
    saving: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # candidates' threads share the iteration file

    def drive(self, local_api_base: Optional[str] = None) -> None:
        """Run until a stop condition; ``local_api_base`` is the embedded server the command started, if any."""
        self.local_api_base = local_api_base
        watching = threading.Event()  # set when the run stops being driven
        threading.Thread(target=self.watch_rate_limits, args=(watching,), name="rate-limits", daemon=True).start()
        try:
            self.measure_baseline()
            try:
                while True:
                    self.check_stop()
                    self.refresh_stale_reference()
                    self.iterate(self.state.next_iteration)
            except StopRun:
                self.audit()  # in the run's own try: a kill during it is an interruption like any other
                raise
        except StopRun as stop:
            self.state.stop_reason = str(stop)
            self.state.status = "finished"
            self.save_state()
            self.run.log("stopped", reason=str(stop))
            self.events.emit(ev.Ended("stopped", str(stop), self.run.run_id))
            self.holdout()
        except ConfigurationError as exc:  # the meta-LLM refuses its settings: no retry or wait can fix it, said at once
            self.state.status, self.state.stop_reason = "interrupted", str(exc)
            self.save_state()
            self.run.log("interrupted", reason=str(exc))
            self.events.emit(ev.Ended("failed", str(exc), self.run.run_id))
            raise UsageError(f"{exc}; the run stopped (resume it with `evolver run --resume {self.run.run_id}` once the setting is fixed)") from None
        except ProviderError as exc:  # the meta-LLM stayed down through its retries: nothing is lost, resume later
            self.state.status, self.state.stop_reason = "paused", f"the meta-LLM failed: {exc}"
            self.save_state()
            self.run.log("paused", reason=str(exc))
            self.events.emit(ev.Ended("paused", str(exc), self.run.run_id))
        except KeyboardInterrupt:
            self.state.status = "interrupted"
            self.save_state()
            self.run.log("interrupted")
            self.events.emit(ev.Ended("interrupted", "", self.run.run_id))
            raise
        except BaseException as exc:  # the command reports it; the views only close
            self.events.emit(ev.Ended("failed", str(exc), self.run.run_id))
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
                self.run.save_rate_limits(lanes)
                self.events.emit(ev.RateLimits(lanes))

    def iterate(self, n: int) -> None:
        record = self.run.iteration(n) or self.new_iteration(n)
        self.save(record)
        if record.status not in FINAL_STATUSES:
            self.step(f"iteration {n}: proposing {count(record.candidates, 'candidate')}")
            analysis = self.analysis_result()  # once, before the proposals are drawn at once: they share it
            self.each(record, "proposing", lambda r, c: self.propose(r, c, analysis))
            self.each(record, "evaluating", self.prepare)
            self.gate_candidates(record)
            self.conclude(record)
        self.finish_iteration(record)

    def new_iteration(self, n: int) -> IterationRecord:
        k = self.cfg.candidates
        labels = [str(n)] if k == 1 else [f"{n}{letter}" for letter in string.ascii_lowercase[:k]]
        return IterationRecord(iteration=n, parent=self.state.incumbent, parent_commit=self.state.incumbent_commit,
                               generation=self.state.generation, candidates=[CandidateRecord(label=label) for label in labels])

    def each(self, record: IterationRecord, status: str, step: Callable[[IterationRecord, CandidateRecord], None]) -> None:
        """Run one step for every candidate at ``status``, all at once (each in its own worktree)."""
        self.concurrently(lambda c: step(record, c), [c for c in record.candidates if c.status == status])
