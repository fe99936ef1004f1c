"""What the harness changed between tau2 and the model, computed from a simulation's turn view.

Two sides of every turn are on record (evolver.store.turnview): what tau2 gave the harness and
took back from it, and what the model was sent and answered. Comparing them names each change:
tool results or customer text that never reached the model or reached it altered, earlier messages
left out of a later prompt, messages or tool descriptions the harness added or changed, tool calls
it changed, dropped or added after the model answered, replies it turned into text, tool calls or
a stop, a model asked again. A change is information, not a verdict: a layer that is switched on
makes some of them on purpose (layer_of says which, where it is known).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher
from typing import Optional

from evolver.store.turnview import Given, TurnView, call_arguments

# The steps of a turn, in the order the harness runs them.
PROMPT, TOOLS, GUIDANCE, REPLY, TURN = (
    "before the model call",
    "the tools offered",
    "the text added after the conversation",
    "after the model answered",
    "the whole turn",
)


@dataclass(frozen=True)
class Kind:
    step: str
    one: str  # "1 <one>"
    many: str  # "3 <many>"; empty: it happens once or not at all, and is said without a number


KINDS: dict[str, Kind] = {
    "result_dropped": Kind(PROMPT, "tool result never reached the model", "tool results never reached the model"),
    "result_altered": Kind(PROMPT, "tool result reached the model altered", "tool results reached the model altered"),
    "customer_dropped": Kind(PROMPT, "customer message never reached the model", "customer messages never reached the model"),
    "customer_altered": Kind(PROMPT, "customer message reached the model altered", "customer messages reached the model altered"),
    "history_dropped": Kind(
        PROMPT,
        "earlier message of the conversation left out of a later prompt",
        "earlier messages of the conversation left out of later prompts",
    ),
    "reordered": Kind(PROMPT, "prompt held the conversation out of order", "prompts held the conversation out of order"),
    "policy_missing": Kind(PROMPT, "domain policy tau2 gave never reached the model (no request held it)", ""),
    "message_added": Kind(PROMPT, "message the harness wrote into a prompt", "messages the harness wrote into prompts"),
    "guidance_added": Kind(GUIDANCE, "note the harness added after the conversation", "notes the harness added after the conversation"),
    "tool_changed": Kind(TOOLS, "tool offered to the model unlike tau2's", "tools offered to the model unlike tau2's"),
    "no_tools": Kind(TOOLS, "request sent without tau2's tools", "requests sent without tau2's tools"),
    "args_changed": Kind(REPLY, "call's arguments changed after the model answered", "calls' arguments changed after the model answered"),
    "name_changed": Kind(REPLY, "call's tool name changed after the model answered", "calls' tool names changed after the model answered"),
    "call_dropped": Kind(REPLY, "tool call of the model dropped", "tool calls of the model dropped"),
    "call_added": Kind(REPLY, "tool call the model never made added", "tool calls the model never made added"),
    "calls_to_text": Kind(REPLY, "reply with tool calls handed back as text", "replies with tool calls handed back as text"),
    "text_to_calls": Kind(REPLY, "text reply handed back as tool calls", "text replies handed back as tool calls"),
    "text_changed": Kind(REPLY, "reply's text changed after the model answered", "replies' text changed after the model answered"),
    "to_stop": Kind(
        REPLY,
        "reply handed back as a stop (the harness ended the conversation)",
        "replies handed back as a stop (the harness ended the conversation)",
    ),
    "retried": Kind(
        REPLY,
        "turn in which the model was asked again (its earlier answer not handed back)",
        "turns in which the model was asked again (its earlier answers not handed back)",
    ),
    "no_call": Kind(TURN, "turn answered without asking the model", "turns answered without asking the model"),
}


@dataclass(frozen=True)
class Change:
    turn: int  # 1, 2, ...; 0: the task's starting history
    kind: str  # a key of KINDS
    subject: str = ""  # procedure words only: a role, a tool and its argument names
    details: tuple[tuple[str, str, str], ...] = ()  # (what, before, after): values, to be masked where they are shown
    call: int = 0  # the request of the turn it was seen in, from 1 (0: the turn as a whole)
    layer: str = ""  # the layer whose code makes it on purpose, when it is switched on ("H2", ...)

    @property
    def step(self) -> str:
        return KINDS[self.kind].step


@dataclass
class _Item:
    """A message of the conversation the model should be able to read: given by tau2, or the agent's own earlier reply."""

    turn: int
    who: str  # "customer", "tool result" or "agent"
    given: Given
    also: Optional[dict] = None  # the agent's reply as the model wrote it (a harness may keep that instead)
    seen: bool = False
    gone: bool = False
    keys: list = field(default_factory=list)  # what it looks like in a request (_keys), worked out once

    def __post_init__(self):
        self.keys = _keys(self)


