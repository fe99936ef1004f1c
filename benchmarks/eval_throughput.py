"""Throughput of `evolver eval` against tau2's own runner, with scripted LLMs at a fixed latency.

    python benchmarks/eval_throughput.py [--latencies 0.5,0.1] [--grids 32,128] [--concurrency 8,16] [--ray | --ray-only]
    python benchmarks/eval_throughput.py --turns-only [--latencies 0.1,0] [--grids 32] [--concurrency 8]

For each setting it prints simulations per second for
  - evolver: the `evolver eval` command in a fresh process, timed from launch to
    exit (CLI start-up, worker start-up and writing results included); "warm"
    when its worker daemon (evolver.evaluation.zygote) is already running, as it is for
    every command after the first within EVOLVER_ZYGOTE_IDLE; "cold" when the
    command has to start the daemon, importing tau2 and litellm;
  - tau2 direct: tau2's `run_tasks` with its own LLMAgent, in a fresh process,
    timed from after its imports and one warm-up completion (so tau2 is not
    charged for start-up, nor for litellm's imports at its first call);
  - the limit: total injected LLM time / concurrency, the best any runner can do;
and the ratios between them. Start-up (launch to the first simulation
running) is printed in its own columns, warm and cold. Warm and tau2 show the
median of --repeats runs, run alternately (the last column: warm/tau2 of each
alternated pair, lowest-highest); cold is one run per setting. evolver runs with its
sandbox on: every simulation's agent in its own confined process.

With --ray (or --ray-only, which skips the columns above) it adds the Ray
backend: the same evaluation through `RayBackend.evaluate` on a local Ray
instance started once for the benchmark, against `LocalBackend.evaluate` with
its daemon warm, both called in this process (median of --repeats each, run
alternately); "ray/local" is the ratio of their rates. The Ray instance's own
start (ray.init, then the first evaluation, which starts the zygote on the
node) is printed once.

"cpu ms/sim" is the CPU this machine spent per simulation (user and system
time of every process, from /proc/stat, idle and steal left out) in the median
warm run and the median tau2 run, each including its own process's start: on
a shared machine whose speed drifts it moves less than the rates do.

With --turns-only it measures what recording the model's view of every turn costs
(evolver.evaluation.turnlog): the same evaluation through `LocalBackend.evaluate` with the
recording on and off, alternated (--repeats each, the order switched every pair, so that a
change of load hits both), as seconds and CPU milliseconds per simulation, and the bytes each
simulation's view takes on disk beside its trajectory.

First it measures the sandbox's own cost: milliseconds per agent turn through
the agent process (channel, LLM request relayed through the trusted side,
reply validated) against the same agent called in-process, with an instant
scripted LLM; and milliseconds to start one agent process (fork, confine,
import the candidate, initial state).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = [
    "create_task_1",
    "create_task_1_with_env_assertions",
    "update_task_1",
    "update_task_with_message_history",
    "update_task_with_initialization_data",
    "update_task_with_initialization_actions",
    "update_task_with_history_and_env_assertions",
    "impossible_task_1",
]

TAU2_DIRECT = r"""
import json, sys, time
t0 = time.perf_counter()
from evolver.local.providers import register_providers
register_providers(["scripted/agent"])
import tau2.run
from tau2.run import load_tasks
tasks_ids, trials, conc = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tasks = [t for t in load_tasks("mock") if t.id in tasks_ids]
# One completion first: litellm imports ~280 modules at its first call (0.6 s of CPU), which evolver's
# daemon has done before it forks; tau2 is timed without it too.
from tau2.data_model.message import UserMessage
from tau2.utils.llm_utils import generate
generate(model="scripted/user", messages=[UserMessage(role="user", content="warm")])
start = time.perf_counter()
res = tau2.run.run_tasks(domain="mock", tasks=tasks, agent="llm_agent", user="user_simulator",
    llm_agent="scripted/agent", llm_args_agent={}, llm_user="scripted/user", llm_args_user={},
    num_trials=trials, max_steps=30, save_to=None, console_display=False, max_concurrency=conc, seed=300, log_level="ERROR")
