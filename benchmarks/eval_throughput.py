"""Throughput of `evolver eval` against tau2's own runner, with scripted LLMs at a fixed latency.

    python benchmarks/eval_throughput.py [--latencies 0.5,0.1] [--grids 32,128] [--concurrency 8,16]

For each setting it prints simulations per second for
  - evolver: `evolver.bench.evaluate` as the CLI runs it, worker start-up included;
  - tau2 direct: tau2's `run_tasks` with its own LLMAgent, in a fresh process,
    timed from after its imports (so tau2 is not charged for start-up);
  - the limit: total injected LLM time / concurrency, the best any runner can do;
and the ratios between them. Worker start-up is printed on its own line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ["create_task_1", "create_task_1_with_env_assertions", "update_task_1", "update_task_with_message_history",
         "update_task_with_initialization_data", "update_task_with_initialization_actions",
         "update_task_with_history_and_env_assertions", "impossible_task_1"]

TAU2_DIRECT = r"""
import json, sys, time
t0 = time.perf_counter()
from evolver.llm import register_providers
register_providers(["scripted/agent"])
import tau2.run
from tau2.run import load_tasks
tasks_ids, trials, conc = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tasks = [t for t in load_tasks("mock") if t.id in tasks_ids]
start = time.perf_counter()
res = tau2.run.run_tasks(domain="mock", tasks=tasks, agent="llm_agent", user="user_simulator",
    llm_agent="scripted/agent", llm_args_agent={}, llm_user="scripted/user", llm_args_user={},
    num_trials=trials, max_steps=30, save_to=None, console_display=False, max_concurrency=conc, seed=300, log_level="ERROR")
elapsed = time.perf_counter() - start
calls = sum(sum(1 for m in s.messages if m.role in ("assistant", "user")) - 1 for s in res.simulations)
print(json.dumps({"seconds": elapsed, "with_import": time.perf_counter() - t0, "sims": len(res.simulations), "calls": calls}))
"""


def run_evolver(trials: int, concurrency: int, repo: Path) -> dict:
    from evolver.bench import Zygote, evaluate
    from evolver.cli import build_request, new_run_id
    from evolver.config import load_config

    cfg = load_config(repo, {"agent_model": "scripted/agent", "user_model": "scripted/user", "judge_model": "scripted/judge",
                             "trials": trials, "concurrency": concurrency}, environ={})
    run_id = new_run_id("bench")
    out = repo / "runs" / run_id
    req = build_request(cfg, repo, out, TASKS)
    first_running = {}

    def progress(done: int, total: int) -> None:
        if total and "t" not in first_running:
            first_running["t"] = time.perf_counter()

    if Zygote._instance is not None:  # a cold start, as every `evolver eval` command has
        Zygote._instance.proc.kill()
        Zygote._instance.proc.wait()
        Zygote._instance = None
    start = time.perf_counter()
    result = evaluate(req, run_id, timeout=3600, on_progress=progress)
    elapsed = time.perf_counter() - start
    calls = 0
    for sim in result.simulations:
        data = json.loads((out / sim.trajectory_file).read_text())
        calls += sum(1 for m in data["messages"] if m["role"] in ("assistant", "user")) - 1
    return {"seconds": elapsed, "sims": len(result.simulations), "calls": calls,
            "startup": first_running.get("t", start) - start, "infra": result.summary.infra_errors}


def run_tau2(trials: int, concurrency: int) -> dict:
    out = subprocess.run([sys.executable, "-c", TAU2_DIRECT, json.dumps(TASKS), str(trials), str(concurrency)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latencies", default="0.5,0.1")
    parser.add_argument("--grids", default="32,128", help="simulations per grid (multiples of 8 tasks)")
    parser.add_argument("--concurrency", default="8,16")
    args = parser.parse_args()
    os.environ.setdefault("EVOLVER_SCRIPT", "evolver.scripted:mock_script")
    from evolver.scaffold import init_repo

    repo = Path(tempfile.mkdtemp(prefix="evolver-bench-"))
    init_repo(repo)
    print("evolver: cold start included. tau2: timed after its imports (tau2+imp: including them).")
    print(f"{'latency':>7} {'sims':>5} {'conc':>4} | {'evolver/s':>9} {'tau2/s':>7} {'tau2+imp/s':>10} {'limit/s':>7} | "
          f"{'evo/tau2':>8} {'evo/tau2+imp':>12} {'evo/lim':>7} {'tau2/lim':>8} | {'startup s':>9}")
    for latency in [float(x) for x in args.latencies.split(",")]:
        os.environ["EVOLVER_SCRIPTED_LATENCY"] = str(latency)
        for grid in [int(x) for x in args.grids.split(",")]:
            for conc in [int(x) for x in args.concurrency.split(",")]:
                trials = grid // len(TASKS)
                evo = run_evolver(trials, conc, repo)
                tau = run_tau2(trials, conc)
                # The limit: every LLM call's injected latency, spread over `conc` parallel slots.
                limit_seconds = evo["calls"] * latency / conc
                evo_rate, tau_rate, lim_rate = evo["sims"] / evo["seconds"], tau["sims"] / tau["seconds"], evo["sims"] / limit_seconds
                tau_imp = tau["sims"] / tau["with_import"]
                print(f"{latency:>7.1f} {grid:>5} {conc:>4} | {evo_rate:>9.2f} {tau_rate:>7.2f} {tau_imp:>10.2f} {lim_rate:>7.2f} | "
                      f"{evo_rate / tau_rate:>8.2f} {evo_rate / tau_imp:>12.2f} {evo_rate / lim_rate:>7.2f} {tau_rate / lim_rate:>8.2f} | {evo['startup']:>9.1f}", flush=True)
                assert evo["infra"] == 0, "infrastructure errors in the benchmark"


if __name__ == "__main__":
    main()
