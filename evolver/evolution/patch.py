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
SEARCH creates a new file (or, when the file exists with exactly that text,
changes nothing). The allowlist is enforced here, in code: only plain
.py, .toml, .md, .txt and .json files under agent/, never agent/templates/ (the
pristine baseline), never through a symlink. Paths come from an LLM: anything
wrong with one is a PatchRejected with a one-line reason.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from evolver.evaluation.scan import in_baseline, parse_python


class ParseError(ValueError):
    """The meta-LLM's answer is not in the proposal format."""


class PatchRejected(ValueError):
    """A well-formed patch that may not or cannot be applied, or does not parse.

    retryable: the meta-LLM can fix it by quoting the file correctly (a SEARCH
    mismatch); a refused path or a syntax error is a verdict on the patch.
    """

    def __init__(self, message: str, retryable: bool = False, closest: str = ""):
        super().__init__(message)
        self.retryable = retryable
        self.closest = closest  # for a SEARCH found nowhere: the file's lines most like it, to quote instead

    def hinted(self, quoted: str) -> str:
        """The message, and the lines most like what the model quoted (``quoted``: what it calls that text) when there are some."""
        return str(self) + (
            f"\nThe lines of the file most like your {quoted}, to quote exactly instead:\n{self.closest}" if self.closest else ""
        )


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
    if not isinstance(text, str):
        raise ParseError(f"the answer is {type(text).__name__}, not text")
    lines = text.replace("\r\n", "\n").split("\n")
    title, rationale, edits = None, [], []
    path = None
    i = 0
    in_rationale = False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if title is None and _label("TITLE", stripped):
            title = stripped.split(":", 1)[1].strip(" *#")
        elif _label("RATIONALE", stripped):
            in_rationale = True
            rationale.append(stripped.split(":", 1)[1].strip(" *"))
        elif _label("FILE", stripped):
            in_rationale = False
            path = stripped.split(":", 1)[1].strip().strip("`* ")
        elif stripped == SEARCH:
            in_rationale = False
            if path is None:
                raise ParseError(f"line {i + 1}: a SEARCH block must follow a 'FILE: agent/...' line")
            i, edit = _read_block(lines, i + 1, path)
            if edit not in edits:  # the same block twice (a small model repeats its answer): applied twice, the second could not match
                edits.append(edit)
        elif in_rationale:
            rationale.append(line)
        i += 1
    if not title:
        raise ParseError("no 'TITLE: ...' line found")
    if not edits:
        raise ParseError("no edit blocks found: write 'FILE: agent/agent.py' then <<<<<<< SEARCH / ======= / >>>>>>> REPLACE")
    return Proposal(title=title, rationale="\n".join(rationale).strip(), edits=edits)


def _label(name: str, line: str) -> bool:
    """Whether the line starts with the label, also as markdown ("**TITLE:**", "# TITLE:"): the prompt's own headings
    are markdown, and a model answers in kind ("# TITLE: ...") however often it is told that no TITLE line was found."""
    return re.match(rf"^[#*\s]*{name}\**\s*:", line, re.I) is not None


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
    raise ParseError(
        f"line {start}: edit block for {path!r} is not closed with '{REPLACE}': after '{DIVIDER}' write only the lines "
        f"that take the SEARCH lines' place, then the line '{REPLACE}'"
    )


ALLOWED_SUFFIXES = (".py", ".toml", ".md", ".txt", ".json")
MAX_PATH, MAX_PART = 200, 100
PATH_CHAR = re.compile(r"[A-Za-z0-9._/-]")


def check_path(path: str) -> str:
    """The allowlist: a plain file name under agent/, not agent/templates/, no escapes."""
    if reason := _path_problem(path):
        raise PatchRejected(f"edit to {_shown(path)} refused: {reason}")
    return path


def _path_problem(path: str) -> str | None:
    """Why an LLM-written path may not be edited, in order from the most basic; None if it may."""
    if not isinstance(path, str):
        return "it is not text"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "it contains a control character"
    if len(path) > MAX_PATH:
        return f"it is longer than {MAX_PATH} characters"
    if odd := _odd_chars(path):
        return f"it contains characters outside A-Z a-z 0-9 . _ / -: {odd}"
    parts = path.split("/")
    if path.startswith("/") or ".." in parts:
        return "only files under agent/ may change"
    if any(len(p) > MAX_PART for p in parts):
        return f"a path component is longer than {MAX_PART} characters"
    if "" in parts or "." in parts:
        return "it has an empty or '.' path component"
    if parts[0] != "agent" or len(parts) < 2:
        return "only files under agent/ may change"
    if in_baseline(path):
        return "agent/templates/ is the pristine baseline"
    if any(p.startswith(".") for p in parts):
        return "hidden files and folders may not change"
    if PurePosixPath(path).suffix not in ALLOWED_SUFFIXES:
        return f"only {', '.join(ALLOWED_SUFFIXES)} files may change"
    return None


def _odd_chars(path: str) -> str:
    return " ".join(repr(c) for c in sorted(set(PATH_CHAR.sub("", path)))[:5])


def _shown(path) -> str:
    """The path quoted and escaped, cut short: it may hold anything."""
    text = repr(path) if isinstance(path, str) else type(path).__name__
    return text if len(text) <= 90 else text[:80] + "...'"


