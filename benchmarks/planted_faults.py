"""Can a proposer find a fault? Eight planted faults, each proposer, each meta model: faults recovered.

    python benchmarks/planted_faults.py                              # the scripted meta-agent, both proposers (minutes)
    python benchmarks/planted_faults.py --meta-model local           # the embedded 1.5B as meta-LLM (hours on 2 cores)
    python benchmarks/planted_faults.py --faults early_stop --proposers agent --iterations 1

Each fault (tests/scripts/planted.py) is planted in a fresh `evolver init` repository, committed, and
evolved with `evolver run` for up to --iterations iterations (one at a time, stopping at the first kept
candidate) on the test domain built on tau2's mock environment (tests/scripts/gen_domain.py: 8 analysis
tasks, 40 gate tasks), with the scripted agent and customer of tests/scripts/planted.py: simulations
are cheap and deterministic, only the meta-LLM is real. A fault is recovered when a kept candidate's
gate reward restores at least half of what the fault cost (the template's reward and the faulty one's
are measured first with `evolver eval` on the gate tasks).

Per proposer and meta model: faults recovered, proposals, how many reached the gate (valid, not
refused, not a no-op), simulations, meta tokens, minutes in all and per recovery, and per proposal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.scripts.planted import FAULTS, plant  # noqa: E402

DOMAIN = ["--domain", "evolver_gen"]
SCRIPTED = ["--agent-model", "scripted/bench", "--user-model", "scripted/user", "--judge-model", "scripted/judge"]
REACHED = ("accepted", "rejected", "undecided")


def env() -> dict:
    return {**os.environ, "EVOLVER_SCRIPT": "tests.scripts.planted:script",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def evolver(*args: str, timeout: float = 7200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolver", *args], capture_output=True, text=True, env=env(), timeout=timeout)


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", *args], cwd=repo, check=True, capture_output=True)


def make_repo(path: Path, fault=None) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    if evolver("init", str(path)).returncode != 0:
        raise SystemExit("evolver init failed")
    config = (path / "evolver.toml").read_text().replace('domain = "mock"', 'domain = "evolver_gen"\nplugins = ["tests.scripts.gen_domain"]')
    (path / "evolver.toml").write_text(config)
    if fault is not None:
        agent = path / "agent" / "agent.py"
        agent.write_text(plant(agent.read_text(), fault))
        switches = path / "agent" / "harness.toml"
        for layer in fault.switches:
            switches.write_text(switches.read_text().replace(f"{layer} = false", f"{layer} = true"))
    git(path, "add", "-A")
    git(path, "commit", "-qm", "agent" if fault is None else f"planted: {fault.name}")
    return path


def gate_reward(repo: Path) -> float:
    proc = evolver("eval", str(repo), "--json", *DOMAIN, "--split", "test", *SCRIPTED, "--concurrency", "8")
    if proc.returncode != 0:
        raise SystemExit(f"evolver eval failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)["avg_reward"]


@dataclass
class Trial:
    fault: str
    faulty: float
    honest: float
    proposals: int = 0
    reached: int = 0
    recovered: bool = False
    kept_reward: float | None = None
    simulations: int = 0
    meta_tokens: int = 0
    seconds: float = 0.0
    proposal_seconds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def evolve(fault, proposer: str, meta: list[str], args, honest: float, work: Path) -> Trial:
    repo = make_repo(work / f"{fault.name}-{proposer}", fault)
    trial = Trial(fault.name, faulty=gate_reward(repo), honest=honest)
    started, run_id = time.monotonic(), None
    for n in range(1, args.iterations + 1):
        if run_id is None:
            proc = evolver("run", str(repo), "--iterations", "1", "--gate-stages", args.gate_stages, "--no-holdout", "--stall", "0",
                           "--concurrency", "8", "--proposer", proposer, *SCRIPTED, *meta)
        else:
            proc = evolver("run", str(repo), "--resume", run_id, "--iterations", str(n))
        if proc.returncode != 0:
            trial.notes.append(f"iteration {n}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
            break
        run_id = run_id or next(p.name for p in (repo / "runs").glob("run-*"))
        record = json.loads((repo / "runs" / run_id / "iterations" / f"{n:03d}.json").read_text())
        for cand in record["candidates"]:
            trial.proposals += 1
            trial.reached += cand["status"] in REACHED
            trial.proposal_seconds.append(cand.get("investigation", {}).get("seconds") or 0.0)
            trial.notes.append(f"{cand['label']}: {cand['status']}: {cand['title'] or '-'}: {cand['reason'][:120]}")
        if record.get("kept"):
            kept = next(c for c in record["candidates"] if c["label"] == record["kept"])
            trial.kept_reward = kept["gate_candidate"]
            trial.recovered = kept["gate_candidate"] >= trial.faulty + 0.5 * (honest - trial.faulty)
            break
    trial.seconds = time.monotonic() - started
    if run_id:
        status = json.loads(evolver("status", run_id, "--repo", str(repo), "--json").stdout)
        trial.simulations = status["simulations_done"]
        meta = status["usage"].get("meta", {})
        trial.meta_tokens = meta.get("prompt_tokens", 0) + meta.get("completion_tokens", 0)
    return trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meta-model", default="scripted/meta", help="the meta-LLM: scripted/meta (the scripted meta-agent), local (the embedded 1.5B), or any litellm model")
    parser.add_argument("--local-size", default="default")
    parser.add_argument("--proposers", default="agent,oneshot")
    parser.add_argument("--faults", default=",".join(f.name for f in FAULTS))
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--gate-stages", default="1,2")
    parser.add_argument("--out", help="write every trial as JSON here (rewritten after each fault)")
    parser.add_argument("--keep", metavar="DIR", help="work in this folder and keep it (the runs, transcripts and logs); default: a temporary one")
    args = parser.parse_args()
    meta = ["--meta-model", args.meta_model] + (["--local-size", args.local_size] if args.meta_model == "local" else [])
    unknown = set(args.faults.split(",")) - {f.name for f in FAULTS}
    if unknown:
        parser.error(f"unknown fault(s) {', '.join(sorted(unknown))}; known: {', '.join(f.name for f in FAULTS)}")
    chosen = [f for f in FAULTS if f.name in args.faults.split(",")]
    results: dict[str, list[Trial]] = {}
    with tempfile.TemporaryDirectory(prefix="evolver-planted-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        honest = gate_reward(make_repo(work / "template"))
        print(f"template gate reward {honest:.3f}", flush=True)
        for proposer in args.proposers.split(","):
            for fault in chosen:
                trial = evolve(fault, proposer, meta, args, honest, work)
                results.setdefault(proposer, []).append(trial)
                print(f"{proposer:8s} {fault.name:22s} faulty {trial.faulty:.3f} -> kept {trial.kept_reward if trial.kept_reward is not None else '-'}"
                      f" recovered={trial.recovered} proposals={trial.proposals} reached={trial.reached} sims={trial.simulations}"
                      f" meta_tokens={trial.meta_tokens} {trial.seconds / 60:.1f} min", flush=True)
                for note in trial.notes:
                    print(f"    {note}", flush=True)
                if args.out:  # after every fault: a long run stopped part-way keeps what it measured
                    Path(args.out).write_text(json.dumps({p: [t.__dict__ for t in ts] for p, ts in results.items()}, indent=2))
    print(f"\nmeta model {args.meta_model}; template gate reward {honest:.3f}; up to {args.iterations} iteration(s) per fault\n")
    print("| proposer | faults recovered | proposals | reached the gate | simulations | meta tokens | minutes | minutes per recovery | s per proposal (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for proposer, trials in results.items():
        recovered = sum(t.recovered for t in trials)
        proposals = sum(t.proposals for t in trials)
        minutes = sum(t.seconds for t in trials) / 60
        per = sorted(s for t in trials for s in t.proposal_seconds)
        median = per[len(per) // 2] if per else 0.0
        per_recovery = f"{minutes / recovered:.1f}" if recovered else "-"
        print(f"| {proposer} | {recovered} of {len(trials)} | {proposals} | {sum(t.reached for t in trials)} of {proposals} "
              f"| {sum(t.simulations for t in trials):,} | {sum(t.meta_tokens for t in trials):,} | {minutes:.1f} | {per_recovery} | {median:.0f} |")


if __name__ == "__main__":
    main()
