"""Reading and steering a run: history, show, rollback, status."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Optional

from evolver.cli.compare import transfer_rows
from evolver.config import Config
from evolver.data import RoleUsage, add_tallies, cost_text
from evolver.errors import UsageError
from evolver.evaluation.metrics import infra_by_role, mean_reward, rewards_by_task
from evolver.evolution.evidence import flipped
from evolver.evolution.loop.context import member_trials
from evolver.evolution.plan import max_simulations
from evolver.store.lineage import Lineage
from evolver.store.rundir import RunDir, list_runs
from evolver.store.runstate import Audit, BestChange, named


def parent_of(record):
    """Where an iteration's candidates came from: a pool member's label ("base", "3b"), or a lineage's iteration number."""
    return record.parent_label or ("base" if record.parent == 0 else record.parent)


def gate_table(run: RunDir, label: str) -> Optional[dict]:
    """A candidate's gate trials (a population child's two parts together; the base's reference), None before any."""
    return member_trials(lambda name: latest_rewards(run, name), label) or None


def history_rows(run: RunDir) -> list[dict]:
    """One row per candidate; an iteration's cost (all its candidates and roles) on its first row."""
    state = run.state()
    best = run.best_label(state)
    rows = []
    for r in run.iterations():
        for i, c in enumerate(r.candidates):
            rows.append(
                {
                    "iteration": r.iteration,
                    "candidate": c.label,
                    "branch": c.branch,
                    "parent": parent_of(r),
                    "title": c.title,
                    "analysis": r.analysis if r.kept == c.label else None,
                    "gate_incumbent": r.gate_incumbent,
                    "gate_candidate": c.gate_candidate,
                    "gate_delta": None if c.gate_candidate is None or r.gate_incumbent is None else c.gate_candidate - r.gate_incumbent,
                    "verdict": "joined" if r.parent_label and c.status == "accepted" else c.status,
                    "reason": c.reason,
                    "screen": c.screen or None,
                    "cost": cost_text(r.usage.values()) if i == 0 else None,
                    "usage": {k: v.model_dump() for k, v in r.usage.items()} if i == 0 else None,
                    "cached": {k: v.cached_text() for k, v in r.usage.items() if v.cached_text()} if i == 0 else None,
                    "tokens": sum(u.tokens for u in r.usage.values()) if i == 0 else None,
                    "is_best": bool(best) and c.label == best,
                }
            )
    return rows


def status(run: RunDir) -> dict:
    """Where a run stands, read from its files while it runs or after: a driver that died is "dead";
    elapsed time advances while it runs; usage per role includes the iteration in progress."""
    state = run.state()
    manifest = run.manifest()
    running = run.is_locked()
    # "running" on disk with no driver holding the lock: the driver was killed before it could say so.
    shown = "running" if running else "dead" if state.status == "running" else state.status
    usage = dict(state.usage)
    current = run.iteration(state.next_iteration)
    for role, u in current.usage.items() if current else ():
        usage[role] = usage.get(role, RoleUsage()).add(u)
    done, seconds_per_sim = _simulations(run)
    infra = infra_by_role([r for evaluation in run.evaluations() for r in evaluation.records()])
    cfg = Config(**manifest.config)
    planned = done + max_simulations(
        cfg,
        len(manifest.analysis_tasks),
        len(manifest.gate_tasks),
        len(manifest.holdout_tasks),
        iterations=max(0, state.iterations_target - state.next_iteration + 1),
        baseline=done == 0,
    )
    elapsed = state.elapsed + (time.time() - state.updated_at if running and state.updated_at else 0.0)
    return {
        "run_id": run.run_id,
        "status": shown,
        "step": state.current_step if running else None,
        "stop_reason": state.stop_reason,
        "iterations_done": state.next_iteration - 1,
        "iterations_target": state.iterations_target,
        "candidates_per_iteration": cfg.candidates,
        "best": {
            "iteration": state.incumbent,
            "label": run.best_label(state) or "base",
            "commit": state.incumbent_commit,
            "branch": f"evolver/{run.run_id}/best",
            "gate": best_gate_score(run, state),
        },
        "consecutive_rejections": state.consecutive_rejections,
        "decisions": state.decisions,
        "expected_false_keeps": state.decisions * manifest.gate["alpha"],
        "gate_policy": manifest.policy.get("name", "per-decision"),
        "policy": policy_lines(manifest, state),
        "pool": [{"label": "base", "parent": "", "iteration": 0}, *(m.model_dump() for m in state.pool)]
        if manifest.policy.get("population")
        else [],
        "audits": [a.model_dump(mode="json") for a in state.audits],
        "usage": {k: v.model_dump() for k, v in usage.items()},
        "cost": sum(u.cost for u in usage.values()),
        "cost_text": cost_text(usage.values()),
        "simulations_done": done,
        "infra_errors": {role: tally.model_dump() for role, tally in infra.items()},  # by the side that failed
        "rate_limits": rate_limits(run, state, running),
        "transfers": transfer_rows(run.transfers()),
        "simulations_planned_at_most": planned,
        "seconds_per_simulation": seconds_per_sim,
        # An upper bound: every remaining iteration is assumed to run every candidate's full gate.
        "eta_seconds_at_most": None if seconds_per_sim is None or shown != "running" else (planned - done) * seconds_per_sim,
        "elapsed_seconds": elapsed,
        "domain": manifest.config["domain"],
        "split_note": manifest.split_note,
        "models": {k: v.model for k, v in manifest.models.items()},
    }


