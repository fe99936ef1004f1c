"""Can a proposer find a fault? Eight planted faults, each proposer, each meta model: faults fixed.

    python benchmarks/planted_faults.py                              # the scripted meta-agent, both proposers (minutes)
    python benchmarks/planted_faults.py --meta-model local --proposers agent   # the embedded 1.5B as meta-LLM (hours on 2 cores)
    python benchmarks/planted_faults.py --faults early_stop --proposers agent --iterations 1

Each fault (tests/scripts/planted.py) is planted in a fresh `evolver init` repository whose harness has H2
and H4 switched on, on the planted domain (tests/scripts/planted_domain.py: tasks that need each of those
layers, arguments and conversations of many lengths), with its scripted agent and customer: simulations
are cheap and deterministic, only the meta-LLM is real. Each is evolved with `evolver run` (the audited
gate policy, named so that the figures do not move with the default) for up to --iterations iterations,
one at a time, until the run ends with a best other than its base.

The template, the faulty agent and the run's best are each measured with `evolver eval` on the gate split
and on the domain's held-back split, which no run reads. A fault is recovered when the best wins back at
least 90% of what the fault cost on both. Each fault is then counted as one of:

- fixed:         recovered, with every layer and the turn method still in place;
- reverted:      the best switched off a layer the base had on, or no longer reaches one of its steps or
                 has no turn method (read from its code, whatever it scored);
- fitted:        recovered on the gate split, not on the held-back one (a cut or a window widened to the
                 lengths the run saw);
- not recovered: nothing kept, or less than 90% back.

Per proposer and meta model: those counts, proposals, how many reached the gate (valid, not refused, not a
no-op), simulations, meta tokens, minutes in all and per fix, and per proposal; then a row per fault.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evolver.llm import prepare_environment  # noqa: E402

prepare_environment()  # before the domain's import of tau2 and litellm: no network fetch, no registry log
from tests.scripts.planted import FAULTS, LAYERS, plant  # noqa: E402
from tests.scripts.planted_domain import DOMAIN, MAX_STEPS  # noqa: E402
from tests.scripts.planted_domain import SPLITS as DOMAIN_SPLITS  # noqa: E402

SCRIPTED = ["--agent-model", "scripted/bench", "--user-model", "scripted/user", "--judge-model", "scripted/judge"]
SPLITS = ("test", "holdout")  # the gate's, and the held-back one
RECOVERED = 0.9  # of what the fault cost, won back
REACHED = ("accepted", "rejected", "undecided")
# The steps of each layer, by the switch that turns the layer on: a best whose turn method no longer reaches one
# of them has taken that layer out, as a switch turned off does.
LAYER_STEPS = {
    "realize_action": "h2_action_realization",
    "should_stop": "h4_trajectory_regulation",
    "regulation_notes": "h4_trajectory_regulation",
    "tool_schemas": "h3_environment_contract",
    "skill_texts": "h5_procedural_skills",
}


def env(runtime: str) -> dict:
    return {
        **os.environ,
        "EVOLVER_SCRIPT": "tests.scripts.planted:script",
        "EVOLVER_RUNTIME_DIR": runtime,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def evolver(runtime: str, *args: str, timeout: float = 7200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolver", *args], capture_output=True, text=True, env=env(runtime), timeout=timeout)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def make_repo(path: Path, runtime: str, fault=None) -> Path:
    """A repository of the template (or with ``fault`` planted) on the planted domain, H2 and H4 on, committed."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    if evolver(runtime, "init", str(path)).returncode != 0:
        raise SystemExit("evolver init failed")
    config = (path / "evolver.toml").read_text()
    config = config.replace('domain = "mock"', f'domain = "{DOMAIN}"\nplugins = ["tests.scripts.planted_domain"]')
    config = re.sub(r"^max_steps = \d+", f"max_steps = {MAX_STEPS}", config, count=1, flags=re.M)
    (path / "evolver.toml").write_text(config)
    switches = path / "agent" / "harness.toml"
    for layer in LAYERS:
        switches.write_text(switches.read_text().replace(f"{layer} = false", f"{layer} = true"))
    if fault is not None:
        agent = path / "agent" / "agent.py"
        agent.write_text(plant(agent.read_text(), fault))
    git(path, "add", "-A")
    git(path, "commit", "-qm", "agent" if fault is None else f"planted: {fault.name}")
    return path


def rewards(repo: Path, runtime: str, ref: str = "HEAD") -> dict[str, float]:
    """The average reward of ``ref`` on the gate split and on the held-back one (one evaluation of both)."""
    ids = {task.id: split for split in SPLITS for task in DOMAIN_SPLITS[split]}
    proc = evolver(
        runtime, "eval", str(repo), "--ref", ref, "--json", "--task-ids", ",".join(ids), *SCRIPTED, "--concurrency", "8", "--no-preflight"
    )
    if proc.returncode != 0:
        raise SystemExit(f"evolver eval failed:\n{proc.stderr[-2000:]}")
    simulations = json.loads(Path(json.loads(proc.stdout)["result_file"]).read_text())["simulations"]
    missing = sorted(set(ids) - {s["task_id"] for s in simulations if s["outcome"] != "infra_error"})
    if missing:  # an average over fewer tasks would not compare with the others
        raise SystemExit(f"evolver eval of {ref} scored no reward for {len(missing)} task(s): {', '.join(missing[:5])}")
    return {
        split: sum(s["reward"] or 0.0 for s in simulations if ids[s["task_id"]] == split) / len(DOMAIN_SPLITS[split]) for split in SPLITS
    }


