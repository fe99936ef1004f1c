"""Parse a meta-LLM proposal into edits and apply them under the allowlist.

The proposal format (documented for the meta-LLM in Harness.md):

    TITLE: <one line>
    RATIONALE: <which failures this targets and why; may span lines>
    FILE: agent/agent.py
    <<<<<<< SEARCH
    <exact lines of the current file>
    =======
    <replacement lines>
    >>>>>>> REPLACE

Several FILE sections and several edit blocks per file are allowed. An empty
SEARCH creates a new file. The allowlist is enforced here, in code: only files
under agent/, never agent/templates/ (the pristine baseline).
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


class ParseError(ValueError):
    """The meta-LLM's answer is not in the proposal format."""


class PatchRejected(ValueError):
    """A well-formed patch that may not or cannot be applied, or does not parse.

    retryable: the meta-LLM can fix it by quoting the file correctly (a SEARCH
    mismatch); a refused path or a syntax error is a verdict on the patch.
    """

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


@dataclass
class Edit:
    path: str
    search: str
    replace: str


@dataclass
class Proposal:
    title: str
    rationale: str
    edits: list[Edit] = field(default_factory=list)


SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"


def parse_proposal(text: str) -> Proposal:
    lines = text.replace("\r\n", "\n").split("\n")
    title, rationale, edits = None, [], []
    path = None
    i = 0
    in_rationale = False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if title is None and re.match(r"^\**TITLE\**\s*:", stripped, re.I):
            title = stripped.split(":", 1)[1].strip(" *")
        elif re.match(r"^\**RATIONALE\**\s*:", stripped, re.I):
            in_rationale = True
            rationale.append(stripped.split(":", 1)[1].strip())
        elif re.match(r"^\**FILE\**\s*:", stripped, re.I):
            in_rationale = False
            path = stripped.split(":", 1)[1].strip().strip("`* ")
        elif stripped == SEARCH:
            in_rationale = False
            if path is None:
                raise ParseError(f"line {i + 1}: a SEARCH block must follow a 'FILE: agent/...' line")
            i, edit = _read_block(lines, i + 1, path)
            edits.append(edit)
        elif in_rationale:
            rationale.append(line)
        i += 1
    if not title:
        raise ParseError("no 'TITLE: ...' line found")
    if not edits:
        raise ParseError("no edit blocks found: write 'FILE: agent/agent.py' then <<<<<<< SEARCH / ======= / >>>>>>> REPLACE")
    return Proposal(title=title, rationale="\n".join(rationale).strip(), edits=edits)


def _read_block(lines: list[str], i: int, path: str) -> tuple[int, Edit]:
    start = i
    search, replace = [], []
    target = search
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped == DIVIDER and target is search:
            target = replace
        elif stripped == REPLACE:
            if target is search:
                raise ParseError(f"line {i + 1}: REPLACE marker before the ======= divider")
            return i, Edit(path=path, search="\n".join(search), replace="\n".join(replace))
        elif stripped == SEARCH:
            raise ParseError(f"line {i + 1}: a new SEARCH block started before the previous one ended")
        else:
            target.append(lines[i])
        i += 1
    raise ParseError(f"line {start}: edit block for {path} is not closed with '{REPLACE}'")


def check_path(path: str) -> str:
    """The allowlist: files under agent/, not agent/templates/, no escapes."""
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] != "agent" or len(p.parts) < 2:
        raise PatchRejected(f"edit to '{path}' refused: only files under agent/ may change")
    if p.parts[1] == "templates":
        raise PatchRejected(f"edit to '{path}' refused: agent/templates/ is the pristine baseline")
    return str(p)


def apply_edits(root: Path, edits: list[Edit], check_syntax: bool = True) -> dict[str, str]:
    """Apply edits to files under root; returns {path: new text}. Nothing is written if any edit fails."""
    texts: dict[str, str] = {}
    for n, edit in enumerate(edits, 1):
        rel = check_path(edit.path)
        target = (root / rel).resolve()
        if not target.is_relative_to((root / "agent").resolve()):
            raise PatchRejected(f"edit to '{rel}' refused: it resolves outside agent/")
        if rel not in texts:
            texts[rel] = target.read_text() if target.exists() else None
        current = texts[rel]
        if not edit.search.strip():
            if current is not None:
                raise PatchRejected(f"edit {n}: empty SEARCH would create {rel}, but it exists; quote the lines to replace", retryable=True)
            texts[rel] = edit.replace + ("\n" if not edit.replace.endswith("\n") else "")
            continue
        if current is None:
            raise PatchRejected(f"edit {n}: {rel} does not exist", retryable=True)
        count = current.count(edit.search)
        if count != 1:
            first = edit.search.strip().splitlines()[0][:80]
            where = "not found" if count == 0 else f"found {count} times"
            raise PatchRejected(f"edit {n}: SEARCH text for {rel} {where} (it starts with {first!r}); quote exact, unique lines", retryable=True)
        texts[rel] = current.replace(edit.search, edit.replace, 1)
    for rel, text in texts.items():
        if check_syntax:
            _check_syntax(rel, text)
    for rel, text in texts.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return texts


def _check_syntax(rel: str, text: str) -> None:
    if rel.endswith(".py"):
        try:
            ast.parse(text, filename=rel)
        except SyntaxError as exc:
            raise PatchRejected(f"{rel} does not parse: {exc.msg} (line {exc.lineno})") from None
    elif rel.endswith(".toml"):
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PatchRejected(f"{rel} is not valid TOML: {exc}") from None
