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

Its parts: warmup (imported and run once, in the zygote), tasks (which tasks, the domain's identifiers),
candidate (the agent/ copy, checked), recorder (each simulation's outcome, written), stop (early ends);
this module runs them in order.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from evolver.data import EvalRequest
from evolver.evaluation.worker.candidate import check_candidate, stage_candidate
from evolver.evaluation.worker.recorder import Recorder
from evolver.evaluation.worker.stop import EXIT_ORPHANED, EXIT_USAGE, Stop
from evolver.evaluation.worker.tasks import available_splits, domain_identifiers, resolve_tasks
from evolver.evaluation.worker.warmup import preload
from evolver.llm import missing_key_line, token_counts
from evolver.local.providers import register_providers
from evolver.store.evaldir import EvalDir

AGENT_NAME = "evolver_harness"
PREFORK = 8  # agent processes a worker starts ahead of its simulations, at most (each holds ~15 MB)


def _status(req: EvalRequest, state: str, **extra) -> None:
    EvalDir(req.out_dir).write_status(req.shard, state, **extra)


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
            role=req.agent,
            source=stage_candidate(Path(req.checkout), staging),
            scratch_root=staging,
            sandbox=req.sandbox,
            limits={"memory_mb": req.agent_memory_mb},
            turn_timeout=req.agent_timeout,
            completion=recording(retrying(litellm.completion, req.llm_retries, "agent")),
            factory=WorkerConnection.from_environment(),
            max_steps=req.max_steps,
            names=req.agent.agent_names(),
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
    proxy_agent.pool = proxy_agent.AgentPool(
        proxy_agent.settings, lambda: min(req.concurrency, PREFORK, recorder.waiting()), ready=(checked,)
    )
    grid = dict(
        domain=req.domain,
        agent=AGENT_NAME,
        user="user_simulator",
        llm_agent=req.agent.model,
        llm_args_agent=req.agent.litellm_args(),
        llm_user=req.user.model,
        llm_args_user=req.user.litellm_args(),
        num_trials=req.trials,
        max_steps=req.max_steps,
        max_errors=req.max_errors,
        save_to=None,
        console_display=False,
        max_concurrency=req.concurrency,
        seed=req.seed,
        log_level="ERROR",
    )
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
        _status(req, stop.state, message=stop.message, tasks=tasks, **({"isolation": stop.isolation} if stop.isolation else {}))
        return stop.code
    return 0
