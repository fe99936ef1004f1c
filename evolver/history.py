"""Reading and steering a run: history, show, rollback, status."""

from __future__ import annotations

import time
from typing import Optional

from evolver.data import EvalResult
from evolver.errors import UsageError
from evolver.lineage import Lineage
from evolver.metrics import rewards_by_task
from evolver.runstate import BestChange, RunDir


def history_rows(run: RunDir) -> list[dict]:
    state = run.state()
    rows = []
    for r in run.iterations():
        cost = sum(u.cost for u in r.usage.values())
        rows.append({
            "iteration": r.iteration,
            "branch": r.branch,
            "parent": "base" if r.parent == 0 else r.parent,
            "title": r.title,
            "analysis": r.analysis,
            "gate_incumbent": r.gate_incumbent,
            "gate_candidate": r.gate_candidate,
            "gate_delta": None if r.gate_candidate is None or r.gate_incumbent is None else r.gate_candidate - r.gate_incumbent,
            "verdict": r.status,
            "reason": r.reason,
            "cost": cost,
            "tokens": sum(u.prompt_tokens + u.completion_tokens for u in r.usage.values()),
            "is_best": r.iteration == state.incumbent,
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


def _table(run: RunDir, name: str) -> Optional[dict]:
    files = sorted((run.eval_dir(name)).glob("result-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    if not files:
        return None
    return rewards_by_task(EvalResult.model_validate_json(files[-1].read_text()).simulations)


def show(run: RunDir, iteration: int) -> dict:
    record = run.iteration(iteration)
    if record is None:
        known = [r.iteration for r in run.iterations()]
        raise UsageError(f"run {run.run_id} has no iteration {iteration}; it has {', '.join(map(str, known)) or 'none yet'}")
    lineage = Lineage(run.repo, run.run_id)
    diff = lineage.diff(record.parent_commit, record.commit) if record.commit else ""
    flips = []
    candidate = _table(run, f"iter-{iteration:03d}-gate")
    incumbent = _table(run, f"reference-g{record.generation}")
    if candidate and incumbent:
        for task in sorted(candidate):
            c = [x for x in candidate[task] if x is not None]
            i = [x for x in incumbent.get(task, []) if x is not None]
            if c and i and round(sum(c) / len(c), 3) != round(sum(i) / len(i), 3):
                flips.append({"task": task, "incumbent": sum(i) / len(i), "candidate": sum(c) / len(c)})
    return {**record.model_dump(exclude={"responses"}), "diff": diff, "flips": flips,
            "note": lineage.note(record.commit) if record.commit else ""}


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
            if record is None or record.status != "accepted":
                kept = [str(r.iteration) for r in run.iterations() if r.status == "accepted"]
                raise UsageError(f"iteration {to} is not a kept candidate of run {run.run_id}; kept: {', '.join(kept) or 'none'} (or 'base')")
            commit = record.commit
        lineage = Lineage(run.repo, run.run_id)
        lineage.set_branch(lineage.best_branch, commit)
        change = BestChange(iteration=iteration, commit=commit, reason=f"rollback: {reason}", at=time.time())
        state.best_history.append(change)
        state.incumbent, state.incumbent_commit = iteration, commit
        state.generation += 1  # a resumed run measures the restored incumbent afresh
        run.save_state(state)
        run.log("rollback", to=iteration, commit=commit, reason=reason)
        return change
