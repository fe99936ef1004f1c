"""The agent's files as the one-shot prompt shows them: whole, and, for a prompt that would not fit the meta-LLM's
context, shorter and shorter versions where functions of agent/'s Python files are shown by their first lines only.

The functions whose lines the failure digest or the lines to start from name, and the turn itself, stay whole; of the
rest the largest is shortened first. Cutting the digest instead would leave a small context with none of it: agent/
and the guide alone can fill the embedded model's."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterable

from evolver.evaluation.scan import parse_python
from evolver.evolution.harness_code import TURN_METHOD
from evolver.evolution.noop import agent_files

SHOWN = (".py", ".toml", ".md")
NAMED = re.compile(r"(agent/[\w/.-]+\.py) lines? (\d+)(?:-(\d+))?")  # "agent/agent.py lines 143-148", "agent/agent.py line 150"


def agent_texts(checkout: Path) -> dict[str, str]:
    """The evolvable agent files (noop.agent_files) a reader is shown, as text, by path relative to the checkout."""
    return {rel: data.decode("utf-8") for rel, data in sorted(agent_files(checkout).items()) if rel.endswith(SHOWN)}


def named_lines(texts: Iterable[str]) -> set[tuple[str, int]]:
    """The (file, line) pairs the texts name as 'agent/X.py lines A-B' or 'agent/X.py line A'."""
    named = set()
    for text in texts:
        for path, first, last in NAMED.findall(text):
            named.update((path, n) for n in range(int(first), int(last or first) + 1))
    return named


def versions(files: dict[str, str], keep: set[tuple[str, int]]) -> list[str]:
    """The files as fenced blocks: whole first, then with one more function shortened each time (the one that saves the
    most characters first) until none is left to shorten. Kept whole: the functions holding a ``keep`` line, and the turn."""
    shortenable = []
    for path, text in files.items():
        lines = text.splitlines()
        for name, start, body, end in _functions(text) if path.endswith(".py") else []:
            saved = sum(len(line) + 1 for line in lines[body - 1 : end]) - len(_marker(lines, body, end)) - 1
            if name != TURN_METHOD and saved > 0 and not any((path, n) in keep for n in range(start, end + 1)):
                shortenable.append((saved, path, body, end))
    out, short = [_fenced(files)], {path: [] for path in files}
    for _, path, body, end in sorted(shortenable, reverse=True):
        short[path].append((body, end))
        out.append(_fenced({p: _shortened(text, short[p]) for p, text in files.items()}))
    return out


def _functions(text: str) -> list[tuple[str, int, int, int]]:
    """(name, first line, first line of the body past its docstring, last line) of every function and method, outermost only."""
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError):
        return []  # a file that does not parse is shown whole
    found = []
    for node in tree.body:
        for member in node.body if isinstance(node, ast.ClassDef) else [node]:
            if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and member.end_lineno:
                body = member.body[1:] if ast.get_docstring(member) is not None else member.body
                if body:
                    start = min([member.lineno] + [d.lineno for d in member.decorator_list])
                    found.append((member.name, start, body[0].lineno, member.end_lineno))
    return found


def _shortened(text: str, short: list[tuple[int, int]]) -> str:
    """The text with the lines from ``body`` to ``end`` of each shortened function replaced by one line that names them."""
    lines = text.splitlines()
    for body, end in sorted(short, reverse=True):
        lines[body - 1 : end] = [_marker(lines, body, end)]
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def _marker(lines: list[str], body: int, end: int) -> str:
    indent = re.match(r"\s*", lines[body - 1]).group()
    return f"{indent}...  # lines {body}-{end} not shown: the failures do not point here"


def _fenced(files: dict[str, str]) -> str:
    return "\n\n".join(f"## FILE: {rel}\n```\n{text}\n```" for rel, text in files.items())
