"""The one-shot proposer: the meta-LLM reads the failure digest and the agent's files in one prompt (the files in
part when the whole would not fit: agent_source) and answers with a patch; a malformed answer, a SEARCH that
does not match or code that does not parse is sent back (prompts/oneshot/repair.md), and so is a patch the loop would refuse unmeasured: one
that cannot change a simulation, or that makes agent/ the same as an earlier candidate's, and a copy of one of the
guide's example patches (prompts/oneshot/revise.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

from evolver.data import RoleModel, RoleUsage
from evolver.errors import UsageError
from evolver.evaluation.backends.results import SWITCHES
from evolver.evaluation.scan import scan_tree
from evolver.evolution.digest import build_digest
from evolver.evolution.evidence import EarlierCandidate, Evidence, same_as_earlier
from evolver.evolution.harness_code import line_numbers
from evolver.evolution.noop import UNCHANGED, agent_files, inert_edit_reason
from evolver.evolution.patch import DIVIDER, REPLACE, SEARCH, ParseError, PatchRejected, Proposal, apply_edits, parse_proposal, syntax_error
from evolver.evolution.proposers import ProposalResult, Proposer, Request, meta_call
from evolver.evolution.proposers.agent_source import agent_texts, named_lines, versions
from evolver.evolution.proposers.prompts import Prompts
from evolver.evolution.scratch import removal, unguarded

CHARS_PER_TOKEN = 4  # rough, deliberately pessimistic for code and markdown
ANSWER_TOKENS = 2500  # room kept for the meta-LLM's answer
KEEP_RECENT = 5  # learnings kept before the digest is cut
MIN_DIGEST = 600  # characters of digest below which a proposal is not worth asking for
MAX_QUOTED = 12  # lines of the parent quoted where the prompt starts a patch


class OneShot(Proposer):
    name = "oneshot"

    @classmethod
    def meta_shape(cls, meta) -> dict:
        return {"answer_tokens": ANSWER_TOKENS}

    @classmethod
    def meta_tokens(cls, cfg, one_request: int) -> tuple[int, int]:
        return one_request, 3 * one_request  # a prompt and its answer, asked again at most twice

    def propose(self, request: Request) -> ProposalResult:
        focus = request.focus
        evidence = request.evidence
        digest = build_digest(
            evidence.analysis,
            evidence.analysis_dir,
            max_chars=request.digest_chars,
            focus=focus,
            notes=tuple(evidence.triage_notes()),
            harness=evidence.harness_line,
            overview=evidence.harness_overview(tools=False),
            turn=evidence.changed_turn,
        )
        start = starting_patch(evidence)
        request.workdir.mkdir(parents=True, exist_ok=True)
        (request.workdir / "digest.md").write_text(
            digest + (f"\n\n# Where to start\n\n{start}\n" if start else "")
        )  # what the meta-LLM saw
        files = agent_texts(request.parent)
        messages = build_messages(
            request.prompts_dir,
            request.guide,
            versions(files, named_lines([digest, start])),
            digest,
            request.learnings,
            request.context_tokens,
            start,
        )
        request.progress(1, 3, "answering with a patch")
        started = time.monotonic()
        outcome = propose(
            request.meta,
            messages,
            request.parent,
            prompts_dir=request.prompts_dir,
            llm_retries=request.llm_retries,
            identifiers=request.identifiers,
            earlier=evidence.earlier,
            guide=request.guide,
        )
        outcome.stats = {
            "answers": len(outcome.responses),
            "tokens": outcome.usage.tokens,
            "seconds": round(time.monotonic() - started, 1),
            "digest": str(request.workdir / "digest.md"),
        }
        return outcome


def starting_patch(evidence: Evidence) -> str:
    """What the digest's overview points to, as a patch: the one that takes out the lines of the parent that make the
    harness's most common change when the investigating proposer would be offered that (Place.removable_run), else its
    beginning, those lines quoted as a SEARCH block; and the whole patch that switches off the one layer making every
    change, when there is one; "" when there is neither. A model without tools cannot read lines it is only pointed to,
    and a small one copies the guide's examples instead."""
    parts = []
    where = evidence.first_place()
    path = evidence.parent / where.path if where is not None and where.writes and evidence.parent else None
    cut = _taking_out(path, where) if path else None
    quoted = _quote(path, where) if path and not cut else ""
    if cut or quoted:
        one = len(where.writes) == 1
        them = "it" if one else "them"
        head = (
            f"If {line_numbers(where.writes)} of {where.path} ({where.function}{', ' + where.part if where.part else ''}) "
            f"{'is' if one else 'are'} the fault, "
        )
        if cut:
            does = f"removes the test on line {where.writes[0]}, keeping the lines it guards" if cut[2] else f"removes {them}"
            parts.append(
                f"{head}this patch {does}:\nFILE: {where.path}\n{SEARCH}\n{cut[0]}\n{DIVIDER}\n"
                f"{cut[1] + chr(10) if cut[1] else ''}{REPLACE}\n"
                f"To correct {them} instead, keep that SEARCH and write after {DIVIDER} the lines as they should be."
            )
        else:
            parts.append(f"{head}a patch that corrects or removes {them} begins:\nFILE: {where.path}\n{SEARCH}\n{quoted}\n{DIVIDER}")
    switch = evidence.layer_to_switch_off()
    line = f"{switch} = true"
    toml = _text(evidence.parent / SWITCHES) if switch and evidence.parent else ""
    if toml and toml.count(line) == 1:
        parts.append(
            f"To try the agent without the {switch[:2].upper()} layer, which makes every change the harness made in these failures, "
            f"the patch is:\nFILE: {SWITCHES}\n{SEARCH}\n{line}\n{DIVIDER}\n{switch} = false\n{REPLACE}"
        )
    return "\n\n".join(parts)


