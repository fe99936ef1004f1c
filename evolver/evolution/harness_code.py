"""Where in agent/agent.py a harness change arises: the lines that run at that step of the turn.

A turn is `HarnessAgent.generate_next_message`: the prompt is built before its call to the model,
the reply is handled after it, and the layers' code runs from there (Harness.md). A change of the
prompt points to the lines before the model call, a change of the reply to the lines after it, and
a change a switched-on layer makes on purpose to that layer's function first (with the functions
of agent.py it calls). Read from the parent's own code with ast, so the lines are the ones a
proposer reads; a name a candidate renamed away is simply not pointed to.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from evolver.evaluation.scan import parse_python
from evolver.evolution.harness_changes import GUIDANCE, PROMPT, REPLY, TOOLS, TURN, Change

PATH = "agent/agent.py"
TURN_METHOD = "generate_next_message"
MODEL_CALLS = ("call_llm", "generate")  # how the template asks the model (Harness.md)
# The members a kind of change runs through, whatever the switches; and each layer's own entry (the template's names).
BY_KIND = {
    "policy_missing": ("system_prompt", "get_init_state"),
    "guidance_added": ("guidance",),
    "tool_changed": ("tool_schemas", "call_llm"),
    "no_tools": ("tool_schemas", "call_llm"),
}
BY_LAYER = {
    (REPLY, "H2"): "realize_action",
    (PROMPT, "H2"): "realize_action",
    (REPLY, "H4"): "should_stop",
    (GUIDANCE, "H4"): "regulation_notes",
    (GUIDANCE, "H5"): "skill_texts",
    (TOOLS, "H3"): "tool_schemas",
}
HELPERS = 3  # functions of agent.py a layer's entry calls, listed after it (one-liners left out)
# In the turn's own lines, what writes the prompt (before the model call) or the reply (after it): the names assigned or mutated.
WRITTEN = {
    PROMPT: ("the prompt", ("context", "messages", "message", "system_messages")),
    REPLY: ("the reply", ("reply", "arguments", "tool_calls", "name", "content")),
}
MUTATORS = ("append", "extend", "insert", "pop", "remove", "clear", "update")
# Changes where something tau2 gave never reached the prompt: of the lines that write the prompt, the ones that can leave
# messages out (a reset, a slice, a filter, a removal, a write only under a condition) are pointed to first: given every
# line that writes the prompt, a model edits the first ones (the appends) rather than the slice that loses the messages.
LOSSES = ("result_dropped", "customer_dropped", "history_dropped")
# The policy is in the system messages: what loses it is a write of them or of what the model call sends, never an append of
# tau2's message to the conversation (a model pointed to both edits the appends).
SENT = ("policy_missing",)
REMOVERS = ("pop", "remove", "clear")


@dataclass(frozen=True)
class Place:
    function: str
    start: int
    end: int
    part: str = ""  # "before the model call", "after the model call", "H2 on"
    writes: tuple[int, ...] = ()  # its lines that write what the change is about (the prompt, the reply)
    written: str = ""  # "the prompt", "the reply"
    losing: bool = False  # writes are only the lines that can leave messages out of the prompt

    path = PATH

    def text(self) -> str:
        where = f"{self.function}{', ' + self.part if self.part else ''}"
        if self.writes:
            where += f"; the lines that {self.does} there: {spans(self.writes)}"
        return f"{PATH} lines {self.start}-{self.end} ({where})"

    @property
    def does(self) -> str:
        return f"can leave messages out of {self.written}" if self.losing else f"change {self.written}"

    def removable_run(self) -> Optional[tuple[int, int]]:
        """(first, last) of the one run of lines a proposer is offered to take out, or None: only lines that change the
        model's reply (without them its answer passes through as it was) or that can leave messages out of the prompt;
        other lines that change the prompt also build it."""
        run = self.writes if self.written == WRITTEN[REPLY][0] or self.losing else ()
        return (run[0], run[-1]) if run and list(run) == list(range(run[0], run[-1] + 1)) else None


class HarnessCode:
    """The line spans of agent.py's functions and HarnessAgent's members, and where a turn calls the model."""

    def __init__(self, source: str, switches: Optional[dict] = None):
        tree = parse_python(source)  # proposals of an iteration read it in threads
        self.switches = switches  # which layers were on: a write under a switch that is off is not pointed to; None: not known
        self.spans: dict[str, tuple[int, int]] = {}
        self.nodes: dict[str, ast.AST] = {}
        for node in tree.body:
            members = node.body if isinstance(node, ast.ClassDef) and node.name == "HarnessAgent" else [node]
            for member in members:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    start = min([member.lineno] + [d.lineno for d in member.decorator_list])
                    self.spans[member.name], self.nodes[member.name] = (start, member.end_lineno or member.lineno), member
        self.model_line = self._model_line()

    @classmethod
    def read(cls, root: Path, switches: Optional[dict] = None) -> Optional["HarnessCode"]:
        """The code of a checkout's agent; None when it cannot be read or parsed (then no lines are pointed to)."""
        try:
            return cls.parse((Path(root) / PATH).read_text(), switches)
        except (OSError, UnicodeDecodeError):
            return None

    @classmethod
    def parse(cls, source: Optional[str], switches: Optional[dict] = None) -> Optional["HarnessCode"]:
        try:
            return cls(source, switches) if source is not None else None
        except (SyntaxError, ValueError):
            return None

    def _model_line(self) -> Optional[int]:
        node = self.nodes.get(TURN_METHOD)
        if node is None:
            return None
        lines = [n.lineno for n in ast.walk(node) if isinstance(n, ast.Call) and _called(n) in MODEL_CALLS]
        return min(lines) if lines else None

    def places(self, change: Change) -> list[Place]:
        """The code to read for this change, the likeliest first."""
        turn = [self._turn_part(change.step, change.kind)] if TURN_METHOD in self.spans else []
        named = [p for name in BY_KIND.get(change.kind, ()) if (p := self._place(name))]
        if change.layer:
            layered = [p for layer in change.layer.split("+") if (p := self._place(BY_LAYER.get((change.step, layer), ""), f"{layer} on"))]
            helpers = [p for entry in layered for p in self._helpers(entry.function)][:HELPERS]
            return _unique(layered + helpers + named + turn)
        return _unique(turn + named)

    def _turn_part(self, step: str, kind: str = "") -> Place:
        start, end = self.spans[TURN_METHOD]
        if self.model_line is None or step in (TURN, GUIDANCE, TOOLS):
            return Place(TURN_METHOD, start, end)
        first, last, part = (
            (start, self.model_line - 1, "before the model call") if step == PROMPT else (self.model_line, end, "after the model call")
        )
        written, names = WRITTEN[step]
        writes = (kind in SENT and self._writes(("system_messages", *self._sent()), first, last)) or self._writes(names, first, last)
        losing = self._losing(names, first, last) if kind in LOSSES else []
        return Place(TURN_METHOD, first, last, part, tuple(losing or writes), written, bool(losing))

    def _sent(self) -> tuple[str, ...]:
        """The names the turn's model call is given (`self.call_llm(context)` -> context)."""
        call = next(
            (
                n
                for n in ast.walk(self.nodes[TURN_METHOD])
                if isinstance(n, ast.Call) and _called(n) in MODEL_CALLS and n.lineno == self.model_line
            ),
            None,
        )
        return tuple(name for a in [*call.args, *(k.value for k in call.keywords)] if (name := _name(a))) if call else ()

    def _write_nodes(self, names: tuple[str, ...], first: int, last: int) -> list[ast.AST]:
        """The statements and calls between first and last that assign or mutate one of ``names``, the model call and
        what a switched-off layer guards left out."""
        node = self.nodes[TURN_METHOD]
        off = [(n.lineno, n.end_lineno) for n in ast.walk(node) if isinstance(n, ast.If) and self._off(n.test)]
        out = []
        for n in ast.walk(node):
            targets = (
                n.targets
                if isinstance(n, (ast.Assign, ast.Delete))
                else [n.target]
                if isinstance(n, (ast.AugAssign, ast.AnnAssign))
                else []
            )
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS:
                targets = [n.func.value]
            if (
                any(_name(t) in names for t in targets)
                and first <= n.lineno <= last
                and n.lineno != self.model_line
                and not any(a <= n.lineno <= b for a, b in off)
            ):
                out.append(n)
        return out

    def _writes(self, names: tuple[str, ...], first: int, last: int) -> list[int]:
        """The lines of _write_nodes, with the headers of the blocks that hold them."""
        lines = {line for n in self._write_nodes(names, first, last) for line in range(n.lineno, (n.end_lineno or n.lineno) + 1)}
        return sorted(lines | self._headers(lines, first, last))

    def _headers(self, lines: set[int], first: int, last: int) -> set[int]:
        return {
            n.lineno
            for n in ast.walk(self.nodes[TURN_METHOD])
            if isinstance(n, (ast.For, ast.While, ast.If, ast.With))
            and first <= n.lineno <= last
            and any(n.lineno < line <= (n.end_lineno or n.lineno) for line in lines)
        }

    def _losing(self, names: tuple[str, ...], first: int, last: int) -> list[int]:
        """Of the lines that write the prompt, the ones that can leave a message out: a write that empties, slices, filters or
        removes, and an `if` without `else` around a write of the message tau2 gave the turn (what its test refuses is lost)."""
        turn = self.nodes[TURN_METHOD]
        given = turn.args.args[1].arg if len(turn.args.args) > 1 else None  # (self, message, state)
        nodes = self._write_nodes(names, first, last)
        lines = {line for n in nodes if _loses(n, names) for line in range(n.lineno, (n.end_lineno or n.lineno) + 1)}
        takes = {n.lineno for n in nodes if given and any(isinstance(x, ast.Name) and x.id == given for x in ast.walk(n))}
        for n in ast.walk(turn):
            if (
                isinstance(n, ast.If)
                and not n.orelse
                and first <= n.lineno <= last
                and any(n.lineno < line <= (n.end_lineno or n.lineno) for line in takes)
            ):
                lines.update(range(n.lineno, (n.end_lineno or n.lineno) + 1))
        return sorted(lines)

    def _off(self, test: ast.AST) -> bool:
        """Whether a test checks the switch of a layer that is off (`if self.switches.h2_action_realization:`)."""
        node = test.values[0] if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else test
        return (
            self.switches is not None
            and isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "switches"
            and not self.switches.get(node.attr, False)
        )

    def _place(self, name: str, part: str = "") -> Optional[Place]:
        span = self.spans.get(name)
        return Place(name, span[0], span[1], part) if span else None

    def _helpers(self, name: str) -> list[Place]:
        """The functions of agent.py a member calls (repair_call from realize_action), in the order it calls them."""
        node = self.nodes.get(name)
        calls = (
            [] if node is None else sorted((n for n in ast.walk(node) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
        )
        called = [_called(n) for n in calls]
        places = [p for c in dict.fromkeys(called) if c != name and c not in MODEL_CALLS and (p := self._place(c))]
        return [p for p in places if p.end - p.start > 2]


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _loses(node: ast.AST, names: tuple[str, ...]) -> bool:
    """Whether a write can leave messages out: `del`, .pop/.remove/.clear, `x = []`, a slice or a filtered comprehension of one of ``names``."""
    if isinstance(node, ast.Delete):
        return True
    if isinstance(node, ast.Call):
        return _called(node) in REMOVERS
    value = getattr(node, "value", None)
    if isinstance(value, (ast.List, ast.Tuple, ast.Dict, ast.Set)) and not getattr(value, "elts", getattr(value, "keys", None)):
        return True
    if isinstance(value, ast.Call) and _called(value) in ("list", "dict", "set", "tuple") and not value.args:
        return True
    return value is not None and any(
        (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice) and _name(n.value) in names)
        or (isinstance(n, (ast.ListComp, ast.GeneratorExp)) and any(g.ifs for g in n.generators))
        or (isinstance(n, ast.Call) and _called(n) == "filter")
        for n in ast.walk(value)
    )


def _name(target: ast.AST) -> str:
    """The name a write lands on: `context`, `call.arguments`, `state.messages[0]` -> context, arguments, messages."""
    while isinstance(target, ast.Subscript):
        target = target.value
    return target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""


def spans(lines: tuple[int, ...]) -> str:
    """152, 153, 157 -> "152-153, 157"."""
    runs: list[list[int]] = []
    for line in lines:
        if runs and line == runs[-1][-1] + 1:
            runs[-1].append(line)
        else:
            runs.append([line])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def line_numbers(lines: tuple[int, ...]) -> str:
    """150 -> "line 150"; 146, 147, 150 -> "lines 146-147, 150"."""
    return f"line{'s' if len(lines) > 1 else ''} {spans(lines)}"


def _unique(places: list[Place]) -> list[Place]:
    seen, out = set(), []
    for p in places:
        if (p.function, p.start, p.end) not in seen:
            seen.add((p.function, p.start, p.end))
            out.append(p)
    return out
