"""Reading and steering a run: history, show, rollback, status."""

from __future__ import annotations

import re
import time
from typing import Optional

from evolver.data import EvalResult
from evolver.errors import UsageError
from evolver.lineage import Lineage
from evolver.metrics import rewards_by_task
from evolver.runstate import BestChange, RunDir, slug


def history_rows(run: RunDir) -> list[dict]:
    """One row per candidate; an iteration's cost (all its candidates and roles) on its first row."""
    state = run.state()
    rows = []
    for r in run.iterations():
        for i, c in enumerate(r.candidates):
            rows.append({
                "iteration": r.iteration,
                "candidate": c.label,
                "branch": c.branch,
                "parent": "base" if r.parent == 0 else r.parent,
                "title": c.title,
                "analysis": r.analysis if r.kept == c.label else None,
                "gate_incumbent": r.gate_incumbent,
                "gate_candidate": c.gate_candidate,
                "gate_delta": None if c.gate_candidate is None or r.gate_incumbent is None else c.gate_candidate - r.gate_incumbent,
                "verdict": c.status,
                "reason": c.reason,
                "cost": sum(u.cost for u in r.usage.values()) if i == 0 else None,
                "tokens": sum(u.prompt_tokens + u.completion_tokens for u in r.usage.values()) if i == 0 else None,
                "is_best": r.iteration == state.incumbent and r.kept == c.label,
            })
    return rows


def status(run: RunDir) -> dict:
    state = run.state()
    manifest = run.manifest()
    running = run.is_locked()
    # "running" on disk with no driver holding the lock: the driver was killed before it could say so.
    shown = "running" if running else "dead" if state.status == "running" else state.status
    return {
        "run_id": run.run_id,
        "status": shown,
        "step": state.current_step if running else None,
        "stop_reason": state.stop_reason,
        "iterations_done": state.next_iteration - 1,
        "iterations_target": state.iterations_target,
        "best": {"iteration": state.incumbent, "commit": state.incumbent_commit, "branch": f"evolver/{run.run_id}/best"},
        "consecutive_rejections": state.consecutive_rejections,
        "decisions": state.decisions,
        "expected_false_keeps": state.decisions * manifest.gate["alpha"],
        "usage": {k: v.model_dump() for k, v in state.usage.items()},
        "cost": sum(u.cost for u in state.usage.values()),
        "elapsed_seconds": state.elapsed,
        "domain": manifest.config["domain"],
        "split_note": manifest.split_note,
        "models": {k: v.model for k, v in manifest.models.items()},
    }


def latest_rewards(run: RunDir, name: str) -> Optional[dict]:
    """An evaluation's rewards by task (metrics.rewards_by_task), from its largest result; None before it has one."""
    files = sorted((run.eval_dir(name)).glob("result-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    if not files:
        return None
    return rewards_by_task(EvalResult.model_validate_json(files[-1].read_text()).simulations)


LABEL = re.compile(r"^(\d+)([a-z]?)$")


def show(run: RunDir, which: str) -> dict:
    """One candidate ("3", "3b"), or, for an iteration of several candidates ("3"), all of them."""
    match = LABEL.match(which)
    if not match:
        raise UsageError(f"'{which}' is neither an iteration (e.g. 3) nor a candidate (e.g. 3b); see `evolver history {run.run_id}`")
    record = run.iteration(int(match.group(1)))
    if record is None:
        known = [r.iteration for r in run.iterations()]
        raise UsageError(f"run {run.run_id} has no iteration {match.group(1)}; it has {', '.join(map(str, known)) or 'none yet'}")
    lineage = Lineage(run.repo, run.run_id)
    cand = next((c for c in record.candidates if c.label == which), None)
    if cand is not None:
        return _candidate_info(run, lineage, record, cand)
    if match.group(2):
        raise UsageError(f"iteration {record.iteration} has no candidate {which}; it has {', '.join(c.label for c in record.candidates)}")
    return {**record.model_dump(exclude={"candidates", "charged"}),
            "candidates": [_candidate_info(run, lineage, record, c) for c in record.candidates]}


def _candidate_info(run: RunDir, lineage: Lineage, record, cand) -> dict:
    diff = lineage.diff(record.parent_commit, cand.commit) if cand.commit else ""
    flips = []
    candidate = latest_rewards(run, f"iter-{slug(cand.label)}-gate")
    incumbent = latest_rewards(run, f"reference-g{record.generation}")
    if candidate and incumbent:
        for task in sorted(candidate):
            c = [x for x in candidate[task] if x is not None]
            i = [x for x in incumbent.get(task, []) if x is not None]
            if c and i and round(sum(c) / len(c), 3) != round(sum(i) / len(i), 3):
                flips.append({"task": task, "incumbent": sum(i) / len(i), "candidate": sum(c) / len(c)})
    return {**cand.model_dump(exclude={"responses"}), "iteration": record.iteration, "parent": record.parent,
            "gate_incumbent": record.gate_incumbent, "kept": record.kept == cand.label,
            "diff": diff, "flips": flips, "note": lineage.note(cand.commit) if cand.commit else ""}


def rollback(run: RunDir, to: str, reason: str) -> BestChange:
    """Move `best` (and the incumbent of a resumed run) back to an earlier kept candidate or the base."""
    with run.lock():
        state = run.state()
        manifest = run.manifest()
        if to == "base":
            iteration, commit = 0, manifest.base_commit
        else:
            try:
                iteration = int(to)
            except ValueError:
                raise UsageError(f"--to takes an iteration number or 'base', not '{to}'") from None
            record = run.iteration(iteration)
            if record is None or record.winner is None:
                kept = [str(r.iteration) for r in run.iterations() if r.winner]
                raise UsageError(f"iteration {to} is not a kept candidate of run {run.run_id}; kept: {', '.join(kept) or 'none'} (or 'base')")
            commit = record.winner.commit
        lineage = Lineage(run.repo, run.run_id)
        lineage.set_branch(lineage.best_branch, commit)
        change = BestChange(iteration=iteration, commit=commit, reason=f"rollback: {reason}", at=time.time())
        state.best_history.append(change)
        state.incumbent, state.incumbent_commit = iteration, commit
        state.generation += 1  # a resumed run measures the restored incumbent afresh
        run.save_state(state)
        run.log("rollback", to=iteration, commit=commit, reason=reason)
        return change