def _taking_out(path: Path, where) -> Optional[tuple[str, str, bool]]:
    """(SEARCH, REPLACE, whether only an `if`'s test goes) of the patch that takes out the lines where.removable_run() names:
    an `if` that leaves messages out loses its test and keeps its body (scratch.unguarded), other lines go as the
    investigating proposer's remove_lines would take them; None when that would be refused. A small model given only the
    lines to start from writes them back "corrected" (upper() as lower(), one cut's length for another) rather than removed."""
    run = where.removable_run()
    before = _text(path) if run else ""
    test_only = unguarded(before, *run) if before and where.losing else None
    after = test_only or (removal(before, where.path, *run) if before else None)
    hunk = _hunk(before, after) if after is not None else None
    return (*hunk, test_only is not None) if hunk else None


def _hunk(before: str, after: str) -> Optional[tuple[str, str]]:
    """(SEARCH, REPLACE) that turns ``before`` into ``after`` where their lines differ, widened downwards until SEARCH occurs
    once in ``before``; None when it cannot. A removal is an empty REPLACE (a blank line stays): shown one that keeps the
    line above in both, a small model writes REPLACE empty and the file no longer parses."""
    old, new = before.splitlines(), after.splitlines()
    top = 0
    while top < min(len(old), len(new)) and old[top] == new[top]:
        top += 1
    tail = 0
    while tail < min(len(old), len(new)) - top and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    old_end, new_end = len(old) - tail, len(new) - tail
    while old_end <= len(old):
        search = "\n".join(old[top:old_end])
        if search.strip() and before.count(search) == 1:
            return search, "\n".join(new[top:new_end])
        old_end, new_end = old_end + 1, new_end + 1
    return None


