"""The loop's own overhead per iteration: everything but LLM calls and simulation time.

    python benchmarks/loop_overhead.py [--iterations 4]

Runs `evolver run` in-process on the 48-task test domain (tests/scripts/gen_domain.py)
with the scripted LLMs of the loop tests (zero latency), and times each
evaluation's simulation window (from the workers' status files) and each
meta-LLM call. Overhead = wall time - simulation windows - meta-LLM time:
git worktrees and commits, worker start-up (fork, candidate import, task
loading), digests, gate arithmetic, state writes. Target: under 5 s per iteration.
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
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=4)
    args = parser.parse_args()
    os.environ["EVOLVER_SCRIPT"] = "tests.scripts.loop_cases:script"
    os.environ["PYTHONPATH"] = str(ROOT)
    from rich.console import Console

    from evolver.cli.scaffold import init_repo
    from evolver.cli.start import new_run, start_run
    from evolver.config_load import load_config
    from evolver.evaluation.backends.local import LocalBackend

    repo = Path(tempfile.mkdtemp(prefix="evolver-overhead-"))
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
            "iterations": args.iterations,
            "concurrency": 8,
        },
        environ={},
    )

    windows: list[float] = []
    meta_seconds: list[float] = []
    backend = LocalBackend()
    evaluate = backend.evaluate

    def timed_evaluate(req, *a, **kw):
        result = evaluate(req, *a, **kw)
        statuses = [json.loads(p.read_text()) for p in Path(req.out_dir).glob("status-*.json")]
        if statuses and all("done_at" in s for s in statuses):
            windows.append(max(s["done_at"] for s in statuses) - min(s["running_at"] for s in statuses))
        return result

    backend.evaluate = timed_evaluate
    console = Console(stderr=True, quiet=True)
    loop = start_run(new_run(repo, cfg, "run-overhead", backend, allow_dirty=False, dry_run=False, console=console), cfg, backend, console)
    propose = loop.ctx.proposer.propose

    def timed_propose(request):
        start = time.perf_counter()
        try:
            return propose(request)
        finally:
            meta_seconds.append(time.perf_counter() - start)

    loop.ctx.proposer = SimpleNamespace(propose=timed_propose)  # the loop asks its proposer only this
    start = time.perf_counter()
    loop.measure_baseline()
    baseline_wall, baseline_sim = time.perf_counter() - start, sum(windows)
    windows.clear()
    rows = []
    for n in range(1, args.iterations + 1):
        before = time.perf_counter()
        loop.iterate(n)
        wall = time.perf_counter() - before
        sim, meta = sum(windows), sum(meta_seconds)
        windows.clear()
        meta_seconds.clear()
        record = loop.run.iteration(n)
        rows.append((n, record.status, wall, sim, meta, wall - sim - meta))
    print(f"baseline: wall {baseline_wall:.1f} s, simulation {baseline_sim:.1f} s, overhead {baseline_wall - baseline_sim:.1f} s")
    print(f"{'iter':>4} {'verdict':>9} {'wall s':>7} {'sim s':>7} {'meta s':>7} {'overhead s':>10}")
    for n, status, wall, sim, meta, over in rows:
        print(f"{n:>4} {status:>9} {wall:>7.1f} {sim:>7.1f} {meta:>7.2f} {over:>10.1f}")
    print(f"mean overhead per iteration: {sum(r[5] for r in rows) / len(rows):.1f} s (target < 5 s)")


if __name__ == "__main__":
    main()