def policy_lines(manifest, state) -> list[str]:
    """What the run's gate policy promised and did (docs/search.md): per-decision, its decisions and expected
    false keeps; audited, its lenient decisions; population, its pool; both of those, the bound on ending worse
    and each audit's outcome."""
    alpha, decisions = manifest.gate["alpha"], state.decisions
    policy = manifest.policy
    if not policy or not policy.get("audit"):  # each decision bounded on its own: no audit (per-decision, or a run before policies)
        return [f"{decisions} gate decision(s) at a false-accept rate of {alpha:g} each: expected false keeps {decisions * alpha:.2f}"]
    bound = f"the end-of-run audit of the best against the base lets a run end worse than it began at most {policy['audit']['alpha']:g} of the time"
    if policy.get("population"):
        members = ", ".join(f"{m.label} (from {m.parent})" for m in state.pool) or "none yet"
        lines = [f"population policy: the pool is the base and {len(state.pool)} member(s): {members}; {bound}"]
    else:
        lines = [f"audited policy: {decisions} gate decision(s) at a lenient alpha of {alpha:g}; {bound}"]
    for audit in state.audits:
        last = audit.looks[-1] if audit.looks else None
        evidence = f" after {last.n_b_sims + last.n_a_sims} simulation(s)" if last else ""
        outcome = "the best stands" if audit.holds else "rolled back to the base"
        lines.append(f"audit of {named(audit.candidate)}{evidence}: {outcome}. {audit.reason}")
    return lines


def judged(audit: Audit, record, cand) -> bool:
    """Whether ``audit`` judged ``cand``: by its label, or (before audits recorded labels) as its iteration's kept one."""
    if audit.label:
        return audit.label == cand.label
    return record.kept == cand.label and audit.best == record.iteration


def rate_limits(run: RunDir, state, running: bool) -> dict:
    """Per provider endpoint and model: permits, 429s and seconds waited by the run's finished evaluations and
    its meta-LLM (as charged: the iteration in progress included); while it runs, the rate in use and the
    calls waiting now, as its driver last wrote them."""
    current = run.iteration(state.next_iteration)
    totals = add_tallies(dict(state.rate_limits), current.rate_limits if current else {})
    lanes = {lane: tally.model_dump() for lane, tally in totals.items()}
    live = run.rate_limits().get("lanes", {}) if running else {}
    for lane, view in live.items():
        now = {k: view[k] for k in ("rpm", "tpm", "source", "in_use_rpm", "waiting") if k in view}
        lanes[lane] = {
            **lanes.get(lane, {"calls": view.get("calls", 0), "limited": view.get("limited", 0), "waited": view.get("waited", 0.0)}),
            **now,
        }
    return lanes


def runs(repo) -> list[dict]:
    """Every run of a repository, newest last, as `evolver runs` lists them."""
    rows = []
    for run in list_runs(Path(repo)):
        if run.cut_off():
            rows.append({"run_id": run.run_id, "status": "cut off", "reason": run.cut_off()})
            continue
        info = status(run)
        rows.append(
            {k: info[k] for k in ("run_id", "status", "iterations_done", "iterations_target", "best", "cost", "cost_text", "domain")}
        )
    return rows


def best_gate_score(run: RunDir, state) -> Optional[float]:
    """The best's gate score: its candidate's, or the baseline's reference."""
    label = run.best_label(state)
    record = run.iteration(state.incumbent) if label else None
    cand = next((c for c in record.candidates if c.label == label), None) if record else None
    if cand is not None:
        return cand.gate_candidate
    return mean_reward(latest_rewards(run, "reference-g0"))


def _simulations(run: RunDir) -> tuple[int, Optional[float]]:
    """Simulations finished in the run, and the measured wall seconds per simulation of its
    finished evaluations (at the run's concurrency), or None before the first one ends."""
    done = sum(evaluation.lines_written() for evaluation in run.evaluations())
    seconds = count = 0.0
    for summary in (s for evaluation in run.evaluations() for s in evaluation.summaries()):
        seconds += summary.get("duration") or 0.0
        count += summary.get("num_simulations") or 0
    return done, (seconds / count if count else None)


