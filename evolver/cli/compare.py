"""`evolver compare A B`: is B better than A, worse, or is there no evidence? And the same question for a
run's kept harness under other models (`evolver transfer`), which asks it through compare_arms.

Both agents run on the same tasks and seeds, beside each other in the same windows, a trial per task
each at every look (a task whose trials all agree so far stops running); the group-sequential paired
test of evolver.evolution.gate.compare judges each look and stops when the answer is clear either way.
The evaluations land in runs/<compare-id>/{a,b}/ like `evolver eval`'s, and the verdict in
runs/<compare-id>/comparison.json.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from evolver.config import Config
from evolver.config_requests import eval_request
from evolver.data import EvalResult, SimRecord, cost_text
from evolver.errors import UsageError
from evolver.evaluation.metrics import mean_reward, rewards_by_task, summarize
from evolver.evolution.gate.compare import CompareConfig, decide_compare, flips, next_tasks

COMPARISON_SCHEMA = 1


@dataclass
class Arm:
    name: str  # "a" or "b"
    spec: str  # what was asked for: a ref, a path, or a candidate of a run
    checkout: Path  # a folder holding agent/
    commit: Optional[str] = None


def resolve(spec: str, repo: Path, name: str, out, lineage, run=None) -> Arm:
    """An arm from what the user named: a candidate of ``run`` (3, 3b, base, best), a folder holding
    agent/agent.py, or a git commit or branch of ``repo`` (checked out in a worktree of the comparison,
    ``out``: a store.comparisons.ComparisonDir)."""
    if run is not None:
        commit = candidate_commit(run, spec)
        return Arm(name, spec, lineage.open_worktree(out.checkout_dir(name), commit), commit)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "agent" / "agent.py").is_file():
            raise UsageError(f"{spec} has no agent/agent.py; name a folder evolver init made, a git ref or a candidate (with --run)")
        return Arm(name, spec, path.resolve())
    commit = lineage.commit_of(spec)
    if commit is None:
        raise UsageError(f"'{spec}' is neither a folder nor a git ref of {repo}; see `git branch --list 'evolver/*'`")
    checkout = lineage.open_worktree(out.checkout_dir(name), commit)
    if not (checkout / "agent" / "agent.py").is_file():
        raise UsageError(f"{spec} has no agent/agent.py; pick a commit of an evolver-initialised repository")
    return Arm(name, spec, checkout, commit)


def candidate_commit(run, which: str) -> str:
    """The commit of `base`, `best` or a candidate (3, 3b) of a run."""
    if which == "base":
        return run.manifest().base_commit
    if which == "best":
        return run.state().incumbent_commit
    digits = which.rstrip("abcdefgh")
    record = run.iteration(int(digits)) if digits.isdigit() else None
    cand = next((c for c in record.candidates if c.label == which), None) if record else None
    if cand is None or not cand.commit:
        labels = [c.label for r in run.iterations() for c in r.candidates if c.commit]
        raise UsageError(f"run {run.run_id} has no committed candidate '{which}'; name base, best or one of: {', '.join(labels) or 'none'}")
    return cand.commit


def compare_arms(
    cfg: Config,
    backend,
    local_api_base: Optional[str],
    a: Arm,
    b: Arm,
    out,
    run_id: str,
    *,
    tasks: Optional[list[str]],
    config: CompareConfig,
    num_tasks: Optional[int] = None,
    on_progress: Callable[[str, int, int, Optional[float]], None] = lambda *x: None,
    on_look: Callable[[dict], None] = lambda look: None,
) -> dict:
    """Run A and B look by look until the test decides; the comparison as plain data, also saved in ``out``
    (a store.comparisons.ComparisonDir: each arm's evaluation and comparison.json)."""
    started = time.monotonic()
    looks: list[dict] = []
    ran: dict[str, dict[tuple, SimRecord]] = {"a": {}, "b": {}}  # every look's simulations, by (task, trial)
    verdict, chosen = None, tasks
    for look, trials in enumerate(config.stages):

        def measure(arm: Arm) -> EvalResult:
            req = eval_request(
                cfg,
                arm.checkout,
                out.arm(arm.name).path,
                local_api_base=local_api_base,
                task_ids=chosen,
                num_tasks=num_tasks if chosen is None else None,
                trials=trials,
                split=cfg.split or None,
            )
            return backend.evaluate(
                req,
                f"{run_id}-{arm.name}",
                timeout=cfg.worker_timeout,
                on_progress=lambda done, total, mean: on_progress(arm.name, done, total, mean),
            )

        with ThreadPoolExecutor(2) as pool:  # the same window: a drift moves both arms alike
            try:
                results = dict(zip("ab", pool.map(measure, (a, b))))
            except BaseException:
                backend.cancel()
                raise
        for name, result in results.items():
            if result.candidate_error:
                raise UsageError(f"agent {name.upper()} ({(a if name == 'a' else b).spec}) failed to import: {result.candidate_error}")
            ran[name].update({(r.task_id, r.trial): r for r in result.simulations})
        lost = {name: r.summary.infra_errors for name, r in results.items() if r.summary.infra_errors > r.summary.num_simulations / 2}
        if lost:
            verdict = None
            looks.append({"look": look, "trials": trials, "undecided": f"most simulations of {', '.join(lost)} hit infrastructure errors"})
            break
        a_table, b_table = (rewards_by_task(list(ran[n].values())) for n in "ab")
        verdict = decide_compare(a_table, b_table, config, look=look)
        looks.append({"look": look, "trials": trials, **asdict(verdict)})
        on_look(looks[-1])
        if verdict.decision != "continue":
            break
        chosen = next_tasks(a_table, b_table, config, look + 1)  # a task whose trials all agree runs no more
    records = {n: list(ran[n].values()) for n in "ab"}
    a_table, b_table = (rewards_by_task(records[n]) for n in "ab")
    usage = summarize(records["a"] + records["b"], len(a_table), looks[-1]["trials"], 0.0).usage
    changed = flips(a_table, b_table)
    record = {
        "schema": COMPARISON_SCHEMA,
        "id": run_id,
        "created": time.time(),
        "a": {"spec": a.spec, "commit": a.commit, "checkout": str(a.checkout)},
        "b": {"spec": b.spec, "commit": b.commit, "checkout": str(b.checkout)},
        "domain": cfg.domain,
        "split": cfg.split or None,
        "tasks": sorted(a_table),
        "models": {role: cfg.role(role, local_api_base).model_dump() for role in ("agent", "user", "judge")},
        "config": asdict(config),
        "decision": verdict.decision if verdict else "undecided",
        "reason": verdict.reason if verdict else looks[-1]["undecided"],
        "effect": verdict.effect if verdict else None,
        "ci": verdict.ci if verdict else None,
        "p_value": verdict.p_value if verdict else None,
        "looks": looks,
        "a_mean": mean_reward(a_table),
        "b_mean": mean_reward(b_table),
        "better_on": [{"task": t, "a": ra, "b": rb} for t, ra, rb in changed if rb > ra],
        "worse_on": [{"task": t, "a": ra, "b": rb} for t, ra, rb in changed if rb < ra],
        "simulations": {n: len(records[n]) for n in "ab"},
        "infra_errors": {n: sum(r.outcome == "infra_error" for r in records[n]) for n in "ab"},
        "usage": {role: u.model_dump() for role, u in usage.items()},
        "cost": cost_text(usage.values()),
        "seconds": round(time.monotonic() - started, 1),
    }
    out.save(record)
    return record


def lines(record: dict, *, tasks_shown: int = 10) -> list[str]:
    """The comparison for people: verdict, effect and interval, p-value, flipped tasks, what it spent."""
    a, b = record["a"]["spec"], record["b"]["spec"]
    out = [f"A = {a}, B = {b}: [bold]{record['decision']}[/bold]", record["reason"]]
    if record["effect"] is not None:
        ci = record["ci"]
        interval = f", {100 * (1 - record['config']['alpha']):.0f}% interval {100 * ci[0]:+.1f} to {100 * ci[1]:+.1f}" if ci else ""
        p = "" if record["p_value"] is None else f", p={record['p_value']:.3f}"
        out.append(
            f"effect of B over A: {100 * record['effect']:+.1f} points{interval}{p}; "
            f"mean reward A {record['a_mean']:.3f}, B {record['b_mean']:.3f} over {len(record['tasks'])} tasks"
        )
    for key, word in (("better_on", "B better on"), ("worse_on", "B worse on")):
        shown = record[key][:tasks_shown]
        if shown:
            more = f" (and {len(record[key]) - tasks_shown} more)" if len(record[key]) > tasks_shown else ""
            out.append(f"{word} {len(record[key])} task(s): " + ", ".join(f"{f['task']} {f['a']:.2f}->{f['b']:.2f}" for f in shown) + more)
    sims = record["simulations"]
    out.append(
        f"spent {sims.get('a', 0) + sims.get('b', 0)} simulations ({sims.get('a', 0)} + {sims.get('b', 0)}), "
        f"{sum(u['prompt_tokens'] + u['completion_tokens'] for u in record['usage'].values()):,} tokens, {record['cost']}, "
        f"{record['seconds']:g} s"
    )
    return out


VERDICTS = {"better": "helps", "worse": "hurts", "no evidence": "no evidence", "undecided": "undecided"}


def kept_steps(run, each: bool) -> list[tuple[str, str]]:
    """(label, commit) of the run's base and best, or with ``each`` of every kept candidate in order."""
    steps = [("base", run.manifest().base_commit)]
    if each:
        steps += [(r.kept, r.winner.commit) for r in run.iterations() if r.winner]
    best = run.state().incumbent_commit
    if steps[-1][1] != best:
        steps.append(("best", best))
    if len(steps) < 2:
        raise UsageError(f"run {run.run_id} kept nothing: its best is its base, so there is nothing to transfer")
    return steps


def transfer(
    run,
    cfg: Config,
    backend,
    local_api_base: Optional[str],
    *,
    each: bool,
    tasks: Optional[list[str]],
    transfer_id: str,
    lineage,
    config: CompareConfig = CompareConfig(),
    on_progress=lambda *x: None,
    on_look=lambda look: None,
) -> dict:
    """Compare the run's base with its best (with ``each``: every kept step with the one before) under
    ``cfg``'s models and tasks; the transfer as plain data, also in the run directory (transfer.json)."""
    out = run.transfer(transfer_id)
    steps = kept_steps(run, each)
    pairs = []
    for (a_label, a_commit), (b_label, b_commit) in zip(steps, steps[1:]):
        name = f"{a_label}-{b_label}"
        pair = out.pair(name)
        arms = [
            Arm(side, label, lineage.open_worktree(pair.checkout_dir(side), commit), commit)
            for side, label, commit in (("a", a_label, a_commit), ("b", b_label, b_commit))
        ]
        try:
            record = compare_arms(
                cfg,
                backend,
                local_api_base,
                *arms,
                pair,
                f"{transfer_id}-{name}",
                tasks=tasks,
                config=config,
                on_progress=on_progress,
                on_look=on_look,
            )
        finally:
            for arm in arms:
                lineage.remove_worktree(arm.checkout)
        pairs.append(
            {
                "a": a_label,
                "b": b_label,
                "a_commit": a_commit,
                "b_commit": b_commit,
                "verdict": VERDICTS[record["decision"]],
                **{k: record[k] for k in ("decision", "reason", "effect", "ci", "p_value", "a_mean", "b_mean", "simulations", "cost")},
                "comparison": str(pair.file),
            }
        )
    summary = {
        "schema": COMPARISON_SCHEMA,
        "id": transfer_id,
        "run_id": run.run_id,
        "created": time.time(),
        "models": {role: cfg.role(role, local_api_base).model for role in ("agent", "user")},
        "domain": cfg.domain,
        "split": cfg.split or None,
        "tasks": len(tasks) if tasks else None,
        "pairs": pairs,
    }
    out.save(summary)
    return summary


def transfer_rows(transfers: list[dict]) -> list[dict]:
    """One row per compared pair of every transfer, for the history, status and the report."""
    return [
        {
            "transfer": t["id"],
            "agent_model": t["models"]["agent"],
            "user_model": t["models"]["user"],
            "domain": t["domain"],
            "pair": f"{p['a']} -> {p['b']}",
            "a": p["a_mean"],
            "b": p["b_mean"],
            "effect": p["effect"],
            "ci": p["ci"],
            "verdict": p["verdict"],
        }
        for t in transfers
        for p in t["pairs"]
    ]