elapsed = time.perf_counter() - start
calls = sum(sum(1 for m in s.messages if m.role in ("assistant", "user")) - 1 for s in res.simulations)
print(json.dumps({"seconds": elapsed, "with_import": time.perf_counter() - t0, "sims": len(res.simulations), "calls": calls}))
"""


def run_evolver(trials: int, concurrency: int, repo: Path, cold: bool) -> dict:
    """`evolver eval` as a user runs it: the CLI in a fresh process, timed from launch to exit.
    Cold: no worker daemon is running, so this command starts one (tau2 and litellm imported)."""
    from evolver.evaluation import zygote_client

    if cold:
        zygote_client.stop_all()
        while zygote_client.running() or list(zygote_client.runtime_dir().glob("*.sock")):
            time.sleep(0.05)
    cmd = [
        sys.executable,
        "-m",
        "evolver",
        "eval",
        str(repo),
        "--json",
        "--task-ids",
        ",".join(TASKS),
        "--trials",
        str(trials),
        "--concurrency",
        str(concurrency),
        "--agent-model",
        "scripted/agent",
        "--user-model",
        "scripted/user",
        "--judge-model",
        "scripted/judge",
    ]
    launched = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    elapsed = time.time() - launched
    result_file = Path(json.loads(proc.stdout)["result_file"])
    result = json.loads(result_file.read_text())
    calls = 0
    for sim in result["simulations"]:
        data = json.loads((result_file.parent / sim["trajectory_file"]).read_text())
        calls += sum(1 for m in data["messages"] if m["role"] in ("assistant", "user")) - 1
    running_at = min(json.loads(p.read_text())["running_at"] for p in result_file.parent.glob("status-*.json"))
    return {
        "seconds": elapsed,
        "sims": len(result["simulations"]),
        "calls": calls,
        "startup": running_at - launched,
        "infra": result["summary"]["infra_errors"],
    }


def run_tau2(trials: int, concurrency: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", TAU2_DIRECT, json.dumps(TASKS), str(trials), str(concurrency)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def proxy_overhead(repo: Path, turns: int, starts: int) -> dict:
    """Per-turn and start-up cost of the sandboxed agent process, against the agent in-process."""
    import shutil

    import litellm
    from tau2.data_model.message import UserMessage
    from tau2.domains.mock.environment import get_environment

    from evolver.data import RoleModel
    from evolver.evaluation import proxy_agent, zygote_client
    from evolver.evaluation.worker.candidate import stage_candidate
    from evolver.llm import retrying
    from evolver.local.providers import register_providers

    os.environ["EVOLVER_SCRIPTED_LATENCY"] = "0"
    register_providers(["scripted/agent"])
    staging = Path(tempfile.mkdtemp(prefix="evolver-proxy-"))
    source = stage_candidate(repo, staging)
    factory = zygote_client.WorkerConnection(zygote_client.connect().sock.detach())
    proxy_agent.settings = proxy_agent.Settings(
        role=RoleModel(model="scripted/agent"),
        source=source,
        scratch_root=staging,
        sandbox=True,
        limits={"memory_mb": 1024},
        turn_timeout=60,
        completion=retrying(litellm.completion, 1, "agent"),
        factory=factory,
    )
    env = get_environment()
    tools, policy = env.get_tools(), env.get_policy()
    message = UserMessage(role="user", content="Hi, please mark task_1 as completed.")

    def per_turn(agent) -> float:
        state = agent.get_init_state()
        start = time.perf_counter()
        for _ in range(turns):
            agent.generate_next_message(message, state)
        return (time.perf_counter() - start) / turns * 1000

    proxied = proxy_agent.ProxyAgent(tools=tools, domain_policy=policy)
    proxy_ms = per_turn(proxied)
    proxied.stop()
    sys.path.insert(0, str(source))
    from agent.agent import HarnessAgent

    direct_ms = per_turn(HarnessAgent(tools=tools, domain_policy=policy, llm="scripted/agent", llm_args={}))
    start = time.perf_counter()
    for _ in range(starts):
        agent = proxy_agent.ProxyAgent(tools=tools, domain_policy=policy)
        agent.get_init_state()
        agent.stop()
    start_ms = (time.perf_counter() - start) / starts * 1000
    shutil.rmtree(staging, ignore_errors=True)
    return {"proxy_ms": proxy_ms, "direct_ms": direct_ms, "start_ms": start_ms}


def run_backend(backend, trials: int, concurrency: int, repo: Path, tasks: list[str] = TASKS, record_turns: bool = True) -> dict:
    """One evaluation through a backend object in this process, timed around evaluate(); with the bytes its
    trajectories and turn views took on disk."""
    from evolver.config_load import load_config
    from evolver.config_requests import eval_request

    cfg = load_config(repo, {"agent_model": "scripted/agent", "user_model": "scripted/user", "judge_model": "scripted/judge"})
    out = Path(tempfile.mkdtemp(prefix="evolver-bench-out-"))
    req = eval_request(cfg, repo, out, local_api_base=None, task_ids=tasks, trials=trials, concurrency=concurrency)
    req = req.model_copy(update={"record_turns": record_turns})
    start = time.perf_counter()
    result = backend.evaluate(req, "bench", timeout=3600)
    seconds = time.perf_counter() - start
    sizes = {folder: sum(p.stat().st_size for p in (out / folder).glob("*")) for folder in ("trajectories", "turns")}
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": seconds, "sims": len(result.simulations), "infra": result.summary.infra_errors, **sizes}


def turns_cost(args) -> None:
    """--turns-only: evaluations with the model's view recorded and without, alternated."""
    from evolver.cli.scaffold import init_repo
    from evolver.evaluation import zygote_client
    from evolver.evaluation.backends.local import LocalBackend

    os.environ.setdefault("EVOLVER_SCRIPT", "evolver.scripted:mock_script")
    os.environ["EVOLVER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="evrt-bench-")
    repo = Path(tempfile.mkdtemp(prefix="evolver-bench-"))
    init_repo(repo)
    print(
        f"{'latency':>7} {'sims':>5} {'conc':>4} | {'s/sim on':>8} {'off':>7} {'on/off':>6} {'each pair':>11} | "
        f"{'cpu ms/sim on':>13} {'off':>5} | {'view bytes/sim':>14} {'trajectory':>10}"
    )
    try:
        for latency in [float(x) for x in args.latencies.split(",")]:
            os.environ["EVOLVER_SCRIPTED_LATENCY"] = str(latency)  # before the backend starts: its workers inherit it
            backend = LocalBackend()
            try:
                for grid in [int(x) for x in args.grids.split(",")]:
                    for conc in [int(x) for x in args.concurrency.split(",")]:
                        trials = grid // len(TASKS)
                        run_backend(backend, 1, conc, repo)  # the daemon warm before either side is timed
                        pairs = []
                        for i in range(args.repeats):
                            order = (True, False) if i % 2 == 0 else (False, True)
                            runs = {
                                record: with_cpu(lambda record=record: run_backend(backend, trials, conc, repo, record_turns=record))
                                for record in order
                            }
                            pairs.append((runs[True], runs[False]))
                        on, off = median([a for a, _ in pairs]), median([b for _, b in pairs])
                        assert on["infra"] == off["infra"] == 0, "infrastructure errors in the benchmark"
                        per = lambda r: r["seconds"] / r["sims"]  # noqa: E731
                        ratios = sorted(per(a) / per(b) for a, b in pairs)
                        print(
                            f"{latency:>7.2f} {grid:>5} {conc:>4} | {per(on):>8.3f} {per(off):>7.3f} {per(on) / per(off):>6.3f} "
                            f"{ratios[0]:>5.2f}-{ratios[-1]:<5.2f} | {on['cpu_ms']:>13.0f} {off['cpu_ms']:>5.0f} | "
                            f"{on['turns'] / on['sims']:>14,.0f} {on['trajectories'] / on['sims']:>10,.0f}",
                            flush=True,
                        )
            finally:
                backend.close()
    finally:
        zygote_client.stop_all()


def start_ray(repo: Path):
    """A RayBackend on a local instance, its start-up timed: ray.init, then a first one-simulation
    evaluation (the node's zygote starts and imports tau2)."""
    from evolver.evaluation.backends.ray import RayBackend

    start = time.perf_counter()
    backend = RayBackend("")
    init = time.perf_counter() - start
    first = run_backend(backend, 1, 1, repo, TASKS[:1])["seconds"]
    print(
        f"ray: local instance started in {init:.1f} s; first evaluation (1 simulation, the node's zygote starting) {first:.1f} s",
        flush=True,
    )
    return backend


def compare_backends(ray_backend, local_backend, trials: int, concurrency: int, repeats: int, repo: Path) -> tuple[dict, dict]:
    """Median runs of the local and the Ray backend, alternated so that a change of load hits both."""
    local_runs, ray_runs = [], []
    for _ in range(repeats):
        local_runs.append(run_backend(local_backend, trials, concurrency, repo))
        ray_runs.append(run_backend(ray_backend, trials, concurrency, repo))
    local, ray = median(local_runs), median(ray_runs)
    assert local["infra"] == ray["infra"] == 0, "infrastructure errors in the benchmark"
    return local, ray


def busy_jiffies() -> int:
    """CPU time spent on this machine so far (user, nice, system, irq, softirq), in jiffies."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    return fields[0] + fields[1] + fields[2] + fields[5] + fields[6]


def with_cpu(run) -> dict:
    """``run()``'s result with the CPU it cost per simulation, in ms."""
    start = busy_jiffies()
    result = run()
    result["cpu_ms"] = (busy_jiffies() - start) * 1000 / os.sysconf("SC_CLK_TCK") / result["sims"]
    return result


def median(runs: list[dict]) -> dict:
    """The run with the median time: a shared 2-core machine is noisy."""
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latencies", default="0.5,0.1")
    parser.add_argument("--grids", default="32,128", help="simulations per grid (multiples of 8 tasks)")
    parser.add_argument("--concurrency", default="8,16")
    parser.add_argument("--repeats", type=int, default=5, help="warm and tau2 runs per setting; the median is shown (cold: one)")
    parser.add_argument("--proxy-turns", type=int, default=300, help="agent turns timed for the sandbox's per-turn cost (0: skip)")
    parser.add_argument("--ray", action="store_true", help="add the Ray backend on a local instance against the local backend")
    parser.add_argument("--ray-only", action="store_true", help="only that comparison")
    parser.add_argument("--turns-only", action="store_true", help="only the cost of recording the model's view of every turn")
    args = parser.parse_args()
    if args.ray_only:
        return main_ray(args)
    if args.turns_only:
        return turns_cost(args)
    os.environ.setdefault("EVOLVER_SCRIPT", "evolver.scripted:mock_script")
    os.environ["EVOLVER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="evrt-bench-")  # the benchmark's own daemon
    from evolver.cli.scaffold import init_repo
    from evolver.evaluation import zygote_client

    repo = Path(tempfile.mkdtemp(prefix="evolver-bench-"))
    init_repo(repo)
    if args.proxy_turns:
        cost = proxy_overhead(repo, args.proxy_turns, starts=30)
        print(
            f"sandbox cost: {cost['proxy_ms']:.2f} ms per agent turn through the agent process vs {cost['direct_ms']:.2f} ms "
            f"in-process (overhead {cost['proxy_ms'] - cost['direct_ms']:.2f} ms per turn, instant LLM); "
            f"{cost['start_ms']:.1f} ms to start and confine one agent process",
            flush=True,
        )
    print(
        "evolver: `evolver eval` CLI, launch to exit; warm: its worker daemon already running, cold: started by "
        "the command. tau2: timed after its imports (tau2+imp: including them)."
    )
    print(
        f"{'latency':>7} {'sims':>5} {'conc':>4} | {'warm/s':>7} {'cold/s':>7} {'tau2/s':>7} {'tau2+imp/s':>10} {'limit/s':>7} | "
        f"{'warm/tau2':>9} {'cold/tau2':>9} {'cold/tau2+imp':>13} {'warm/lim':>8} {'tau2/lim':>8} | {'start warm':>10} {'cold':>5}"
        f" | cpu ms/sim warm tau2 | warm/tau2 of each pair" + (f" | {'local/s':>7} {'ray/s':>7} {'ray/local':>9}" if args.ray else "")
    )
    ray_backend = local_backend = None
    try:
        for latency in [float(x) for x in args.latencies.split(",")]:
            os.environ["EVOLVER_SCRIPTED_LATENCY"] = str(latency)
            for grid in [int(x) for x in args.grids.split(",")]:
                for conc in [int(x) for x in args.concurrency.split(",")]:
                    trials = grid // len(TASKS)
                    cold = run_evolver(trials, conc, repo, cold=True)
                    # Alternated, so that the machine's drift (a shared VM) weighs on both sides alike.
                    pairs = [
                        (with_cpu(lambda: run_evolver(trials, conc, repo, cold=False)), with_cpu(lambda: run_tau2(trials, conc)))
                        for _ in range(args.repeats)
                    ]
                    warm, tau = median([w for w, _ in pairs]), median([t for _, t in pairs])
                    spread = sorted((w["sims"] / w["seconds"]) / (t["sims"] / t["seconds"]) for w, t in pairs)
                    # The limit: every LLM call's injected latency, spread over `conc` parallel slots.
                    limit_seconds = warm["calls"] * latency / conc
                    warm_rate, cold_rate = warm["sims"] / warm["seconds"], cold["sims"] / cold["seconds"]
                    tau_rate, tau_imp = tau["sims"] / tau["seconds"], tau["sims"] / tau["with_import"]
                    lim_rate = warm["sims"] / limit_seconds
                    row = (
                        f"{latency:>7.1f} {grid:>5} {conc:>4} | {warm_rate:>7.2f} {cold_rate:>7.2f} {tau_rate:>7.2f} {tau_imp:>10.2f} {lim_rate:>7.2f} | "
                        f"{warm_rate / tau_rate:>9.2f} {cold_rate / tau_rate:>9.2f} {cold_rate / tau_imp:>13.2f} {warm_rate / lim_rate:>8.2f} "
                        f"{tau_rate / lim_rate:>8.2f} | {warm['startup']:>9.2f}s {cold['startup']:>4.1f}s | {warm['cpu_ms']:>5.0f} {tau['cpu_ms']:>5.0f}"
                        f" | {spread[0]:.2f}-{spread[-1]:.2f}"
                    )
                    assert warm["infra"] == cold["infra"] == 0, "infrastructure errors in the benchmark"
                    if args.ray:
                        if ray_backend is None:  # for each latency: its workers get the environment it starts with
                            from evolver.evaluation.backends.local import LocalBackend

                            ray_backend, local_backend = start_ray(repo), LocalBackend()
                        local, ray = compare_backends(ray_backend, local_backend, trials, conc, args.repeats, repo)
                        local_rate, ray_rate = local["sims"] / local["seconds"], ray["sims"] / ray["seconds"]
                        row += f" | {local_rate:>7.2f} {ray_rate:>7.2f} {ray_rate / local_rate:>9.2f}"
                    print(row, flush=True)
            close(ray_backend, local_backend)
            ray_backend = local_backend = None
    finally:
        close(ray_backend, local_backend)
        zygote_client.stop_all()


def close(*backends) -> None:
    for backend in backends:
        if backend is not None:
            backend.close()


def main_ray(args) -> None:
    """--ray-only: the Ray backend on a local instance against the local backend, nothing else."""
    os.environ.setdefault("EVOLVER_SCRIPT", "evolver.scripted:mock_script")
    os.environ["EVOLVER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="evrt-bench-")
    from evolver.cli.scaffold import init_repo
    from evolver.evaluation import zygote_client
    from evolver.evaluation.backends.local import LocalBackend

    repo = Path(tempfile.mkdtemp(prefix="evolver-bench-"))
    init_repo(repo)
    print(f"{'latency':>7} {'sims':>5} {'conc':>4} | {'local/s':>7} {'ray/s':>7} {'ray/local':>9} | {'local s':>7} {'ray s':>6}")
    ray_backend = local_backend = None
    try:
        for latency in [float(x) for x in args.latencies.split(",")]:
            # Set before the backends start: the Ray backend sends its workers the environment it starts with.
            os.environ["EVOLVER_SCRIPTED_LATENCY"] = str(latency)
            ray_backend, local_backend = start_ray(repo), LocalBackend()
            for grid in [int(x) for x in args.grids.split(",")]:
                for conc in [int(x) for x in args.concurrency.split(",")]:
                    local, ray = compare_backends(ray_backend, local_backend, grid // len(TASKS), conc, args.repeats, repo)
                    local_rate, ray_rate = local["sims"] / local["seconds"], ray["sims"] / ray["seconds"]
                    print(
                        f"{latency:>7.1f} {grid:>5} {conc:>4} | {local_rate:>7.2f} {ray_rate:>7.2f} {ray_rate / local_rate:>9.2f} | "
                        f"{local['seconds']:>6.1f}s {ray['seconds']:>5.1f}s",
                        flush=True,
                    )
            close(ray_backend, local_backend)
            ray_backend = local_backend = None
    finally:
        close(ray_backend, local_backend)
        zygote_client.stop_all()


if __name__ == "__main__":
    main()
