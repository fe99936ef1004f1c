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

from evolver.evolution.harness_changes import GUIDANCE, PROMPT, REPLY, TOOLS, TURN, Change

PATH = "agent/agent.py"
TURN_METHOD = "generate_next_message"
MODEL_CALLS = ("call_llm", "generate")  # how the template asks the model (Harness.md)
# The members a kind of change runs through, whatever the switches; and each layer's own entry (the template's names).
BY_KIND = {"policy_missing": ("system_prompt", "get_init_state"), "guidance_added": ("guidance",),
           "tool_changed": ("tool_schemas", "call_llm"), "no_tools": ("tool_schemas", "call_llm")}
BY_LAYER = {(REPLY, "H2"): "realize_action", (PROMPT, "H2"): "realize_action", (REPLY, "H4"): "should_stop",
            (GUIDANCE, "H4"): "regulation_notes", (GUIDANCE, "H5"): "skill_texts", (TOOLS, "H3"): "tool_schemas"}
HELPERS = 3  # functions of agent.py a layer's entry calls, listed after it (one-liners left out)


@dataclass(frozen=True)
class Place:
    function: str
    start: int
    end: int
    part: str = ""  # "before the model call", "after the model call", "H2 on"

    path = PATH

    def text(self) -> str:
        return f"{PATH} lines {self.start}-{self.end} ({self.function}{', ' + self.part if self.part else ''})"


class HarnessCode:
    """The line spans of agent.py's functions and HarnessAgent's members, and where a turn calls the model."""

    def __init__(self, source: str):
        tree = ast.parse(source)
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
    def read(cls, root: Path) -> Optional["HarnessCode"]:
        """The code of a checkout's agent; None when it cannot be read or parsed (then no lines are pointed to)."""
        try:
            return cls.parse((Path(root) / PATH).read_text())
        except (OSError, UnicodeDecodeError):
            return None

    @classmethod
    def parse(cls, source: Optional[str]) -> Optional["HarnessCode"]:
        try:
            return cls(source) if source is not None else None
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
        turn = [self._turn_part(change.step)] if TURN_METHOD in self.spans else []
        named = [p for name in BY_KIND.get(change.kind, ()) if (p := self._place(name))]
        if change.layer:
            layered = [p for layer in change.layer.split("+") if (p := self._place(BY_LAYER.get((change.step, layer), ""), f"{layer} on"))]
            helpers = [p for entry in layered for p in self._helpers(entry.function)][:HELPERS]
            return _unique(layered + helpers + named + turn)
        return _unique(turn + named)

    def _turn_part(self, step: str) -> Place:
        start, end = self.spans[TURN_METHOD]
        if self.model_line is None or step in (TURN, GUIDANCE, TOOLS):
            return Place(TURN_METHOD, start, end)
        if step == PROMPT:
            return Place(TURN_METHOD, start, self.model_line - 1, "before the model call")
        return Place(TURN_METHOD, self.model_line, end, "after the model call" if step == REPLY else "")

    def _place(self, name: str, part: str = "") -> Optional[Place]:
        span = self.spans.get(name)
        return Place(name, span[0], span[1], part) if span else None

    def _helpers(self, name: str) -> list[Place]:
        """The functions of agent.py a member calls (repair_call from realize_action), in the order it calls them."""
        node = self.nodes.get(name)
        calls = [] if node is None else sorted((n for n in ast.walk(node) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
        called = [_called(n) for n in calls]
        places = [p for c in dict.fromkeys(called) if c != name and c not in MODEL_CALLS and (p := self._place(c))]
        return [p for p in places if p.end - p.start > 2]


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _unique(places: list[Place]) -> list[Place]:
    seen, out = set(), []
    for p in places:
        if (p.function, p.start, p.end) not in seen:
            seen.add((p.function, p.start, p.end))
            out.append(p)
    return out
