"""The one-shot proposer: the meta-LLM reads the failure digest and the agent's files in one prompt and
answers with a patch; a malformed answer or a SEARCH that does not match is sent back (prompts/repair.md),
and so is a patch the loop would refuse unmeasured: one that cannot change a simulation, or that makes
agent/ the same as an earlier candidate's (prompts/revise.md)."""

from __future__ import annotations

import string
import time
from pathlib import Path
from typing import Optional, Sequence

from evolver.data import RoleModel, RoleUsage
from evolver.errors import UsageError
from evolver.evaluation.scan import in_baseline, scan_tree
from evolver.evolution.digest import build_digest
from evolver.evolution.evidence import EarlierCandidate, same_as_earlier
from evolver.evolution.noop import UNCHANGED, agent_files, inert_edit_reason
from evolver.evolution.patch import ParseError, PatchRejected, Proposal, apply_edits, parse_proposal
from evolver.evolution.proposers import Outcome, Request, meta_call

CHARS_PER_TOKEN = 4  # rough, deliberately pessimistic for code and markdown
ANSWER_TOKENS = 2500  # room kept for the meta-LLM's answer
KEEP_RECENT = 5  # learnings kept before the digest is cut
MIN_DIGEST = 600  # characters of digest below which a proposal is not worth asking for


class OneShot:
    name = "oneshot"

    def propose(self, request: Request) -> Outcome:
        focus = request.focus
        digest = build_digest(request.evidence.analysis, request.evidence.analysis_dir, max_chars=request.digest_chars, focus=focus,
                              notes=tuple(request.evidence.triage_notes()), harness=request.evidence.harness_line,
                              overview=request.evidence.harness_overview())
        request.workdir.mkdir(parents=True, exist_ok=True)
        (request.workdir / "digest.md").write_text(digest)  # what the meta-LLM saw
        messages = build_messages(request.prompts_dir, request.guide, agent_files_text(request.parent), digest, request.learnings,
                                  request.context_tokens)
        request.progress(1, 3, "answering with a patch")
        started = time.monotonic()
        outcome = propose(request.meta, messages, request.parent, prompts_dir=request.prompts_dir, llm_retries=request.llm_retries,
                          identifiers=request.identifiers, earlier=request.evidence.earlier)
        outcome.stats = {"answers": len(outcome.responses), "tokens": outcome.usage.tokens, "seconds": round(time.monotonic() - started, 1),
                         "digest": str(request.workdir / "digest.md")}
        return outcome


def load_template(prompts_dir: Path, name: str) -> string.Template:
    path = Path(prompts_dir) / name
    if not path.exists():
        raise UsageError(f"prompt template {path} is missing; restore it from the evolver repository")
    return string.Template(path.read_text())


def agent_files_text(checkout: Path) -> str:
    """The evolvable agent files (not the pristine templates) as fenced blocks."""
    parts = []
    for path in sorted((checkout / "agent").rglob("*")):
        rel = path.relative_to(checkout).as_posix()
        if path.is_file() and not in_baseline(rel) and "__pycache__" not in rel and path.suffix in (".py", ".toml", ".md"):
            parts.append(f"## FILE: {rel}\n```\n{path.read_text()}\n```")
    return "\n\n".join(parts)