def changes(view: TurnView, switches: Optional[dict] = None) -> list[Change]:
    """Every change the harness made in one simulation, in turn order."""
    found: list[Change] = []
    items = [_Item(0, _who(g), g) for g in view.history]
    added: set[tuple[str, str]] = set()
    tools_seen: set[tuple[str, str]] = set()
    policy_seen = not view.policy
    requests = list(view.requests())
    asked = {n for n, _, _ in requests}
    for n, turn in enumerate(view.turns, 1):
        items += [_Item(n, _who(g), g) for g in turn.given]
        calls = [(call, messages) for t, call, messages in requests if t == n - 1]
        for k, (call, messages) in enumerate(calls, 1):
            earlier_replies = [c.reply for c, _ in calls[: k - 1] if c.reply]
            found += _prompt(n, k, messages, items, earlier_replies, added)
            policy_seen = policy_seen or any(m.get("role") == "system" and view.policy.strip() in _text(m) for m in messages)
            found += _tools(n, k, view, call, tools_seen)
        found += _reply(n, turn, calls)
        if turn.returned is not None:
            last = next((c.reply for c, _ in reversed(calls) if c.reply), None)
            items.append(_Item(n, "agent", turn.returned, also=last.model_dump() if last else None))
    for item in items:  # what never reached the model, though the harness asked it after the item arrived
        if item.who != "agent" and not item.seen and any(t >= item.turn - 1 for t in asked):
            found.append(
                Change(
                    item.turn,
                    "result_dropped" if item.who == "tool result" else "customer_dropped",
                    details=(("content", item.given.content or "", ""),),
                )
            )
    if not policy_seen and requests:
        found.append(Change(1, "policy_missing", call=1))
    found.sort(key=lambda c: (c.turn, c.call))
    return [_with_layer(c, switches or {}) for c in found]


def _prompt(n: int, k: int, messages: list[dict], items: list[_Item], earlier_replies: list, added: set) -> list[Change]:
    """One request against the conversation so far: what is missing, altered, out of order or added."""
    live = [item for item in items if not (item.who == "agent" and item.turn >= n)]
    request = _Request(messages)
    where: dict[int, tuple[int, str]] = {}
    for item in reversed(live):  # exact copies first; the newest item claims the latest of several equal copies
        index = request.claim(item.keys)
        if index is not None:
            where[id(item)] = (index, "same")
    for item in reversed(live):
        if id(item) not in where and item.who != "agent":
            index, how = request.claim_altered(item.given)
            if index is not None:
                where[id(item)] = (index, how)
    out = []
    for item in live:
        if id(item) not in where:
            if (item.seen or item.who == "agent") and not item.gone:  # it was in the model's view before, or is the agent's own reply
                item.gone = True
                out.append(Change(n, "history_dropped", item.who, call=k))
            continue
        index, how = where[id(item)]
        if not item.seen and how != "same":
            kind = "result_altered" if item.who == "tool result" else "customer_altered"
            out.append(Change(n, kind, how, details=(("content", item.given.content or "", _text(messages[index])),), call=k))
        item.seen = True
    order = [where[id(item)][0] for item in live if id(item) in where]
    if order != sorted(order):
        out.append(Change(n, "reordered", call=k))
    replies = {_reply_key(r.model_dump()) for r in earlier_replies}
    last_turn = max((i for i, m in enumerate(messages) if m.get("role") != "system"), default=-1)
    for i, m in enumerate(messages):
        if i in request.used or (i == 0 and m.get("role") == "system") or request.keys[i] in replies:
            continue  # tau2's, the system prompt, or the model's own answer of this turn shown to it again (a retry)
        key = (str(m.get("role")), _text(m))
        if key in added:
            continue
        added.add(key)
        kind = "guidance_added" if m.get("role") == "system" and i > last_turn else "message_added"
        out.append(Change(n, kind, str(m.get("role")), details=(("text", "", _text(m)),), call=k))
    return out


