"""Turn the failing trajectories of an analysis evaluation into a compact, readable digest.

Only analysis-set results reach here: gate and holdout trajectories never reach
the meta-LLM. Data values (ids, names, amounts) are replaced with placeholders
so the meta-LLM learns procedures, not answers; check kinds, action names and
argument names stay visible.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from evolver.data import EvalResult, SimRecord

# Tokens that carry data: anything with a digit (ids, dates, amounts), e-mails, quoted text.
_DATA_TOKEN = r"[\w.+-]+@[\w-]+\.[\w.]+|#?\b[\w-]*\d[\w.:/-]*\b|'[^'\n]{1,80}'|\"[^\"\n]{1,80}\""
# Lowercase words without digits ("completed", "economy") are enum-like procedure, not data.
_ENUM_LIKE = re.compile(r"^[a-z_]{2,20}$")


class Masker:
    """Consistent placeholders within one trajectory: the same value gets the same <Vn>."""

    def __init__(self, values: set[str] = frozenset()):
        self.names: dict[str, str] = {}
        known = sorted((v for v in values if len(v) >= 2 and not _ENUM_LIKE.match(v)), key=len, reverse=True)
        # One pass over the text, so a placeholder is never masked again; longest values first.
        self.pattern = re.compile("|".join([re.escape(v) for v in known] + [_DATA_TOKEN]))

    def name(self, value: str) -> str:
        if _ENUM_LIKE.match(value):
            return value
        quote = value[0] if value[:1] in "'\"" and value[-1:] == value[:1] and len(value) > 1 else ""
        key = value[1:-1] if quote else value
        if key not in self.names:
            self.names[key] = f"<V{len(self.names) + 1}>"
        return f"{quote}{self.names[key]}{quote}"

    def text(self, text: str) -> str:
        return self.pattern.sub(lambda m: self.name(m.group(0)), text)

    def args(self, arguments: dict) -> str:
        return ", ".join(f"{k}={self.name(json.dumps(v) if not isinstance(v, str) else v)}" for k, v in arguments.items())

    def json_shape(self, text: str) -> str:
        """A tool result with its keys kept and every value masked."""
        try:
            data = json.loads(text)
        except (ValueError, TypeError):
            return self.text(str(text))

        def walk(x):
            if isinstance(x, dict):
                return {k: walk(v) for k, v in x.items()}
            if isinstance(x, list):
                return [walk(v) for v in x[:3]] + (["..."] if len(x) > 3 else [])
            return self.name(json.dumps(x) if not isinstance(x, str) else x)

        return json.dumps(walk(data))


def leaf_values(obj) -> set[str]:
    if isinstance(obj, dict):
        return set().union(*(leaf_values(v) for v in obj.values())) if obj else set()
    if isinstance(obj, list):
        return set().union(*(leaf_values(v) for v in obj)) if obj else set()
    return {str(obj)} if obj is not None and not isinstance(obj, bool) else set()


def failed_checks(breakdown: dict) -> list[str]:
    """Name each check that failed, with expected action and argument names but no values."""
    out = []
    db = breakdown.get("db_check") or {}
    if db and not db.get("db_match", True):
        out.append("wrong final database state")
    for check in breakdown.get("action_checks") or []:
        if not check.get("action_match", True):
            action = check.get("action") or {}
            out.append(f"expected action missing or wrong: {action.get('name')}({', '.join(action.get('arguments') or {})})")
    for check in breakdown.get("env_assertions") or []:
        if not check.get("met", True):
            func = (check.get("env_assertion") or {}).get("func_name", "assertion")
            out.append(f"environment assertion failed: {func}")
    for check in breakdown.get("communicate_checks") or []:
        if not check.get("met", True):
            out.append("required information not communicated to the user")
    for check in breakdown.get("nl_assertions") or []:
        if not check.get("met", True):
            out.append("natural-language expectation not met")
    return out


@dataclass
class Failure:
    label: str
    record: SimRecord
    checks: list[str]
    goal: str
    actions: list[str]
    transcript: list[str] = field(default_factory=list)
    mask: Masker = field(default_factory=Masker)  # this trajectory's placeholders: the turn view shows the same <Vn>

    @property
    def signature(self) -> str:
        kinds = sorted(set(self.checks)) or [f"ended by {self.record.termination_reason}"]
        return "; ".join(kinds)


def load_messages(result_dir: Path, record: SimRecord) -> list[dict]:
    if not record.trajectory_file:
        return []
    try:
        return json.loads((result_dir / record.trajectory_file).read_text()).get("messages") or []
    except (OSError, ValueError):
        return []


def describe(label: str, record: SimRecord, messages: list[dict], more_values=()) -> Failure:
    """``more_values``: data values seen elsewhere in the simulation (the model's own calls, in its turn view), masked alike."""
    expected = [c.get("action") or {} for c in record.reward_breakdown.get("action_checks") or []]
    values = set(more_values)
    for m in messages:
        for call in m.get("tool_calls") or []:
            values |= leaf_values(call.get("arguments"))
    for action in expected:
        values |= leaf_values(action.get("arguments"))
    mask = Masker(values)
    user_turns = [m for m in messages if m.get("role") == "user" and m.get("content")]
    goal = mask.text(user_turns[0]["content"])[:300] if user_turns else "(no user message)"
    actions, transcript = [], []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        for call in m.get("tool_calls") or []:
            actions.append(f"{call.get('name')}({mask.args(call.get('arguments') or {})})")
            transcript.append(f"{role} -> tool {call.get('name')}({mask.args(call.get('arguments') or {})})")
        if role == "tool":
            shown = mask.json_shape(content)[:240]
            if m.get("error"):
                actions.append(f"  error: {shown}")
            transcript.append(f"tool{' ERROR' if m.get('error') else ''}: {shown}")
        elif content:
            transcript.append(f"{role}: {mask.text(content)[:300]}")
    checks = failed_checks(record.reward_breakdown)
    if record.outcome == "failed" and record.error:
        checks.append("the agent's code raised an exception")
        actions.append("  exception: " + mask.text(record.error.splitlines()[0])[:200])
    return Failure(label=label, record=record, checks=checks, goal=goal, actions=actions, transcript=transcript, mask=mask)


def build_digest(
    result: EvalResult,
    result_dir: Path,
    max_chars: int = 8000,
    full_examples: int = 2,
    focus: tuple[int, int] = (0, 1),
    notes: tuple[str, ...] = (),
    harness: Optional[Callable[[SimRecord], str]] = None,
    overview: str = "",
    turn: Optional[Callable[[SimRecord], str]] = None,
) -> str:
    """A markdown digest of the failures in `result` (an analysis-set evaluation); ``harness`` says in one line what the
    harness changed in a simulation, ``overview`` where to look first, ``turn`` a simulation's first changed turn as the model
    saw it, "" when none changed (evolver.evolution.evidence.Evidence.harness_line, harness_overview, turn).

    ``focus`` (i, k): the digest for candidate i of k proposed at once. Every candidate sees all
    failure patterns, but the full trajectories and the stated focus are patterns i, i+k, ...,
    so that the k proposals address different failures instead of repeating one fix."""
    labels = {task: f"T{i + 1}" for i, task in enumerate(result.task_ids)}
    failures = [
        describe(labels.get(r.task_id, "T?"), r, load_messages(result_dir, r))
        for r in sorted(result.simulations, key=lambda r: (r.task_id, r.trial))
        if r.outcome != "infra_error" and (r.reward or 0.0) < 1.0
    ]
    scored = [r for r in result.simulations if r.outcome != "infra_error"]
    head = [
        f"# Failure digest: {len(failures)} of {len(scored)} analysis simulations failed",
        f"Tasks are labelled T1..T{len(labels)}; data values are shown as <Vn> placeholders.",
        *(
            [
                "'The harness changed' compares what tau2 gave the agent and took back with what the model was sent and answered; "
                "it names the turns and the lines of agent/agent.py that run there."
            ]
            if harness
            else []
        ),
        *([overview[0].upper() + overview[1:] + "."] if overview else []),
        *([f"Tasks that may be only noise (triage): {'; '.join(notes)}"] if notes else []),
        "",
    ]
    if not failures:
        return "\n".join(head + ["No failures on the analysis set."])
    groups: dict[str, list[Failure]] = defaultdict(list)
    for f in failures:
        groups[f.signature].append(f)
    body: list[str] = []
    for n, (signature, members) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1])), 1):
        body.append(f"## Pattern {n}: {signature} ({len(members)} simulation(s))")
        alike: dict[tuple, list[Failure]] = defaultdict(list)  # told once: a small model reads eight copies as eight facts
        for f in members:
            ended = f"ended by {f.record.termination_reason} after {f.record.steps} messages"
            alike[(f.goal, f"{'; '.join(_runs(f.actions)) or 'no tool calls'}; {ended}", harness(f.record) if harness else "")].append(f)
        said = ""
        for (goal, did, changed), same in alike.items():
            many = f" ({len(same)} simulations alike)" if len(same) > 1 else ""
            body.append(f'- {", ".join(f"{f.label} (trial {f.record.trial})" for f in same)}{many}: user wanted: "{goal}"')
            body.append(f"  agent did: {did}")
            if changed:  # said once per pattern: repeated, it would crowd the full trajectories out of the digest
                body.append(f"  the harness changed: {'the same' if changed == said else changed}")
                said = changed
        body.append("")
    ranked = sorted(groups.values(), key=len, reverse=True)
    index, count = focus
    mine = list(range(len(ranked)))[index::count] or list(range(len(ranked)))
    if count > 1:
        head.append(
            f"This is proposal {index + 1} of {count} for the same agent. Focus on Pattern {', '.join(str(i + 1) for i in mine)}; "
            "the other proposals address the other patterns.\n"
        )
    shown = [ranked[i][0] for i in mine][:full_examples]
    seen = next((text for f in shown if turn and (text := turn(f.record))), "")
    # Before the full trajectories, which the cap cuts first: the turn shows what the model was sent, they only what tau2 saw.
    examples: list[str] = [*(["## One turn as the model saw it", seen, ""] if seen else []), "## Full trajectories (masked)"]
    for f in shown:
        examples.append(f"### {f.label}: {f.signature}")
        examples.extend(line for line in f.transcript[:30])
        examples.append("")
    return _fit("\n".join(head), body, examples, max_chars)


def _runs(actions: list[str]) -> list[str]:
    """Actions with each run of the same one told once: "create_task(...), 15 times in a row"."""
    out: list[str] = []
    for action, run in itertools.groupby(actions):
        n = len(list(run))
        out.append(action + (f", {n} times in a row" if n > 1 else ""))
    return out


def _fit(head: str, body: list[str], examples: list[str], max_chars: int) -> str:
    """Cap the digest: full trajectories go first, then pattern lines from the end."""
    text = "\n".join([head, *body, *examples])
    while len(text) > max_chars and examples:
        examples = examples[:-1]
        text = "\n".join([head, *body, *examples])
    dropped = 0
    while len(text) > max_chars and body:
        body = body[:-1]
        dropped += 1
        text = "\n".join([head, *body, f"... ({dropped} more lines cut to fit the meta model's context)"])
    return text[:max_chars]
