"""A scratch copy of the parent's agent/ that a proposer edits, every edit answered at once with what
the candidate's validation would say: the path rules and syntax (evolver.evolution.patch), the static
scan (evolver.evaluation.scan), and whether the copy still changes anything (evolver.evolution.noop).

An edit that fails a check is not applied, so the copy is always a candidate that could be submitted;
what it holds when the proposer submits is the candidate (as whole-file edits of the parent). Paths,
texts and switches come from an LLM: everything is checked, nothing is run.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path
from typing import Optional

from evolver.evaluation.backends.results import SWITCHES
from evolver.evaluation.scan import parse_python, scan_text, scan_tree
from evolver.evolution.dangling import dangling
from evolver.evolution.noop import LAYER_NAMES, agent_files, inert_edit_reason
from evolver.evolution.patch import Edit, PatchRejected, apply_edits, check_path

READ_LINES = 80  # lines per read: a small model's context is the cost
MAX_TEXT = 60_000  # characters one edit may write
GUIDE = "Harness.md"


class Scratch:
    def __init__(self, parent: Path, root: Path, identifiers: frozenset = frozenset(), guide: str = ""):
        self.parent, self.root, self.identifiers, self.guide = Path(parent), Path(root), identifiers, guide
        if self.root.exists():
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True)
        shutil.copytree(self.parent / "agent", self.root / "agent", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        self.edits_made = 0

    # -- reading ----------------------------------------------------------------------------
    def editable(self) -> list[str]:
        return sorted(agent_files(self.root))

    def files(self) -> str:
        lines = [f"{rel} ({len(self._text(rel).splitlines())} lines)" for rel in self.editable()]
        lines.append(f"{GUIDE} (the guide: layers, rules, skill format; read-only)")
        return (
            "files you may read (agent/templates/ is the pristine baseline and never changes):\n"
            + "\n".join(lines)
            + "\nharness layers: "
            + self.switches()
        )

    def switches(self) -> str:
        text = self._text(SWITCHES) or ""
        found = re.findall(r"^(h\d_\w+)\s*=\s*(true|false)", text, re.M)
        return ", ".join(f"{name} {'on' if value == 'true' else 'off'}" for name, value in found) or "(none)"

    def read(self, path: str, start: int = 1, end: Optional[int] = None) -> str:
        text = self._readable(path)
        if text is None:
            return f"cannot read {_short(path)}: {self._why_not(path)}"
        lines = text.splitlines()
        start = max(1, _int(start, 1))
        end = min(len(lines), _int(end, start + READ_LINES - 1), start + READ_LINES - 1)
        if start > len(lines):
            return f"not that far: {path} has {len(lines)} lines; read from start=1, or search_code for what you look for"
        shown = [f"{n:4d}| {lines[n - 1]}" for n in range(start, end + 1)]
        more = f"\n({path}: lines {start}-{end} of {len(lines)}; read on with start={end + 1})" if end < len(lines) else ""
        return "\n".join(shown) + more

    def search(self, compiled) -> list[str]:
        """Lines of agent/'s files and the guide matching a compiled pattern (evolver.evolution.evidence.compile_pattern);
        None in the list marks a search that ran out of time."""
        from evolver.evolution.evidence import search_line

        hits = []
        for rel in [*self.editable(), GUIDE]:
            for n, line in enumerate((self._readable(rel) or "").splitlines(), 1):
                found = search_line(compiled, line)
                if found is None:
                    return [None]
                if found:
                    hits.append(f"{rel}:{n}: {line.strip()[:200]}")
        return hits

    # -- editing ----------------------------------------------------------------------------
    def replace(self, path: str, old: str, new: str) -> str:
        if not isinstance(old, str) or not isinstance(new, str) or not old:
            return "give the exact text to replace (old, at least one character) and its replacement (new), both as text"
        old, new = _unnumbered(old), _unnumbered(new)
        if old == new:
            return "old and new are the same: this edit changes nothing (to delete lines, call remove_lines with their start and end)"
        return self._apply(path, Edit(path=path, search=old, replace=new), quoted="old text")

    def remove_lines(self, path: str, start: int, end: int) -> str:
        """Lines start-end removed, as whole statements: a small model names the lines read_file showed it
        more reliably than it copies them into a replace."""
        current = None if not isinstance(path, str) or self._why_not(path) else self._text(path)
        if current is None:
            return f"cannot edit {_short(path)}: {self._why_not(path) if isinstance(path, str) else 'give a path'}"
        removed = without_lines(current, start, end, python=path.endswith(".py"))
        if isinstance(removed, str):
            return f"not applied: {removed}"
        text, first, last = removed
        span = f"removed lines {first}-{last}" + (
            f" (the statements that start in {start}-{end} end at line {last})" if last != end else ""
        )
        return self._apply(path, Edit(path=path, search=current, replace=text), done=f"applied to {path}: {span}.")

    def removable(self, path: str, start: int, end: int) -> bool:
        """Whether remove_lines(path, start, end) would be applied as it stands."""
        current = None if self._why_not(path) else self._text(path)
        return current is not None and removal(current, path, start, end) is not None

    def guards(self, path: str, start: int, end: int) -> bool:
        """Whether lines start-end are one `if` without `else` (scratch.unguarded)."""
        current = None if self._why_not(path) else self._text(path)
        return current is not None and path.endswith(".py") and unguarded(current, start, end) is not None

    def write(self, path: str, content: str) -> str:
        if not isinstance(content, str):
            return "give the file's whole content as text"
        current = self._text(path) if isinstance(path, str) and not self._why_not(path) else None
        if current == content:
            return f"{path} already holds exactly this: nothing changed"
        edit = Edit(path=path, search=current or "", replace=content)
        return self._apply(path, edit)

    def set_layer(self, layer: str, on) -> str:
        if layer not in LAYER_NAMES:
            return f"no layer {_short(layer)!r}; the layers are: {', '.join(LAYER_NAMES)}"
        if not isinstance(on, bool):
            return "on must be true or false"
        text = self._text(SWITCHES) or ""
        value = "true" if on else "false"
        updated, count = re.subn(rf"^({layer}\s*=\s*)(true|false)", rf"\g<1>{value}", text, flags=re.M)
        if count == 0:
            updated = text + ("" if text.endswith("\n") or not text else "\n") + f"{layer} = {value}\n"
        if updated == text:
            return f"{layer} is already {'on' if on else 'off'}: nothing changed"
        return self._apply(SWITCHES, Edit(path=SWITCHES, search=text, replace=updated))

    def apply(self, edit: Edit) -> str:
        """A SEARCH/REPLACE edit in the guide's patch format, checked as every edit is."""
        return self._apply(edit.path, edit)

    def _apply(self, path: str, edit: Edit, done: str = "", quoted: str = "SEARCH") -> str:
        if len(edit.replace) > MAX_TEXT:
            return f"refused: the text is longer than {MAX_TEXT:,} characters"
        before = self.snapshot()
        try:
            apply_edits(self.root, [edit])
        except PatchRejected as exc:
            return f"not applied: {exc.hinted(quoted)}"
        findings = scan_text(path, self._text(path) or "", self.identifiers)
        if findings:
            self._restore(path, before.get(path))
            return "not applied: the static scan refuses it: " + "; ".join(str(f) for f in findings[:3])
        left = _still_used(before.get(path) or "", self._text(path) or "") if path.endswith(".py") else None
        if left:
            self._restore(path, before.get(path))
            return left
        self.edits_made += 1
        return f"{done or f'applied to {path}.'} {self.status()}"

    def snapshot(self) -> dict[str, Optional[str]]:
        """The editable files' texts, to put one back after a refused edit."""
        return {rel: self._text(rel) for rel in self.editable()}

    def reset(self) -> None:
        """Every edit undone: the editable files as the parent has them (a file made since is removed)."""
        parent = {rel: _read(self.parent / rel) for rel in agent_files(self.parent)}
        for rel in set(parent) | set(self.editable()):
            self._restore(rel, parent.get(rel))

    def _restore(self, rel: str, text: Optional[str]) -> None:
        target = self.root / rel
        if text is None:
            target.unlink(missing_ok=True)
        else:
            target.write_text(text)

    # -- the candidate ----------------------------------------------------------------------
    def changed(self) -> list[str]:
        parent = {rel: _read(self.parent / rel) for rel in agent_files(self.parent)}
        now = {rel: self._text(rel) for rel in self.editable()}
        return sorted(rel for rel in parent.keys() | now.keys() if parent.get(rel) != now.get(rel))

    def status(self) -> str:
        """Where the copy stands against its parent: what a submit would be told."""
        changed = self.changed()
        if not changed:
            return "agent/ is now the same as the parent's: nothing to submit yet"
        inert = inert_edit_reason(self.parent, self.root)
        if inert:
            return f"changed so far: {', '.join(changed)}; but {inert}"
        return f"changed so far: {', '.join(changed)}"

    def problem(self) -> Optional[str]:
        """Why the copy cannot be submitted as a candidate, or None."""
        if not self.changed():
            return "agent/ is the same as the parent's: make an edit first"
        findings = scan_tree(self.root, self.identifiers)
        if findings:
            return "the static scan refuses it: " + "; ".join(str(f) for f in findings[:3])
        return inert_edit_reason(self.parent, self.root)

    def edits(self) -> list[Edit]:
        """The candidate as whole-file edits of the parent (what the loop commits)."""
        out = []
        for rel in self.changed():
            now = self._text(rel)
            if now is not None:  # a deletion cannot be made through the tools
                out.append(Edit(path=rel, search=_read(self.parent / rel) or "", replace=now))
        return out

    # -- helpers ----------------------------------------------------------------------------
    def _why_not(self, path) -> Optional[str]:
        if path == GUIDE:
            return None
        try:
            check_path(path)
        except PatchRejected as exc:
            return str(exc).split(": ", 1)[-1]
        return None if (self.root / path).is_file() else "no such file (list them with list_files)"

    def _readable(self, path) -> Optional[str]:
        if path == GUIDE:
            return self.guide
        return None if self._why_not(path) else self._text(path)

    def _text(self, rel: str) -> Optional[str]:
        return _read(self.root / rel)


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8") if path.is_file() and not path.is_symlink() else None
    except (OSError, UnicodeError):
        return None