def latest_rewards(run: RunDir, name: str) -> Optional[dict]:
    """An evaluation's rewards by task (metrics.rewards_by_task), from its largest result; None before it has one."""
    result = run.evaluation(name).latest_result()
    return None if result is None else rewards_by_task(result.simulations)


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
    return {
        **record.model_dump(exclude={"schema_version", "candidates", "charged"}),
        "candidates": [_candidate_info(run, lineage, record, c) for c in record.candidates],
    }


def _candidate_info(run: RunDir, lineage: Lineage, record, cand) -> dict:
    diff = lineage.diff(record.parent_commit, cand.commit) if cand.commit else ""
    flips: list[dict] = []
    candidate = gate_table(run, cand.label)
    # What the gate compared with: its parent's gate trials (a pool member), or the incumbent measured beside it, else its reference.
    incumbent = (
        gate_table(run, record.parent_label)
        if record.parent_label
        else latest_rewards(run, f"iter-{record.iteration:03d}-incumbent") or latest_rewards(run, f"reference-g{record.generation}")
    )
    if candidate and incumbent:
        flips = [{"task": task, "incumbent": was, "candidate": now} for task, was, now in flipped(candidate, incumbent)]
    best = run.best_label()
    return {
        **cand.model_dump(exclude={"responses"}),
        "iteration": record.iteration,
        "parent": parent_of(record),
        "gate_incumbent": record.gate_incumbent,
        "kept": record.kept == cand.label,
        "joined": bool(record.parent_label) and cand.status == "accepted",
        "best": bool(best) and best == cand.label,
        "evidence": _evidence(run, record, cand),
        "diff": diff,
        "flips": flips,
        "note": lineage.note(cand.commit) if cand.commit else "",
    }


def _evidence(run: RunDir, record, cand) -> str:
    """What the candidate's verdict stood on, and what the run's audit made of it, if it audited this one."""
    if cand.screen:
        screen = cand.screen
        text = (
            f"screen: {screen['child']:g} against its parent's {screen['parent']:g} over {screen['tasks']} analysis task(s) "
            f"({screen.get('reused', 0)} of them from its proposer's tries)"
        )
        if cand.gate_part:
            text += f"; gate, first part: {cand.gate_part['child']:.3f} against its parent's {cand.gate_part['parent']:.3f} over {cand.gate_part['tasks']} task(s)"
    elif cand.verdicts:
        beside = record.gate_stages[-1]["n_incumbent_sims"] if record.gate_stages else 0
        text = f"{cand.verdicts[-1]['n_candidate_sims']} simulation(s) of its own, {beside} of the incumbent beside it"
    else:
        return ""
    for audit in run.state().audits:
        if judged(audit, record, cand):
            text += f"; the run's audit against the base: {'it stands' if audit.holds else 'rolled back to the base'}. {audit.reason}"
    return text


def rollback(run: RunDir, to: str, reason: str) -> BestChange:
    """Move `best` (and the incumbent of a resumed run) back to an earlier kept candidate (a pool member, in a
    population run) or the base."""
    with run.lock():
        state = run.state()
        manifest = run.manifest()
        if to == "base":
            iteration, commit, label = 0, manifest.base_commit, ""
        elif state.pool or manifest.policy.get("population"):
            member = next((m for m in state.pool if m.label == to), None)
            if member is None:
                raise UsageError(
                    f"'{to}' is not a member of run {run.run_id}'s pool; members: {', '.join(m.label for m in state.pool) or 'none'} "
                    "(or 'base')"
                )
            iteration, commit, label = member.iteration, member.commit, member.label
        else:
            try:
                iteration = int(to)
            except ValueError:
                raise UsageError(f"--to takes an iteration number or 'base', not '{to}'") from None
            record = run.iteration(iteration)
            if record is None or record.winner is None:
                kept = [str(r.iteration) for r in run.iterations() if r.winner]
                raise UsageError(
                    f"iteration {to} is not a kept candidate of run {run.run_id}; kept: {', '.join(kept) or 'none'} (or 'base')"
                )
            commit, label = record.winner.commit, record.winner.label
        lineage = Lineage(run.repo, run.run_id)
        lineage.set_branch(lineage.best_branch, commit)
        change = BestChange(iteration=iteration, label=label or "base", commit=commit, reason=f"rollback: {reason}", at=time.time())
        state.best_history.append(change)
        state.incumbent, state.incumbent_commit, state.best_label = iteration, commit, label
        state.generation += 1  # a resumed run measures the restored incumbent afresh
        run.save_state(state)
        run.log("rollback", to=label or "base", commit=commit, reason=reason)
        return change