def reached_steps(source: str) -> set[str] | None:
    """The HarnessAgent methods its turn method calls, directly or through one another; None without one."""
    cls = next((n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == "HarnessAgent"), None)
    methods = {f.name: f for f in (cls.body if cls else []) if isinstance(f, ast.FunctionDef)}
    if "generate_next_message" not in methods:
        return None
    seen, todo = set(), ["generate_next_message"]
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        todo += [
            n.func.attr
            for n in ast.walk(methods[name])
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id == "self"
        ]
    return seen


def taken_out(repo: Path, base: str, best: str) -> list[str]:
    """What ``best`` took out of ``base``'s harness: layers switched off, layer steps or the turn method no longer reached."""

    def read(commit: str, path: str) -> str:
        return git(repo, "show", f"{commit}:{path}")

    on = {layer for layer, value in tomllib.loads(read(base, "agent/harness.toml")).items() if value is True}
    still_on = {layer for layer, value in tomllib.loads(read(best, "agent/harness.toml")).items() if value is True}
    out = [f"{layer} switched off" for layer in sorted(on - still_on)]
    before, after = reached_steps(read(base, "agent/agent.py")), reached_steps(read(best, "agent/agent.py"))
    if before is not None and after is None:
        return out + ["the turn method removed"]
    out += [
        f"{step} ({layer}) no longer called"
        for step, layer in LAYER_STEPS.items()
        if layer in on & still_on and before and step in before and step not in after
    ]
    return out


def won_back(kept: float, faulty: float, honest: float) -> bool:
    return kept >= faulty + RECOVERED * (honest - faulty) - 1e-9


def label(kept: dict[str, float] | None, faulty: dict[str, float], honest: dict[str, float], removed: list[str]) -> str:
    if kept is None:
        return "not recovered"
    if removed:
        return "reverted"
    gate, held = (won_back(kept[s], faulty[s], honest[s]) for s in SPLITS)
    return "fixed" if gate and held else "fitted" if gate else "not recovered"


@dataclass
class Trial:
    fault: str
    faulty: dict[str, float]
    honest: dict[str, float]
    proposals: int = 0
    reached: int = 0
    iterations: int = 0
    kept: dict[str, float] | None = None  # the run's best, when it is not the base
    removed: list[str] = field(default_factory=list)
    label: str = "not recovered"
    simulations: int = 0
    meta_tokens: int = 0
    seconds: float = 0.0
    proposal_seconds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def evolve(fault, proposer: str, meta: list[str], args, honest: dict[str, float], work: Path, runtime: str) -> Trial:
    repo = make_repo(work / f"{fault.name}-{proposer}", runtime, fault)
    base = git(repo, "rev-parse", "HEAD").strip()
    trial = Trial(fault.name, faulty=rewards(repo, runtime), honest=honest)
    started, run_id, best = time.monotonic(), None, {}
    for n in range(1, args.iterations + 1):
        if run_id is None:
            proc = evolver(
                runtime,
                "run",
                str(repo),
                "--iterations",
                "1",
                "--gate-policy",
                "audited",
                "--candidates",
                "1",
                "--gate-stages",
                args.gate_stages,
                "--no-holdout",
                "--stall",
                "0",
                "--concurrency",
                "8",
                "--proposer",
                proposer,
                *SCRIPTED,
                *meta,
            )
        else:
            proc = evolver(runtime, "run", str(repo), "--resume", run_id, "--iterations", str(n))
        if proc.returncode != 0:
            trial.notes.append(
                f"iteration {n}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}"
            )
            break
        run_id = run_id or next(p.name for p in (repo / "runs").glob("run-*"))
        trial.iterations = n
        record = json.loads((repo / "runs" / run_id / "iterations" / f"{n:03d}.json").read_text())
        for cand in record["candidates"]:
            trial.proposals += 1
            trial.reached += cand["status"] in REACHED
            trial.proposal_seconds.append(cand.get("investigation", {}).get("seconds") or 0.0)
            trial.notes.append(f"{cand['label']}: {cand['status']}: {cand['title'] or '-'}: {cand['reason'][:120]}")
        best = json.loads(evolver(runtime, "status", run_id, "--repo", str(repo), "--json").stdout)["best"]
        if best["iteration"]:  # kept, and still kept after the audited policy's audit
            break
    trial.seconds = time.monotonic() - started
    if best.get("iteration"):
        trial.kept = rewards(repo, runtime, best["commit"])
        trial.removed = taken_out(repo, base, best["commit"])
    trial.label = label(trial.kept, trial.faulty, trial.honest, trial.removed)
    if run_id:
        status = json.loads(evolver(runtime, "status", run_id, "--repo", str(repo), "--json").stdout)
        trial.simulations = status["simulations_done"]
        usage = status["usage"].get("meta", {})
        trial.meta_tokens = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
    return trial