def without_lines(text: str, start, end, python: bool):
    """(the text without lines start-end, first, last line removed), or why not. In Python a statement that
    starts in the range is removed whole (a `for` line takes its block), and a block left empty gets `pass`."""
    lines = text.splitlines(keepends=True)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (start, end)) or not 1 <= start <= end <= len(lines):
        return f"give start and end as line numbers, 1 <= start <= end <= {len(lines)}"
    keep_pass = None
    if python:
        tree = parse_python(text)
        statements = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
        grown = True
        while grown:  # a statement that starts inside the range ends inside it
            grown = False
            for node in statements:
                if start <= node.lineno <= end < node.end_lineno:
                    end, grown = node.end_lineno, True
        for node in ast.walk(tree):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if (
                    isinstance(block, list)
                    and block
                    and getattr(node, "lineno", start) < start
                    and all(start <= b.lineno and b.end_lineno <= end for b in block)
                ):
                    keep_pass = " " * block[0].col_offset + "pass\n"
    out = lines[: start - 1] + ([keep_pass] if keep_pass else []) + lines[end:]
    result = "".join(out)
    if python:
        try:
            parse_python(result)
        except SyntaxError as exc:
            return (
                f"without lines {start}-{end} the file does not parse ({exc.msg}, line {exc.lineno}); "
                "remove whole statements: read_file shows where they start and end"
            )
    return result, start, end