def _check_on_disk(root: Path, rel: str) -> Path:
    """The target as it is in the worktree: no symlink on the way (checked without following one),
    no directory or file where a folder or the file should be, and nothing resolving outside agent/."""
    parts = rel.split("/")
    for n in range(1, len(parts) + 1):
        prefix = root.joinpath(*parts[:n])
        if os.path.islink(prefix):
            raise PatchRejected(f"edit to '{rel}' refused: {'/'.join(parts[:n])} is a symlink")
        if n < len(parts) and prefix.exists() and not prefix.is_dir():
            raise PatchRejected(f"edit to '{rel}' refused: {'/'.join(parts[:n])} is not a folder")
    target = root / rel
    if target.is_dir():
        raise PatchRejected(f"edit to '{rel}' refused: it is a folder")
    if not target.resolve().is_relative_to((root / "agent").resolve()):
        raise PatchRejected(f"edit to '{rel}' refused: it resolves outside agent/")
    return target


def apply_edits(root: Path, edits: list[Edit], check_syntax: bool = True) -> dict[str, str]:
    """Apply edits to files under root; returns {path: new text}. Nothing is written if any edit fails."""
    texts: dict[str, str] = {}
    for n, edit in enumerate(edits, 1):
        rel = check_path(edit.path)
        if rel not in texts:
            texts[rel] = _read(root, rel)
        texts[rel] = _apply_one(n, rel, texts[rel], edit)
    for rel, text in texts.items():
        if check_syntax:
            _check_syntax(rel, text)
    _write(root, texts)
    return texts


def _apply_one(n: int, rel: str, current: str | None, edit: Edit) -> str:
    """The file's text after edit n; current is None for a file that does not exist yet."""
    if not edit.search.strip():
        if current is not None and current.strip() == edit.replace.strip():
            return current  # "creates" the file exactly as it is (a small model copying an example): nothing to do
        if current is not None:
            raise PatchRejected(f"edit {n}: empty SEARCH would create {rel}, but it exists; quote the lines to replace", retryable=True)
        return edit.replace + ("\n" if not edit.replace.endswith("\n") else "")
    if current is None:
        raise PatchRejected(f"edit {n}: {rel} does not exist", retryable=True)
    count = current.count(edit.search)
    if count != 1:
        first = edit.search.strip().splitlines()[0][:80]
        where = "not found" if count == 0 else f"found {count} times"
        raise PatchRejected(
            f"edit {n}: SEARCH text for {rel} {where} (it starts with {first!r}); quote exact, unique lines",
            retryable=True,
            closest=closest_lines(current, edit.search) if count == 0 else "",
        )
    return current.replace(edit.search, edit.replace, 1)


CLOSEST_MAX_LINES, CLOSEST_MIN_RATIO, CLOSEST_CANDIDATES = 40, 0.6, 20
COMMENT = re.compile(r"\s+#.*$")


def closest_lines(text: str, search: str) -> str:
    """The run of the text's lines most like a SEARCH that matched nowhere, as many as it has, compared without indentation
    and trailing comments (the first such run on a tie); "" when none is alike. A model told only "not found" quotes the
    same lines again."""
    lines, wanted = text.splitlines(), search.strip("\n").splitlines()
    if not wanted or len(wanted) > CLOSEST_MAX_LINES or len(lines) < len(wanted):
        return ""
    bare = [COMMENT.sub("", line).strip() for line in lines]
    matcher = difflib.SequenceMatcher(None, b="\n".join(COMMENT.sub("", line).strip() for line in wanted), autojunk=False)

    def likeness(i: int, exact: bool) -> float:  # b is the side SequenceMatcher indexes once; quick_ratio bounds ratio from above
        matcher.set_seq1("\n".join(bare[i : i + len(wanted)]))
        return matcher.ratio() if exact else matcher.quick_ratio()

    starts = range(len(lines) - len(wanted) + 1)
    likely = sorted(starts, key=lambda i: -likeness(i, False))[:CLOSEST_CANDIDATES]
    ratio = {i: likeness(i, True) for i in sorted(likely)}
    best = max(ratio, key=ratio.get)  # the first of equals: they are in file order
    return "\n".join(lines[best : best + len(wanted)]) if ratio[best] >= CLOSEST_MIN_RATIO else ""


def _read(root: Path, rel: str) -> str | None:
    """The current text of a target, None if it does not exist; any failure is a refusal."""
    try:
        target = _check_on_disk(root, rel)
        return target.read_text(encoding="utf-8") if target.exists() else None
    except (OSError, UnicodeError, RuntimeError) as exc:  # RuntimeError: a symlink loop in resolve()
        raise PatchRejected(f"edit to '{rel}' refused: it cannot be read ({type(exc).__name__})") from None


def _write(root: Path, texts: dict[str, str]) -> None:
    """Encode everything first, so text that cannot be written fails before any file changes."""
    try:
        data = {rel: text.encode("utf-8") for rel, text in texts.items()}
    except UnicodeError as exc:
        raise PatchRejected(f"patch refused: its text cannot be written as UTF-8 ({exc.reason})") from None
    for rel, raw in data.items():
        try:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(raw)
        except OSError as exc:
            raise PatchRejected(f"edit to '{rel}' refused: it cannot be written ({type(exc).__name__})") from None


def syntax_error(texts: dict[str, str]) -> str:
    """Why apply_edits would refuse these texts as code that does not parse, or ""."""
    try:
        for rel, text in texts.items():
            _check_syntax(rel, text)
    except PatchRejected as exc:
        return str(exc)
    return ""


def _check_syntax(rel: str, text: str) -> None:
    if rel.endswith(".py"):
        try:
            parse_python(text, filename=rel)
        except SyntaxError as exc:
            raise PatchRejected(f"{rel} does not parse: {exc.msg} (line {exc.lineno})") from None
        except (ValueError, RecursionError, MemoryError) as exc:  # a NUL byte; nesting too deep to parse
            raise PatchRejected(f"{rel} does not parse: {type(exc).__name__}") from None
    elif rel.endswith(".toml"):
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PatchRejected(f"{rel} is not valid TOML: {exc}") from None
        except RecursionError:
            raise PatchRejected(f"{rel} is not valid TOML: nested too deeply") from None
