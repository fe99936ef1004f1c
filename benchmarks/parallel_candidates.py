"""Wall-clock of one iteration with K candidates evaluated at once, against K = 1.

    python benchmarks/parallel_candidates.py [--ks 1,2,4] [--setups population,default,short] [--latency 0.5] [--concurrency 8]

Each K gets a fresh run on the 48-task test domain (tests/scripts/gen_domain.py)
with scripted LLMs at a fixed latency per call and the one-shot proposer. The
scripted meta-LLM answers "proposal i of K" with a patch of its own (its own
line in the agent's instruction, plus the rule that makes the scripted agent
better), so all K candidates are distinct and each is better than its parent.
Three set-ups:

  population  the default gate policy: the parent's minibatch of analysis tasks,
              then the K children, each screened on it beside the parent at once;
              each that passes runs the gate tasks in two parts and joins the pool
  default     the per-decision policy with its tuned stages (1, 2, 3, 4 and 6
              trials per task): with K > 1 every candidate's screen of 2 trials
              per task at once, then the stages for the best one beside the
              incumbent's runs (docs/gate.md)
  short       the per-decision policy with one stage of 1 trial (--gate-stages 1):
              the screen weighs most here

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


# set-up -> (gate policy, gate stages); [] is the tuned default (evolver.evolution.gate)
SETUPS = {"population": ("population", []), "default": ("per-decision", []), "short": ("per-decision", ["1"])}


def one_iteration(k: int, concurrency: int, policy: str, stages: list[str]) -> tuple[float, list[str]]:
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
            "gate_policy": policy,
            "gate_stages": stages,
            "proposer": "oneshot",
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
    parser.add_argument("--setups", default="population,default,short", help=f"which of: {', '.join(SETUPS)}")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per scripted LLM call")
    parser.add_argument("--concurrency", type=int, default=8, help="simulations at once per candidate")
    args = parser.parse_args()
    os.environ["EVOLVER_SCRIPT"] = "tests.scripts.loop_cases:distinct_candidates_script"
    os.environ["EVOLVER_SCRIPTED_LATENCY"] = str(args.latency)
    os.environ["PYTHONPATH"] = str(ROOT)
    os.environ["EVOLVER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="evrt-parallel-")  # the benchmark's own daemon
    from evolver.evaluation import zygote_client

    setups = args.setups.split(",")
    if not set(setups) <= set(SETUPS):
        parser.error(f"--setups: choose from {', '.join(SETUPS)}")
    print(
        f"one iteration, {args.latency:g} s per LLM call, {args.concurrency} simulations at once per candidate, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; 40 gate tasks"
    )
    print(f"{'set-up':>10} {'K':>2} {'wall s':>7} {'x K=1':>6}  candidates")
    try:
        for setup in setups:
            base = None
            for k in [int(x) for x in args.ks.split(",")]:
                wall, statuses = one_iteration(k, args.concurrency, *SETUPS[setup])
                base = base or wall
                print(f"{setup:>10} {k:>2} {wall:>7.1f} {wall / base:>6.2f}  {', '.join(statuses)}", flush=True)
    finally:
        zygote_client.stop_all()


if __name__ == "__main__":
    main()