class _Request:
    """One request's messages, indexed by what they say; each is claimed by one item of the conversation at most."""

    def __init__(self, messages: list[dict]):
        self.messages = messages
        self.keys = [_key(m) for m in messages]
        self.free: dict[tuple, list[int]] = {}
        for i, key in enumerate(self.keys):
            self.free.setdefault(key, []).append(i)
        self.used: set[int] = set()

    def claim(self, keys: list[tuple]) -> Optional[int]:
        """The latest unclaimed message equal to the item, if any."""
        index = max((self.free[k][-1] for k in keys if self.free.get(k)), default=None)
        if index is not None:
            self._take(index)
        return index

    def claim_altered(self, g: Given) -> tuple[Optional[int], str]:
        """Where an item reached the model altered: "cut" (a part of it), "reworded", "replaced" (its call's answer with
        other content), "moved into a ... message" (another role's); (None, "") when it did not."""
        text, role = g.content or "", "tool" if g.role == "tool" else "user"
        free = [i for i in range(len(self.messages) - 1, -1, -1) if i not in self.used]
        same_role = [
            i for i in free if self.messages[i].get("role") == role and (role != "tool" or self.messages[i].get("tool_call_id") == g.id)
        ]
        found = next(((i, how) for i in same_role if (how := _altered(text, _text(self.messages[i])))), None)
        if found is None and role == "tool" and same_role:
            found = (same_role[0], "replaced")
        if found is None and text:
            found = next(
                ((i, f"moved into a {self.messages[i].get('role')} message") for i in free if text in _text(self.messages[i])), None
            )
        if found is None:
            return None, ""
        self._take(found[0])
        return found

    def _take(self, index: int) -> None:
        self.used.add(index)
        self.free[self.keys[index]].remove(index)


def _key(m: dict) -> tuple:
    role = str(m.get("role"))
    if role == "assistant":
        return _reply_key(m)
    return (role, m.get("tool_call_id") if role == "tool" else None, _text(m))


def _keys(item: _Item) -> list[tuple]:
    """What an item looks like in a request: the agent's reply as tau2 got it or as the model wrote it (a harness may keep either)."""
    g = item.given
    if item.who == "agent":
        return [("assistant", json.dumps(_given_message(g), sort_keys=True))] + ([_reply_key(item.also)] if item.also else [])
    return [("tool", g.id, g.content or "")] if item.who == "tool result" else [("user", None, g.content or "")]


def _reply_key(m: dict) -> tuple:
    return ("assistant", json.dumps(_reply_message(m), sort_keys=True))


def _altered(original: str, shown: str) -> str:
    if not shown or not original:
        return ""
    if len(shown) < len(original) and shown.strip() and shown.strip() in original:
        return "cut"
    if SequenceMatcher(None, original[:2000], shown[:2000]).quick_ratio() >= 0.6:
        return "reworded"
    return ""


def _tools(n: int, k: int, view: TurnView, call, seen: set) -> list[Change]:
    offered = view.tools_of(call)
    if offered is None:
        return [Change(n, "no_tools", call=k)] if view.tools else []
    theirs = {_tool_name(t): t.get("function", {}) for t in view.tools}
    mine = {_tool_name(t): t.get("function", {}) for t in offered}
    out = []
    for name in sorted(theirs.keys() | mine.keys()):
        a, b = theirs.get(name), mine.get(name)
        what = (
            "not offered"
            if b is None
            else "added"
            if a is None
            else "description changed"
            if a.get("description") != b.get("description")
            else "parameters changed"
            if a.get("parameters") != b.get("parameters")
            else ""
        )
        if what and (name, what) not in seen:
            seen.add((name, what))
            before, after = (a or {}).get("description") or "", (b or {}).get("description") or ""
            out.append(
                Change(n, "tool_changed", f"{name}: {what}", details=(("description", before, after),) if before != after else (), call=k)
            )
    return out


def _reply(n: int, turn, calls: list) -> list[Change]:
    """The model's last answer of the turn against what the harness handed back to tau2."""
    if turn.returned is None:
        return []
    answered = [c for c, _ in calls if c.reply is not None]
    if not calls:
        return [Change(n, "no_call")]
    out = [Change(n, "retried", details=(("requests", "", str(len(calls))),), call=len(calls))] if len(calls) > 1 else []
    if not answered:
        return out
    model, returned = answered[-1].reply, turn.returned
    k = max(i for i, (c, _) in enumerate(calls, 1) if c.reply is not None)
    mine = [(c.get("id"), c.get("name"), call_arguments(c.get("arguments"))) for c in model.tool_calls]
    theirs = [(c.get("id"), c.get("name"), c.get("arguments") or {}) for c in returned.tool_calls]
    same_text = (model.content or "").strip() == (returned.content or "").strip()
    if turn.stop and not (same_text and [x[1:] for x in mine] == [x[1:] for x in theirs]):
        return out + [Change(n, "to_stop", details=(("reply", _reply_text(model), returned.content or ""),), call=k)]
    if mine and not theirs:
        return out + [
            Change(
                n, "calls_to_text", ", ".join(c[1] for c in mine), details=(("text", _reply_text(model), returned.content or ""),), call=k
            )
        ]
    if theirs and not mine:
        return out + [Change(n, "text_to_calls", ", ".join(c[1] for c in theirs), details=(("text", model.content or "", ""),), call=k)]
    if not mine:
        return out + (
            [] if same_text else [Change(n, "text_changed", details=(("text", model.content or "", returned.content or ""),), call=k)]
        )
    pairs, left = [], list(theirs)
    for m in mine:  # by call id first, then in order
        match = next((t for t in left if t[0] == m[0]), None) or next((t for t in left if t[1] == m[1]), None)
        if match is not None:
            left.remove(match)
        pairs.append((m, match))
    for m, t in pairs:
        if t is None:
            out.append(Change(n, "call_dropped", m[1], call=k))
            continue
        if m[1] != t[1]:
            out.append(Change(n, "name_changed", f"{m[1]} -> {t[1]}", call=k))
        if m[2] != t[2]:
            keys = (
                [key for key in list(m[2]) + [key for key in t[2] if key not in m[2]] if m[2].get(key, _NONE) != t[2].get(key, _NONE)]
                if isinstance(m[2], dict)
                else ["(not JSON)"]
            )
            details = tuple(
                (key, _value(m[2].get(key, _NONE) if isinstance(m[2], dict) else m[2]), _value(t[2].get(key, _NONE))) for key in keys
            )
            out.append(Change(n, "args_changed", f"{t[1]}({', '.join(keys)})", details=details, call=k))
    out += [Change(n, "call_added", t[1], call=k) for t in left]
    return out


