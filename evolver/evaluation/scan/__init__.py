"""A static scan of a candidate's agent/ files: cheap refusals, each with a reason.

Defence in depth before any simulation: the OS sandbox is the real boundary.
A patch comes from an LLM and is hostile input, so this flags what a harness
never needs (processes, network, native code, environment variables, files
outside agent/, interpreter tampering, its own model settings, tau2's or
evolver's internals) and task data copied into the harness. It reads source
only; nothing it scans is imported or run.

What is accepted, so a refusal can be explained:
- tau2: only tau2.agent.*, tau2.data_model.message and tau2.utils.llm_utils
  (what the template uses); evolver: only evolver.toolcalls.
- files: open(), Path() and directory listings only with a path built from
  HERE or __file__ (agent/), never climbing above agent/.
- the model: generate(model=self.llm, ..., **self.llm_args) exactly as tau2
  passes them in (or `model=self.llm or FALLBACK`, auto-harness's form: evolver
  always sets self.llm, so the fallback never runs); no sampling keyword of the
  agent's own.
- the environment: only AGENT_MODEL and AGENT_REASONING_EFFORT, each read by its
  name written out (os.environ.get, os.getenv, os.environ[...]): the names the
  agent process is given (evolver.data.AGENT_ENV). The model the trusted side
  calls stays the configured one whatever the agent does with them.

Where each rule lives: findings (the rules and their reasons), forbidden (modules, names and
attributes: processes, network, native code, environment, interpreter, tau2's and evolver's
internals), filesystem, model_settings, taskdata; python walks a Python file's tree against them
(syntax reads its names); this module scans a file or a tree, and parses candidate code.
"""

from __future__ import annotations

import ast
import os
import symtable
import threading
import warnings
from pathlib import Path, PurePosixPath
from typing import Iterator

from evolver.evaluation.scan.findings import Finding, short
from evolver.evaluation.scan.python import Visitor
from evolver.evaluation.scan.syntax import aliases
from evolver.evaluation.scan.taskdata import comment_hits, data_hits

SCANNED_SUFFIXES = (".py", ".md", ".toml", ".txt", ".json")
BASELINE = "agent/templates"  # the pristine template: never edited by a run, never a candidate's code


def in_baseline(rel: str) -> bool:
    """Whether a path from the checkout's root lies in agent/templates/: the one rule every part applies."""
    return rel == BASELINE or rel.startswith(BASELINE + "/")


# ---- public API ------------------------------------------------------------------


def scan_text(rel_path: str, text: str, identifiers: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings for one file's text, sorted by line; Python is parsed, other text is tokenized."""
    if rel_path.endswith(".py"):
        found = _scan_python(text, identifiers)
    else:
        found = [(n, "task-data", d) for n, line in enumerate(text.splitlines(), 1) for _, d in data_hits(line, identifiers)]
    return sorted({Finding(rule, rel_path, line, detail) for line, rule, detail in found}, key=_order)


def scan_tree(root: Path, identifiers: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings for every scanned file under root/agent, except agent/templates/ (the pristine baseline)."""
    found = []
    for path in _candidate_files(root / "agent"):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found.append(Finding("filesystem", rel, 1, f"symlink to {short(os.readlink(path))}"))
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            found.append(Finding("unreadable", rel, 1, type(exc).__name__))
            continue
        found += scan_text(rel, text, identifiers)
    return sorted(found, key=_order)


# ---- Python ----------------------------------------------------------------------

# CPython 3.11's ast.parse is not safe in two threads at once (its recursion-depth check can raise
# "SystemError: AST constructor recursion depth mismatch", gh-106905): the candidates of an iteration
# are proposed, checked and scanned in threads, so every parse of candidate code goes through one lock.
_PARSING = threading.Lock()


def parse_python(text: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """ast.parse, one thread at a time (see _PARSING)."""
    with _PARSING:
        return ast.parse(text, filename=filename, mode=mode)


def symbol_table(text: str, filename: str = "<unknown>") -> symtable.SymbolTable:
    """symtable.symtable, which parses too, under the same lock."""
    with _PARSING:
        return symtable.symtable(text, filename, "exec")


def _scan_python(text: str, identifiers: frozenset[str]) -> list[tuple[int, str, str]]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like: the code is refused or not, never run
            tree = parse_python(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return [(getattr(exc, "lineno", None) or 1, "unreadable", f"does not parse: {type(exc).__name__}")]
    visitor = Visitor(identifiers, aliases(tree))
    try:
        visitor.visit(tree)
    except RecursionError:
        return [(1, "unreadable", "nested too deeply to check")]
    return visitor.found + comment_hits(text, identifiers)


# ---- files -----------------------------------------------------------------------


def _candidate_files(agent: Path) -> Iterator[Path]:
    """Scanned files under agent/, and every symlink (refused, never followed)."""
    if agent.is_symlink():
        yield agent
        return
    for folder, dirs, files in os.walk(agent):
        here = Path(folder)
        links = [here / d for d in dirs if (here / d).is_symlink()]
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not in_baseline((here / d).relative_to(agent.parent).as_posix()))
        yield from links
        yield from (here / f for f in sorted(files) if (here / f).is_symlink() or PurePosixPath(f).suffix in SCANNED_SUFFIXES)


def _order(f: Finding) -> tuple:
    return (f.path, f.line, f.rule, f.detail)
