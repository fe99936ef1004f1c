"""Wall-clock of one iteration with K candidates evaluated at once, against K = 1.

    python benchmarks/parallel_candidates.py [--ks 1,2,4] [--gates short,default] [--latency 0.5] [--concurrency 8]

Each K gets a fresh run on the 48-task test domain (tests/scripts/gen_domain.py)
with scripted LLMs at a fixed latency per call. The scripted meta-LLM answers
"proposal i of K" with a patch of its own (its own line in the agent's
instruction, plus the rule that makes the scripted agent better), so all K
candidates are distinct, none is stopped early, and each runs the whole gate at
the same concurrency per candidate: a smoke test, then with K > 1 a screen of 2
trials per task for every candidate (gate version 2's select-then-confirm,
docs/gate.md), then the stages for the best one (for K = 1, the one) beside the
incumbent's runs. Two gates:

  short    one stage of 1 trial on the 40 gate tasks (--gate-stages 1): the
           screen weighs most here
  default  the tuned stages, 1, 2, 3, 4 and 6 trials per task: what a run uses

The baseline is measured first and not timed. Goal (issue #14): K = 4 within
1.3x the time of K = 1 when the machine allows K x concurrency simulations at once.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


GATES = {"short": ["1"], "default": []}  # [] is the tuned default (evolver.evolution.gate)


def one_iteration(k: int, concurrency: int, stages: list[str]) -> tuple[float, list[str]]:
    from rich.console import Console

    from evolver.cli.scaffold import init_repo
    from evolver.cli.start import new_run, start_run
    from evolver.config_load import load_config
    from evolver.evaluation.backends.local import LocalBackend

    repo = Path(tempfile.mkdtemp(prefix=f"evolver-k{k}-"))
    init_repo(repo)
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    cfg = load_config(
        repo,
        {
            "agent_model": "scripted/agent",
            "user_model": "scripted/user",
            "judge_model": "scripted/judge",
            "meta_model": "scripted/meta",
            "domain": "evolver_gen",
            "plugins": ["tests.scripts.gen_domain"],
            "iterations": 1,
            "candidates": k,
            "concurrency": concurrency,
            "gate_stages": stages,
            "holdout": "off",
        },
        environ={},
    )
    with LocalBackend() as backend:
        console = Console(stderr=True, quiet=True)
        loop = start_run(new_run(repo, cfg, f"run-k{k}", backend, allow_dirty=False, dry_run=False, console=console), cfg, backend, console)
        loop.measure_baseline()
        start = time.perf_counter()
        loop.iterate(1)
        wall = time.perf_counter() - start
    return wall, [c.status for c in loop.run.iteration(1).candidates]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", default="1,2,4")
    parser.add_argument("--gates", default="short,default", help="which gates: short and/or default")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per scripted LLM call")
    parser.add_argument("--concurrency", type=int, default=8, help="simulations at once per candidate")
    args = parser.parse_args()
    os.environ["EVOLVER_SCRIPT"] = "tests.scripts.loop_cases:distinct_candidates_script"
    os.environ["EVOLVER_SCRIPTED_LATENCY"] = str(args.latency)
    os.environ["PYTHONPATH"] = str(ROOT)
    os.environ["EVOLVER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="evrt-parallel-")  # the benchmark's own daemon
    from evolver.evaluation import zygote_client

    gates = args.gates.split(",")
    if not set(gates) <= set(GATES):
        parser.error(f"--gates: choose from {', '.join(GATES)}")
    print(
        f"one iteration, {args.latency:g} s per LLM call, {args.concurrency} simulations at once per candidate, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; 40 gate tasks"
    )
    print(f"{'gate':>8} {'K':>2} {'wall s':>7} {'x K=1':>6}  candidates")
    try:
        for gate in gates:
            base = None
            for k in [int(x) for x in args.ks.split(",")]:
                wall, statuses = one_iteration(k, args.concurrency, GATES[gate])
                base = base or wall
                print(f"{gate:>8} {k:>2} {wall:>7.1f} {wall / base:>6.2f}  {', '.join(statuses)}", flush=True)
    finally:
        zygote_client.stop_all()


if __name__ == "__main__":
    main()