_NONE = object()


def _with_layer(change: Change, switches: dict) -> Change:
    """The layer that makes this change on purpose, where its switch is on and the change is its kind (Harness.md)."""
    on = {name[:2].upper() for name, value in switches.items() if value is True and name[:1] == "h"}
    text = " ".join(after for _, _, after in change.details)
    layer = ""
    if (
        change.kind in ("args_changed", "name_changed", "call_dropped", "call_added", "text_to_calls", "calls_to_text", "retried")
        and "H2" in on
    ):
        layer = "H2"
    elif change.kind == "message_added" and change.subject in ("tool", "assistant") and change.call > 1 and "H2" in on:
        layer = "H2"  # its retry: the repaired call and the errors shown to the model
    elif change.kind == "to_stop" and "H4" in on:
        layer = "H4"
    elif change.kind == "guidance_added":
        layer = "+".join(x for x, marker in (("H4", "<harness_note>"), ("H5", "<skill")) if x in on and marker in text)
    elif change.kind == "tool_changed" and change.subject.endswith("description changed") and "H3" in on:
        layer = "H3"
    return replace(change, layer=layer) if layer else change


def _who(g: Given) -> str:
    return {"tool": "tool result", "assistant": "agent"}.get(g.role, "customer")


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _value(v) -> str:
    return "(none)" if v is _NONE else v if isinstance(v, str) else json.dumps(v)


def _tool_name(tool: dict) -> str:
    return str((tool.get("function") or {}).get("name"))


def _given_message(g: Given) -> dict:
    return {"content": (g.content or "").strip(), "calls": [[c.get("name"), c.get("arguments")] for c in g.tool_calls]}


def _reply_message(m: dict) -> dict:
    """An assistant message (an OpenAI message of a request, or a recorded reply) as _given_message compares it."""
    calls = []
    for c in m.get("tool_calls") or []:
        fn = c.get("function") or c
        calls.append([fn.get("name"), call_arguments(fn.get("arguments"))])
    return {"content": _text(m).strip(), "calls": calls}


def _reply_text(reply) -> str:
    calls = "; ".join(f"{c.get('name')}({c.get('arguments')})" for c in reply.tool_calls)
    return (reply.content or "") + (f" [calls: {calls}]" if calls else "")


@dataclass
class Tally:
    """A simulation's changes of one kind: how many, in which turns, the layer that makes them (if any)."""

    kind: str
    count: int = 0
    turns: list[int] = field(default_factory=list)
    layer: str = ""
    subjects: dict[str, int] = field(default_factory=dict)  # what it happened to (a role, a call and its arguments): how often

    def phrase(self) -> str:
        k = KINDS[self.kind]
        said = f"the {k.one}" if not k.many else f"{self.count} {k.one if self.count == 1 else k.many}"
        named = sorted(self.subjects.items(), key=lambda kv: -kv[1])[:3]
        return said + (": " + ", ".join(f"{s} {c}" if self.count > 1 else s for s, c in named) if named else "")


def tally(found: list[Change]) -> list[Tally]:
    """The changes by kind: the ones no switched-on layer explains first, then by how often."""
    out: dict[tuple[str, str], Tally] = {}
    for c in found:
        t = out.setdefault((c.kind, c.layer), Tally(c.kind, layer=c.layer))
        t.count += 1
        if c.turn not in t.turns:
            t.turns.append(c.turn)
        if c.subject:
            t.subjects[c.subject] = t.subjects.get(c.subject, 0) + 1
    return sorted(out.values(), key=lambda t: (bool(t.layer), -t.count, list(KINDS).index(t.kind)))
