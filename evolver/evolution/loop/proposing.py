"""Proposing: a candidate asked of the proposer, with the evidence, the earlier candidates and the learnings
it may read; a proposal cut off by a kill is set aside and asked again."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from evolver import events as ev
from evolver import ratelimit
from evolver.data import EvalResult, RoleUsage
from evolver.evolution.evidence import EarlierCandidate, Evidence, flipped
from evolver.evolution.loop.context import RunContext, member_trials
from evolver.evolution.noop import agent_digest, agent_files
from evolver.evolution.plan import proposer_budget
from evolver.evolution.proposers import Request
from evolver.evolution.triage import triage
from evolver.store.rundir import measured
from evolver.store.runstate import FINAL_STATUSES, CandidateRecord, IterationRecord, slug


class Proposing:
    """A candidate asked of the run's proposer."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def propose(self, record: IterationRecord, cand: CandidateRecord, analysis: EvalResult, analysis_name: str) -> None:
        """Ask the proposer for ``cand`` with ``analysis`` (the evaluation ``analysis_name``) as the evidence it reads."""
        ctx = self.ctx
        name = slug(cand.label)
        parent_tree = ctx.checkout(f"parent-{name}", record.parent_commit)
        workdir = ctx.run.proposal_dir(name)
        session = self.set_aside_interrupted(record, workdir)
        tries = iter(range(1, 1_000_000))

        def try_agent(root: Path, tasks: list[str]) -> tuple[EvalResult, Path]:
            """The proposer's scratch agent on analysis tasks, paired with the analysis's first trial (same seed); which
            agent it ran is recorded (its digest, taken here, on the trusted side), so a screen can reuse the try."""
            name_ = f"propose-{name}-s{session}-try{next(tries)}"
            tried = {"evaluation": name_, "agent": agent_digest(agent_files(root)), "tasks": list(tasks)}
            with ctx.saving:
                cand.tries.append(tried)
            return ctx.measure(name_, root, tasks, 1, ctx.seed(record.generation), record=record), ctx.run.evaluation(name_).path

        request = Request(
            label=cand.label,
            focus=(record.candidates.index(cand), len(record.candidates)),
            parent=parent_tree,
            evidence=Evidence(
                analysis,
                ctx.run.evaluation(analysis_name).path,
                self.earlier_candidates(record),
                triage(
                    {
                        name: records
                        for name, records in measured(ctx.run.repo, ctx.run.run_id).items()
                        if name.startswith("evals/analysis-")
                    }
                ),
                parent=parent_tree,
            ),
            learnings=self.learnings(),
            guide=ctx.guide,
            identifiers=ctx.identifiers,
            meta=ctx.cfg.role("meta", ctx.local_api_base),
            llm_retries=ctx.cfg.llm_retries,
            context_tokens=ctx.cfg.meta_context_tokens,
            budget=proposer_budget(ctx.cfg),
            workdir=workdir,
            prompts_dir=ctx.prompts_dir,
            digest_chars=ctx.cfg.digest_chars,
            try_agent=try_agent,
            progress=lambda turn, turns, doing: ctx.events.emit(ev.Proposing(cand.label, turn, turns, doing)),
        )
        with ratelimit.tracking() as limits:  # the meta-LLM's calls, made in this thread
            outcome = ctx.proposer.propose(request)
        cand.responses, cand.errors, cand.findings = outcome.responses, outcome.errors, outcome.findings
        cand.investigation = outcome.stats
        if outcome.proposal is None:
            answers = (
                f" after {len(outcome.responses)} answer(s)" if outcome.responses else ""
            )  # the one-shot proposer's; a session's are its turns
            cand.status, cand.reason = "no_patch", f"no valid patch{answers}: {outcome.errors[-1] if outcome.errors else 'empty'}"
        else:
            p = outcome.proposal
            cand.title, cand.rationale = p.title, p.rationale
            cand.edits = [dataclasses.asdict(e) for e in p.edits]
            cand.status, cand.reason = ("refused", outcome.refused) if outcome.refused else ("evaluating", "")
        ctx.add_usage(record, "meta", outcome.usage, limits)  # saves the candidate's outcome with the meta-LLM's charge
        ctx.run.log("proposed", iteration=record.iteration, candidate=cand.label, status=cand.status, title=cand.title)
        ctx.lineage.remove_worktree(parent_tree)

    def set_aside_interrupted(self, record: IterationRecord, workdir: Path) -> int:
        """A proposal cut off by a kill is asked again, never half-applied: its transcript is kept beside
        the new one and what its meta-LLM used is charged now. Returns the new session's number."""
        ctx = self.ctx
        done = sorted(workdir.glob("interrupted-*.json"))
        current = workdir / "transcript.json"
        if current.exists():
            try:
                spent = RoleUsage(**json.loads(current.read_text()).get("usage", {}))
            except (OSError, ValueError, TypeError):
                spent = RoleUsage()
            current.rename(workdir / f"interrupted-{len(done) + 1}.json")
            ctx.add_usage(record, "meta", spent)
            done.append(current)
        return len(done) + 1

    def earlier_candidates(self, record: IterationRecord) -> list[EarlierCandidate]:
        """The run's candidates before this iteration, as a proposer may see them: diff, verdict, flipped gate tasks."""
        ctx = self.ctx
        labels = {task: f"G{i + 1}" for i, task in enumerate(ctx.manifest.gate_tasks)}
        out = []
        for r in ctx.run.iterations():
            if r.iteration >= record.iteration:
                break
            # What each candidate was judged against: its pool parent's trials, or the incumbent beside it, else its reference.
            incumbent = (
                member_trials(ctx.latest_rewards, r.parent_label)
                if r.parent_label
                else ctx.latest_rewards(f"iter-{r.iteration:03d}-incumbent") or ctx.latest_rewards(f"reference-g{r.generation}") or {}
            )
            for c in r.candidates:
                table = member_trials(ctx.latest_rewards, c.label)
                out.append(
                    EarlierCandidate(
                        label=c.label,
                        title=c.title,
                        status=c.status,
                        reason=c.reason,
                        diff=ctx.lineage.diff(r.parent_commit, c.commit) if c.commit else "",
                        flips=tuple(f"{labels.get(task, '?')}: {was:.2f} -> {now:.2f}" for task, was, now in flipped(table, incumbent)),
                        gate_delta=None if c.gate_candidate is None or r.gate_incumbent is None else c.gate_candidate - r.gate_incumbent,
                        agent=agent_digest(ctx.lineage.agent_files_at(c.commit)) if c.commit else "",
                    )
                )
        return out

    def learnings(self) -> list[str]:
        ctx = self.ctx
        lines = [prior_learnings(ctx.run.prior_learnings_file)] if ctx.run.prior_learnings_file.exists() else []
        for r in ctx.run.iterations():
            if r.status not in FINAL_STATUSES:
                continue
            for c in r.candidates:
                delta = (
                    ""
                    if c.gate_candidate is None or r.gate_incumbent is None
                    else f", gate {r.gate_incumbent:.3f} -> {c.gate_candidate:.3f}"
                )
                lines.append(f'- Iteration {c.label}: "{c.title or "(no patch)"}" -> {c.status}{delta}. {c.reason}')
        return lines


PRIOR_LEARNINGS_CHARS = 4000  # of the learnings brought from earlier work: the end, where an appended file keeps its latest


def prior_learnings(path: Path) -> str:
    """The learnings a run brought from earlier work (learnings_file, e.g. auto-harness's workspace/learnings.md)
    as the first entry of its learnings: one entry, however many lines the file has."""
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    if len(text) > PRIOR_LEARNINGS_CHARS:
        text = "[... the beginning is cut]\n" + text[-PRIOR_LEARNINGS_CHARS:]
    return f"- Before this run (findings from earlier work, not tested here):\n{text}"
