"""The model's view as text: a simulation's harness changes in one line, and one turn step by step.

The same words reach every reader: the investigating proposer's list_failures and read_turn, the
one-shot digest, the external coding agent's workspace and `evolver show --turns`. For a proposer
every data value is masked (evolver.evolution.digest.Masker, consistent with the trajectory's
<Vn>); a person reads them as they were (Plain). Each change says where it arose: the turn, the step
of the harness, the lines of agent/ that run there (evolver.evolution.harness_code).
"""

from __future__ import annotations

import json
from typing import Optional

from evolver.evolution.harness_changes import KINDS, Change, tally
from evolver.evolution.harness_code import HarnessCode
from evolver.store.turnview import Given, TurnView, call_arguments

SUMMARY_KINDS = 3  # kinds of change named in a failure's one line


class Plain:
    """The Masker's interface, masking nothing: what a person reads."""

    def text(self, text: str) -> str:
        return text

    def args(self, arguments: dict) -> str:
        return ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in arguments.items())

    def json_shape(self, text: str) -> str:
        return str(text)


def summary(found: list[Change], code: Optional[HarnessCode], kinds: int = SUMMARY_KINDS) -> str:
    """A simulation's changes in one line, each kind with its turns and the lines to read; "" when there are none."""
    tallies = tally(found)
    parts = []
    for t in tallies[:kinds]:
        where = code.places(_example(found, t.kind, t.layer)) if code else []
        turns = _turns(t.turns)
        parts.append(t.phrase() + f" ({turns}" + (f", {t.layer} on" if t.layer else "") + (f"; {where[0].text()}" if where else "") + ")")
    more = f"; and {len(tallies) - kinds} more kind(s)" if len(tallies) > kinds else ""
    return "; ".join(parts) + more


def change_line(change: Change, mask, width: int = 160) -> str:
    """One change: what, of which call or argument, and the values before and after."""
    text = KINDS[change.kind].one + (f" ({change.subject})" if change.subject else "")
    shown = []
    for what, before, after in change.details:
        show = mask.json_shape if what == "content" else mask.text  # a tool result as "tau2 gave the harness" shows it: keys kept
        if before and after:
            shown.append(
                f"{what}: {_cut(show(before), width // 2)} -> {_cut(show(after), width // 2)}{_how(before, after, isinstance(mask, Plain))}"
            )
        elif before or after:
            shown.append(f"{what}: {_cut(show(before or after), width)}")
    return text + (": " + "; ".join(shown) if shown else "") + (f" [{change.layer} on]" if change.layer else "")


def turn_lines(view: TurnView, n: int, found: list[Change], mask, code: Optional[HarnessCode], width: int = 200) -> list[str]:
    """Turn n (from 1) as the harness lived it: tau2's message, each request and answer, what went back, what changed."""
    turn = view.turns[n - 1]
    requests = [(call, messages) for t, call, messages in view.requests() if t == n - 1]
    lines = [
        f"turn {n} of {len(view.turns)}",
        "1. tau2 gave the harness: " + ("; ".join(_given(g, mask, width) for g in turn.given) or "nothing (the harness started)"),
    ]
    lines.append(f"2. the harness asked the model {len(requests)} time(s)" + (":" if requests else " (it answered tau2 itself)"))
    for k, (call, messages) in enumerate(requests, 1):
        tools = view.tools_of(call)
        offered = "no tools" if tools is None else "tau2's tools" if call.tools == 0 else f"{len(tools)} tools of the harness's own"
        kept = call.keep
        lines.append(
            f"   request {k}: {len(messages)} message(s), {offered}; "
            + (f"the first {kept} as in the request before, then:" if kept else "all new:")
        )
        lines += [f"     + {_message(m, mask, width)}" for m in messages[kept:]]
        if call.error:
            lines.append(f"   the provider refused it: {_cut(call.error, width)}")
        elif call.reply is not None:
            lines.append(f"   the model answered: {_reply(call.reply.content, call.reply.tool_calls, mask, width)}")
    returned = turn.returned
    if returned is None:
        lines.append("3. the turn did not finish (the agent failed)")
    else:
        lines.append(
            "3. the harness handed back to tau2: " + _given(returned, mask, width) + (" and ended the conversation" if turn.stop else "")
        )
    mine = sorted((c for c in found if c.turn == n), key=lambda c: bool(c.layer))  # what no switched-on layer explains first
    lines.append("what the harness changed in this turn:" if mine else "what the harness changed in this turn: nothing")
    for c in mine:
        where = code.places(c) if code else []
        lines.append(f" - {change_line(c, mask, width)}" + (f" -> read {where[0].text()}" if where else ""))
        lines += [f"   also: {p.text()}" for p in where[1:3] if not c.layer]
    return lines


def turns_with_changes(found: list[Change]) -> list[int]:
    return sorted({c.turn for c in found if c.turn})


def _example(found: list[Change], kind: str, layer: str) -> Change:
    return next(c for c in found if c.kind == kind and c.layer == layer)


def _turns(turns: list[int]) -> str:
    turns = sorted(turns)
    if len(turns) == 1:
        return f"turn {turns[0]}"
    if turns == list(range(turns[0], turns[-1] + 1)):
        return f"turns {turns[0]}-{turns[-1]}"
    return "turns " + ", ".join(map(str, turns[:6])) + (", ..." if len(turns) > 6 else "")


def _how(before: str, after: str, whole: bool) -> str:
    """How a value changed, without its values: a small model reads "cut" where <V1> -> <V2> says little. The value's own
    length only for a person (``whole``): a model given "cut to 10 of 18 characters" may just raise the harness's cut to 18,
    a fix for the example rather than the failure."""
    if after.lower() == before.lower():
        return " (case changed)"
    if len(after) < len(before) and after.strip() and after.strip() in before:
        return f" (cut to {len(after)}" + (f" of {len(before)}" if whole else "") + " characters)"
    if len(after) > len(before) and before.strip() in after:
        return " (added to)"
    return " (replaced)"


def _given(g: Given, mask, width: int) -> str:
    if g.role == "tool":
        return f"tool result{' (error)' if g.error else ''}: {_cut(mask.json_shape(g.content or ''), width)}"
    if g.role == "assistant":
        return _reply(g.content, g.tool_calls, mask, width)
    return f"customer: {_cut(mask.text(g.content or ''), width)}"


def _reply(content: Optional[str], calls: list[dict], mask, width: int) -> str:
    if calls:
        shown = []
        for c in calls:
            args = call_arguments(c.get("arguments"))
            shown.append(f"{c.get('name')}({mask.args(args) if isinstance(args, dict) else _cut(mask.text(str(args)), 80)})")
        return "tool call(s) " + "; ".join(shown) + (f" with text: {_cut(mask.text(content), width // 2)}" if content else "")
    return f"text: {_cut(mask.text(content or ''), width)}" if content else "nothing (an empty reply)"


def _message(m: dict, mask, width: int) -> str:
    role = m.get("role")
    content = m.get("content")
    text = "".join(p.get("text", "") for p in content if isinstance(p, dict)) if isinstance(content, list) else content or ""
    if role == "assistant":
        calls = [
            {"name": (c.get("function") or {}).get("name"), "arguments": (c.get("function") or {}).get("arguments")}
            for c in m.get("tool_calls") or []
        ]
        return "assistant: " + _reply(text, calls, mask, width)
    if role == "tool":
        return f"tool: {_cut(mask.json_shape(text), width)}"
    if role == "system":
        return f"system ({len(text):,} characters): {_cut(mask.text(text), width)}"
    return f"{role}: {_cut(mask.text(text), width)}"


def _cut(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."