def removal(text: str, path: str, start: int, end: int) -> Optional[str]:
    """The text without lines start-end as remove_lines takes them out, or None when that would be refused: it does not
    parse, or it removes what the file still uses."""
    removed = without_lines(text, start, end, python=path.endswith(".py"))
    if isinstance(removed, str) or (path.endswith(".py") and _still_used(text, removed[0]) is not None):
        return None
    return removed[0]


def unguarded(text: str, start: int, end: int) -> Optional[str]:
    """The text with the `if` (without `else`) that is lines start-end replaced by its body, dedented; None when those lines
    are not such an `if`. When such lines leave messages out, its test is what does (harness_code): removed whole, it would
    take the write it guards, and every message that write keeps, with it."""
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError, RecursionError):
        return None
    node = next((n for n in ast.walk(tree) if isinstance(n, ast.If) and (n.lineno, n.end_lineno) == (start, end) and not n.orelse), None)
    if node is None or node.body[0].lineno == start:
        return None
    lines = text.splitlines(keepends=True)
    shift = node.body[0].col_offset - node.col_offset
    body = [line[shift:] if not line[:shift].strip() else line for line in lines[start:end]]
    result = "".join(lines[: start - 1] + body + lines[end:])
    try:
        parse_python(result)
    except SyntaxError:
        return None
    return result


def _still_used(before: str, after: str) -> Optional[str]:
    """Why an edit that leaves a name its file still uses undefined is refused, or None: the candidate
    would fail its smoke test with NameError or AttributeError."""
    found = dangling(before, after)
    if not found:
        return None
    old, new = before.splitlines(), after.splitlines()
    uses = []
    for name, line in found[:3]:
        code = new[line - 1].strip() if 0 < line <= len(new) else ""
        where = next((i + 1 for i, text in enumerate(old) if text.strip() == code), line)  # the file as it stands
        uses.append(f"{name} at line {where}: {_short(code, 90)}")
    return (
        "not applied: it removes the definition of what the file still uses (" + "; ".join(uses) + "). "
        "Change or remove those uses first, or keep the definition"
    )


def _int(value, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _short(value, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


NUMBERED = re.compile(r"^ *\d+\| ?", re.M)


def _unnumbered(text: str) -> str:
    """Text copied from read_file with its line numbers ("  12| code"), as a small model does: the numbers
    go when every line has one, since no line of a file starts that way by chance on every line."""
    lines = text.splitlines()
    return NUMBERED.sub("", text) if lines and all(NUMBERED.match(line) for line in lines) else text