def _quote(path: Path, where) -> str:
    """The lines where.writes names (from the first to the last, or the first run of them when that is long), widened
    downwards within the function until they occur once in the file, as SEARCH needs; "" when they cannot."""
    text = _text(path)
    lines = text.splitlines()
    first, last = where.writes[0], where.writes[-1]
    if last - first >= MAX_QUOTED:
        last = next((a for a, b in zip(where.writes, where.writes[1:]) if b != a + 1), where.writes[-1])
    while last <= min(where.end, len(lines)):
        quoted = "\n".join(lines[first - 1 : last])
        if quoted.strip() and text.count(quoted) == 1:
            return quoted
        last += 1
    return ""


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def build_messages(
    prompts_dir: Path, guide: str, agent_files: Sequence[str], digest: str, history: list[str], context_tokens: int, start: str = ""
) -> list[dict]:
    """The meta prompt, shrunk to fit: older history entries go first, then the agent's files are shown shorter
    (``agent_files``: agent_source.versions, whole first), then the digest is cut; ``start`` (starting_patch) is never
    cut: a small model shown it cut goes on copying the prompt from where its quoted lines end."""
    prompts = Prompts("oneshot", prompts_dir)
    system = prompts.text("system", harness_guide=guide)
    budget = (context_tokens - ANSWER_TOKENS) * CHARS_PER_TOKEN - len(system)
    history = list(history)
    start = start or prompts.short("no_start")

    def render(d: str, h: list[str], files: str) -> str:
        return prompts.text("propose", agent_files=files, digest=d, history="\n".join(h) or prompts.short("no_history"), start=start)

    shown, shorter = history, 0
    text = render(digest, shown, agent_files[0])
    while len(text) > budget and len(history) > KEEP_RECENT:  # oldest learnings go first
        history.pop(0)
        shown = [prompts.short("history_cut"), *history]
        text = render(digest, shown, agent_files[0])
    while len(text) > budget and shorter + 1 < len(agent_files):  # then functions the failures do not point to are shortened
        shorter += 1
        text = render(digest, shown, agent_files[shorter])
    if len(text) > budget:  # then the digest is cut, down to a useful minimum
        cut_note = prompts.short("digest_cut")
        room = len(digest) - (len(text) - budget) - len(cut_note)
        if room < MIN_DIGEST:
            raise UsageError(
                f"the meta prompt needs about {(len(system) + len(text)) // CHARS_PER_TOKEN + ANSWER_TOKENS} tokens but meta_context_tokens is {context_tokens}; "
                "raise meta_context_tokens or use a meta model with a larger context"
            )
        text = render(digest[:room] + cut_note, shown, agent_files[shorter])
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
    guide: str = "",
) -> ProposalResult:
    """Ask for a patch; a malformed answer, one whose SEARCH text does not match, or one the loop would refuse
    unmeasured (``earlier``: the run's candidates so far) is sent back with the error up to max_attempts times;
    proposal None means no valid patch. Code that does not parse and a copy of one of the ``guide``'s example patches
    are sent back while attempts remain, and measured when none do."""
    outcome = ProposalResult(proposal=None, prompt_chars=sum(len(m["content"]) for m in messages))
    conversation = list(messages)
    prompts = Prompts("oneshot", prompts_dir)
    for attempt in range(1, max_attempts + 1):
        text, usage = _complete(role, conversation, llm_retries)
        outcome.responses.append(text)
        outcome.usage = outcome.usage.add(usage)
        try:
            proposal = parse_proposal(text)
            findings, why, broken = _dry_run(checkout, proposal, identifiers, earlier)
        except (ParseError, PatchRejected) as exc:
            outcome.errors.append(str(exc))
            if isinstance(exc, PatchRejected) and not exc.retryable:
                outcome.proposal, outcome.refused = proposal, str(exc)  # a verdict on the patch, not a format slip
                return outcome
            error = exc.hinted("SEARCH") if isinstance(exc, PatchRejected) else str(exc)
            conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": prompts.text("repair", error=error)}]
            continue
        if not why and broken and attempt < max_attempts:  # sent back with the parser's message; judged invalid when no attempt remains
            outcome.errors.append(broken)
            error = f"{broken}. The lines after {DIVIDER} take the place of all the SEARCH lines: write every line that stays"
            conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": prompts.text("repair", error=error)}]
            continue
        if not why and attempt < max_attempts and (example := copied_example(proposal, guide)):
            why = f"it is the guide's example patch '{example}': the examples show the format, not a fix for these failures"
        if why and not findings:  # not measured, or a copy while attempts remain: asked again
            outcome.errors.append(why)
            conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": prompts.text("revise", error=why)}]
            continue
        outcome.proposal = proposal
        if findings:  # a verdict on the patch: refused before it is committed or run
            outcome.findings = [str(f) for f in findings]
            more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
            outcome.refused = f"refused by the static scan: {findings[0]}{more}"
        return outcome
    return outcome


def copied_example(proposal: Proposal, guide: str) -> str:
    """The title of the guide's example patch that the proposal copies ("" if none): the SEARCH and REPLACE text of every edit
    but the layer switches is in the guide, and one of them writes something. A small model's patch is often such a copy, a
    layer switched on or off with it, whatever the digest says."""
    edits = [e for e in proposal.edits if e.path != SWITCHES]
    code = [e for e in edits if e.replace.strip()]
    if not guide or not code or not all(e.search.strip() in guide and e.replace.strip() in guide for e in edits):
        return ""
    title = guide.rfind("TITLE:", 0, guide.find(code[0].replace.strip()))
    return guide[title + len("TITLE:") : guide.find("\n", title)].strip() if title >= 0 else "an example"


def _dry_run(
    checkout: Path, proposal: Proposal, identifiers: frozenset, earlier: Sequence[EarlierCandidate]
) -> tuple[list, Optional[str], str]:
    """Apply the edits to a throwaway copy of agent/ to catch SEARCH mismatches early, and scan the result
    (evolver.evaluation.scan): its findings (empty when it is clean), why the loop would refuse it unmeasured
    (None when it would not), and why its code does not parse ("" when it does)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(checkout / "agent", Path(tmp) / "agent", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        broken = syntax_error(apply_edits(Path(tmp), proposal.edits, check_syntax=False))
        findings = [f for f in scan_tree(Path(tmp), identifiers) if f.rule != "unreadable"]
        files = agent_files(Path(tmp))
        same = same_as_earlier(earlier, files)
        if same is not None:
            return findings, f"it makes agent/ the same as {same.verdict()}", broken
        if files == agent_files(checkout):
            copied = all(e.search.strip() == e.replace.strip() for e in proposal.edits)  # a small model, given the lines to start from
            return (
                findings,
                f"it {UNCHANGED}"
                + (
                    f": its lines after {DIVIDER} are its SEARCH lines unchanged; write them as they "
                    "should be, corrected or without what does harm"
                    if copied
                    else ""
                ),
                broken,
            )
        return findings, inert_edit_reason(checkout, Path(tmp)), broken