def shown(scores: dict[str, float] | None) -> str:
    return " / ".join(f"{scores[s]:.3f}" for s in SPLITS) if scores else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--meta-model",
        default="scripted/meta",
        help="the meta-LLM: scripted/meta (the scripted meta-agent), local (the embedded 1.5B), or any litellm model",
    )
    parser.add_argument("--local-size", default="default")
    parser.add_argument("--proposers", default="agent,oneshot")
    parser.add_argument("--faults", default=",".join(f.name for f in FAULTS))
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--gate-stages", default="1,2")
    parser.add_argument("--out", help="write every trial as JSON here (rewritten after each fault)")
    parser.add_argument(
        "--keep", metavar="DIR", help="work in this folder and keep it (the runs, transcripts and logs); default: a temporary one"
    )
    args = parser.parse_args()
    meta = ["--meta-model", args.meta_model] + (["--local-size", args.local_size] if args.meta_model == "local" else [])
    unknown = set(args.faults.split(",")) - {f.name for f in FAULTS}
    if unknown:
        parser.error(f"unknown fault(s) {', '.join(sorted(unknown))}; known: {', '.join(f.name for f in FAULTS)}")
    chosen = [f for f in FAULTS if f.name in args.faults.split(",")]
    results: dict[str, list[Trial]] = {}
    # Its own worker daemon, stopped at the end: nothing is left running, and no other user's daemon is shared.
    runtime = tempfile.mkdtemp(prefix="evolver-rt-")
    try:
        with tempfile.TemporaryDirectory(prefix="evolver-planted-") as tmp:
            work = Path(args.keep) if args.keep else Path(tmp)
            honest = rewards(make_repo(work / "template", runtime), runtime)
            print(f"template: gate {honest['test']:.3f}, held back {honest['holdout']:.3f}", flush=True)
            for proposer in args.proposers.split(","):
                for fault in chosen:
                    trial = evolve(fault, proposer, meta, args, honest, work, runtime)
                    results.setdefault(proposer, []).append(trial)
                    print(
                        f"{proposer:8s} {fault.name:22s} {trial.label}: faulty {shown(trial.faulty)} -> best {shown(trial.kept)}"
                        f"{' (' + ', '.join(trial.removed) + ')' if trial.removed else ''} proposals={trial.proposals} reached={trial.reached}"
                        f" sims={trial.simulations} meta_tokens={trial.meta_tokens} {trial.seconds / 60:.1f} min",
                        flush=True,
                    )
                    for note in trial.notes:
                        print(f"    {note}", flush=True)
                    if args.out:  # after every fault: a long run stopped part-way keeps what it measured
                        Path(args.out).write_text(json.dumps({p: [t.__dict__ for t in ts] for p, ts in results.items()}, indent=2))
    finally:
        evolver(runtime, "daemon", "stop")
    print(
        f"\nmeta model {args.meta_model}; template gate / held back {shown(honest)}; up to {args.iterations} iteration(s) per fault; "
        f"recovered: at least {RECOVERED:.0%} of what the fault cost won back on both\n"
    )
    print(
        "| proposer | fixed | reverted | fitted | not recovered | proposals | reached the gate | simulations | meta tokens | minutes | minutes per fix | s per proposal (median) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for proposer, trials in results.items():
        count = {name: sum(t.label == name for t in trials) for name in ("fixed", "reverted", "fitted", "not recovered")}
        proposals = sum(t.proposals for t in trials)
        minutes = sum(t.seconds for t in trials) / 60
        per = sorted(s for t in trials for s in t.proposal_seconds)
        median = per[len(per) // 2] if per else 0.0
        per_fix = f"{minutes / count['fixed']:.1f}" if count["fixed"] else "-"
        print(
            f"| {proposer} | {count['fixed']} of {len(trials)} | {count['reverted']} | {count['fitted']} | {count['not recovered']} | {proposals} "
            f"| {sum(t.reached for t in trials)} of {proposals} | {sum(t.simulations for t in trials):,} | {sum(t.meta_tokens for t in trials):,} "
            f"| {minutes:.1f} | {per_fix} | {median:.0f} |"
        )
    print("\n| proposer | fault | counted | gate: faulty -> best | held back: faulty -> best | iterations | taken out |")
    print("|---|---|---|---|---|---|---|")
    for proposer, trials in results.items():
        for t in trials:
            best = {s: f"{t.kept[s]:.3f}" if t.kept else "-" for s in SPLITS}
            print(
                f"| {proposer} | {t.fault} | {t.label} | {t.faulty['test']:.3f} -> {best['test']} | {t.faulty['holdout']:.3f} -> {best['holdout']} "
                f"| {t.iterations} | {', '.join(t.removed) or '-'} |"
            )


if __name__ == "__main__":
    main()
