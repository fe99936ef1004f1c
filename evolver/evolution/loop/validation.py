"""Validation: a candidate's edits applied and committed, refused when it cannot behave differently from
what was measured, and smoke-tested on one task before the gate spends anything on it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from evolver.data import EvalResult
from evolver.evolution.loop.context import RunContext
from evolver.evolution.noop import UNCHANGED, inert_edit_reason
from evolver.evolution.patch import Edit, PatchRejected, apply_edits
from evolver.store.lineage import commit_message
from evolver.store.runstate import CandidateRecord, IterationRecord, slug

SMOKE_TIMEOUT = 600.0
# A frame of agent/ in the traceback a candidate's process sent: its text is the candidate's, so only this shape is read from it.
FRAME = re.compile(r'File "[^"\n]*/(agent/[\w./-]+\.py)", line (\d+), in (\w+)\n')


class Validation:
    """A candidate committed, refused when inert, and smoke-tested."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def prepare(self, record: IterationRecord, cand: CandidateRecord, smoke: bool = True) -> None:
        """Commit the candidate, refuse it when it cannot behave differently, and (``smoke``) smoke-test it."""
        ctx = self.ctx
        wt = self.candidate_worktree(record, cand)
        if cand.status == "evaluating":
            inert = self.inert_reason(record, cand)
            if inert:
                cand.status, cand.reason = "refused", inert
        if cand.status == "evaluating" and smoke:
            ctx.step(f"iteration {record.iteration}: smoke test")
            # The smoke test's limit is the worker timeout's too, when that is shorter.
            result = ctx.measure(
                f"iter-{slug(cand.label)}-smoke",
                wt,
                ctx.manifest.analysis_tasks[:1],
                1,
                ctx.seed(record.generation),
                timeout=smoke_timeout(ctx),
                record=record,
            )
            why = broken(result)
            if why:
                cand.status, cand.reason = "invalid", f"smoke test failed: {why}"
        ctx.save(record)

    def inert_reason(self, record: IterationRecord, cand: CandidateRecord) -> Optional[str]:
        """Why the candidate cannot behave differently from what was already measured, if so: its
        agent/ equals its parent's or an earlier candidate's, or it edits only layers that are off."""
        ctx = self.ctx
        tree = ctx.lineage.agent_tree_of(cand.commit)
        if tree == ctx.lineage.agent_tree_of(record.parent_commit):
            return f"the patch {UNCHANGED}: nothing to measure"
        siblings = record.candidates[: record.candidates.index(cand)]
        for earlier in [c for r in ctx.run.iterations() if r.iteration < record.iteration for c in r.candidates] + siblings:
            if earlier.commit and ctx.lineage.agent_tree_of(earlier.commit) == tree:
                which = f"iteration {earlier.label}" if earlier.label.isdigit() else f"candidate {earlier.label}"
                return f"its agent/ is identical to {which}'s ({earlier.status}): nothing new to measure"
        parent = ctx.checkout(f"parent-{slug(cand.label)}", record.parent_commit)
        try:
            return inert_edit_reason(parent, ctx.run.worktree(f"iter-{slug(cand.label)}"))
        finally:
            ctx.lineage.remove_worktree(parent)

    def candidate_worktree(self, record: IterationRecord, cand: CandidateRecord) -> Path:
        """The candidate's worktree; its branch and commit are made once and reused on resume."""
        ctx = self.ctx
        name = slug(cand.label)
        branch = ctx.lineage.candidate_branch(name)
        existing = ctx.lineage.commit_of(branch)
        if existing:
            cand.branch, cand.commit = branch, existing
            return ctx.checkout(f"iter-{name}", existing)
        wt = ctx.checkout(f"iter-{name}", record.parent_commit)
        try:
            apply_edits(wt, [Edit(**e) for e in cand.edits])
        except PatchRejected as exc:
            cand.status, cand.reason = "invalid", str(exc)
            return wt
        message = commit_message(
            cand.title,
            cand.rationale,
            {
                "Evolver-Run": ctx.run.run_id,
                "Evolver-Iteration": str(record.iteration),
                "Evolver-Candidate": cand.label,
                "Evolver-Parent": record.parent_label or ("base" if record.parent == 0 else str(record.parent)),
            },
        )
        cand.branch, cand.commit = branch, ctx.lineage.commit_candidate(wt, branch, message)
        ctx.save(record)
        return wt


def smoke_timeout(ctx: RunContext) -> float:
    return min(SMOKE_TIMEOUT, ctx.cfg.worker_timeout)


def broken(result: EvalResult) -> Optional[str]:
    """Why the candidate that ran ``result`` cannot run at all (it failed to import, or raised), if so."""
    error = next((s.error for s in result.simulations if s.outcome == "failed" and s.error), "")
    return result.candidate_error or (error.splitlines()[0] + raised_at(error) if error else None)


def raised_at(error: str) -> str:
    """Where in agent/ the candidate raised, from its traceback: " (raised by this candidate's line 150 of agent/agent.py,
    in generate_next_message)"; "" without a frame of agent/. Told only the exception, a model proposes the same patch
    again; told the line's code too, a small one quotes that code as the current file's SEARCH text, so the line is named
    by its number and function only."""
    frames = FRAME.findall(error)
    if not frames:
        return ""
    path, line, function = frames[-1]
    return f" (raised by this candidate's line {line} of {path}, in {function})"