def build_messages(prompts_dir: Path, guide: str, agent_files: str, digest: str, history: list[str], context_tokens: int) -> list[dict]:
    """The meta prompt, shrunk to fit: older history entries go first, then the digest is cut."""
    system = load_template(prompts_dir, "system.md").safe_substitute(harness_guide=guide)
    user_t = load_template(prompts_dir, "propose.md")
    budget = (context_tokens - ANSWER_TOKENS) * CHARS_PER_TOKEN - len(system)
    history = list(history)

    def render(d: str, h: list[str]) -> str:
        return user_t.safe_substitute(agent_files=agent_files, digest=d, history="\n".join(h) or "None yet: this is the first attempt.")

    shown = history
    text = render(digest, shown)
    while len(text) > budget and len(history) > KEEP_RECENT:  # oldest learnings go first
        history.pop(0)
        shown = ["(older attempts omitted to fit the context)", *history]
        text = render(digest, shown)
    if len(text) > budget:  # then the digest is cut, down to a useful minimum
        cut_note = "\n... (digest cut to fit the context)"
        room = len(digest) - (len(text) - budget) - len(cut_note)
        if room < MIN_DIGEST:
            raise UsageError(
                f"the meta prompt needs about {(len(system) + len(text)) // CHARS_PER_TOKEN + ANSWER_TOKENS} tokens but meta_context_tokens is {context_tokens}; "
                "raise meta_context_tokens or use a meta model with a larger context"
            )
        text = render(digest[:room] + cut_note, shown)
    return [{"role": "system", "content": system}, {"role": "user", "content": text}]


def _complete(role: RoleModel, messages: list[dict], retries: int) -> tuple[str, RoleUsage]:
    response, usage = meta_call(role, messages, retries, answer_tokens=ANSWER_TOKENS)
    return response.choices[0].message.content or "", usage


def propose(
    role: RoleModel,
    messages: list[dict],
    checkout: Path,
    *,
    prompts_dir: Path,
    max_attempts: int = 3,
    llm_retries: int = 4,
    identifiers: frozenset = frozenset(),
    earlier: Sequence[EarlierCandidate] = (),
) -> Outcome:
    """Ask for a patch; a malformed answer, one whose SEARCH text does not match, or one the loop would refuse
    unmeasured (``earlier``: the run's candidates so far) is sent back with the error up to max_attempts times;
    proposal None means no valid patch."""
    outcome = Outcome(proposal=None, prompt_chars=sum(len(m["content"]) for m in messages))
    conversation = list(messages)
    repair, revise = load_template(prompts_dir, "repair.md"), load_template(prompts_dir, "revise.md")
    for _ in range(max_attempts):
        text, usage = _complete(role, conversation, llm_retries)
        outcome.responses.append(text)
        outcome.usage = outcome.usage.add(usage)
        try:
            proposal = parse_proposal(text)
            findings, unchanged = _dry_run(checkout, proposal, identifiers, earlier)
        except (ParseError, PatchRejected) as exc:
            outcome.errors.append(str(exc))
            if isinstance(exc, PatchRejected) and not exc.retryable:
                outcome.proposal, outcome.refused = proposal, str(exc)  # a verdict on the patch, not a format slip
                return outcome
            conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": repair.safe_substitute(error=str(exc))}]
            continue
        if unchanged and not findings:
            outcome.errors.append(unchanged)
            conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": revise.safe_substitute(error=unchanged)}]
            continue
        outcome.proposal = proposal
        if findings:  # a verdict on the patch: refused before it is committed or run
            outcome.findings = [str(f) for f in findings]
            more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
            outcome.refused = f"refused by the static scan: {findings[0]}{more}"
        return outcome
    return outcome


def _dry_run(checkout: Path, proposal: Proposal, identifiers: frozenset, earlier: Sequence[EarlierCandidate]) -> tuple[list, Optional[str]]:
    """Apply the edits to a throwaway copy of agent/ to catch SEARCH mismatches early, and scan the result
    (evolver.evaluation.scan): its findings (empty when it is clean), and why the loop would refuse it
    unmeasured (None when it would not)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(checkout / "agent", Path(tmp) / "agent", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        apply_edits(Path(tmp), proposal.edits, check_syntax=False)
        # Code that does not parse is judged later, as an invalid candidate, with the parser's own message.
        findings = [f for f in scan_tree(Path(tmp), identifiers) if f.rule != "unreadable"]
        files = agent_files(Path(tmp))
        same = same_as_earlier(earlier, files)
        if same is not None:
            return findings, f"it makes agent/ the same as {same.verdict()}"
        if files == agent_files(checkout):
            return findings, f"it {UNCHANGED}"
        return findings, inert_edit_reason(checkout, Path(tmp))
