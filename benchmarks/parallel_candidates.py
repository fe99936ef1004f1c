"""Wall-clock of one iteration with K candidates evaluated at once, against K = 1.

    python benchmarks/parallel_candidates.py [--ks 1,2,4] [--latency 0.5] [--concurrency 8]

Each K gets a fresh run on the 48-task test domain (tests/scripts/gen_domain.py)
with scripted LLMs at a fixed latency per call. The scripted meta-LLM answers
"proposal i of K" with a patch of its own (a different harmless line in the
agent's instruction), so all K candidates are distinct and each runs the whole
gate at the same concurrency per candidate: a smoke test, then with K = 1 one
stage of 40 gate tasks x 1 trial beside the incumbent's, with K > 1 first a
screen of 2 trials per task for every candidate (gate version 2's
select-then-confirm, docs/gate.md) and then that stage for the best one. The baseline is measured first and not timed. Goal
(issue #14): K = 4 within 1.3x the time of K = 1 when the machine allows
K x concurrency simulations at once.
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


def one_iteration(k: int, concurrency: int) -> tuple[float, list[str]]:
    from rich.console import Console

    from evolver.cli.scaffold import init_repo
    from evolver.cli.start import new_run
    from evolver.config import load_config
    from evolver.evaluation.backends.local import LocalBackend

    repo = Path(tempfile.mkdtemp(prefix=f"evolver-k{k}-"))
    init_repo(repo)
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    cfg = load_config(repo, {"agent_model": "scripted/agent", "user_model": "scripted/user", "judge_model": "scripted/judge",
                             "meta_model": "scripted/meta", "domain": "evolver_gen", "plugins": ["tests.scripts.gen_domain"],
                             "iterations": 1, "candidates": k, "concurrency": concurrency, "gate_stages": ["1"], "holdout": "off"},
                      environ={})
    with LocalBackend() as backend:
        loop = new_run(repo, cfg, f"run-k{k}", backend, allow_dirty=False, dry_run=False, console=Console(stderr=True, quiet=True))
        loop.measure_baseline()
        start = time.perf_counter()
        loop.iterate(1)
        wall = time.perf_counter() - start
    return wall, [c.status for c in loop.run.iteration(1).candidates]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", default="1,2,4")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per scripted LLM call")
    parser.add_argument("--concurrency", type=int, default=8, help="simulations at once per candidate")
    args = parser.parse_args()
    os.environ["EVOLVER_SCRIPT"] = "tests.scripts.loop_cases:distinct_candidates_script"
    os.environ["EVOLVER_SCRIPTED_LATENCY"] = str(args.latency)
    os.environ["PYTHONPATH"] = str(ROOT)
    os.environ["EVOLVER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="evrt-parallel-")  # the benchmark's own daemon
    from evolver.evaluation import zygote_client

    print(f"one iteration, {args.latency:g} s per LLM call, {args.concurrency} simulations at once per candidate, "
          f"{os.cpu_count()} cores; K = 1: smoke test, then 40 gate simulations beside the incumbent's 40; "
          f"K > 1: smoke tests, a screen of 2 trials x 40 tasks per candidate, then the best one's 40 beside the incumbent's 40")
    print(f"{'K':>2} {'wall s':>7} {'x K=1':>6}  candidates")
    base = None
    try:
        for k in [int(x) for x in args.ks.split(",")]:
            wall, statuses = one_iteration(k, args.concurrency)
            base = base or wall
            print(f"{k:>2} {wall:>7.1f} {wall / base:>6.2f}  {', '.join(statuses)}", flush=True)
    finally:
        zygote_client.stop_all()


if __name__ == "__main__":
    main()
