"""The task-data rule: ids and values from tasks or the domain database copied into the harness, in its
code, its comments and its other text files."""

from __future__ import annotations

import io
import re
import tokenize
from functools import lru_cache
from typing import Iterable, Iterator

from evolver.evaluation.scan.findings import short

TOKEN = re.compile(r"[A-Za-z0-9_#.@-]+")
# A value as the failure digest masks it (evolver.evolution.digest.Masker): conversation text copied from the digest, such
# as a fixed customer message "create a task called '<V1>' for <V2>" written into the harness, which a gate could keep.
PLACEHOLDER = re.compile(r"<V\d+>")


def task_data_identifiers(tasks: list[dict], db: dict | None, exclude: Iterable[str] = ()) -> frozenset[str]:
    """What would be a leak if found in the harness: task ids, and what looks like a record identifier
    among the tasks' evaluation criteria and user scenarios and the domain database (keys and values)."""
    found = {str(t["id"]) for t in tasks if "id" in t and not _generic_number(str(t["id"]))}
    for task in tasks:
        found.update(_identifiers_in([task.get("evaluation_criteria"), task.get("user_scenario")]))
    found.update(_identifiers_in(db))
    return frozenset(found - set(exclude))


def _generic_number(text: str) -> bool:
    """A short number ("7", "113") is in every program: as a task id it would block harmless constants."""
    return text.isdigit() and len(text) < 5


def _looks_like_identifier(token: str) -> bool:
    """user_1, task_12, #W2378156, mia_garcia_4516; 555-123-4567, 19122; not HATHAT, not 2024."""
    digits = sum(c.isdigit() for c in token)
    letters = any(c.isalpha() for c in token)
    if letters:
        return digits > 0 and len(token) >= 4
    return digits >= 5 and set(token) <= set("0123456789-")


def _tokens(text: str) -> Iterator[tuple[int, str]]:
    """(offset, token), trailing sentence punctuation dropped: "user_1." is user_1."""
    for m in TOKEN.finditer(text):
        token = m.group().strip(".-")
        if token:
            yield m.start() + m.group().index(token), token


def _identifiers_in(data: object) -> set[str]:
    """Identifier-like tokens of every string, key and integer in nested data (iterative: the db is large)."""
    found, stack = set(), [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, (list, tuple)):
            stack += item
        elif isinstance(item, str):
            for _, token in _tokens(item):
                if _looks_like_identifier(token):
                    found.add(token)
                    if token.startswith("#"):
                        found.add(token[1:])  # "#W2378156" is also written "W2378156"
        elif isinstance(item, int) and not isinstance(item, bool) and len(str(abs(item))) >= 5:
            found.add(str(item))
    return found


@lru_cache(maxsize=8)
def _untokenizable(identifiers: frozenset[str]) -> tuple[str, ...]:
    """Task ids that are not one token (telecom's "[mobile_data_issue]...") are searched as substrings."""
    return tuple(i for i in identifiers if not TOKEN.fullmatch(i) or i != i.strip(".-"))


def data_hits(text: str, identifiers: frozenset[str]) -> Iterator[tuple[int, str]]:
    """(offset, detail) for each identifier in text; the offset finds the line in a multi-line literal."""
    hits = [(m.start(), m.group()) for m in PLACEHOLDER.finditer(text)]
    if identifiers:
        hits += [(pos, token) for pos, token in _tokens(text) if token in identifiers]
        hits += [(text.find(i), i) for i in _untokenizable(identifiers) if i in text]
    shown = short(text.strip())
    for pos, hit in hits:
        yield pos, repr(hit) if shown == repr(hit) else f"{hit!r} in {shown}"


def comment_hits(text: str, identifiers: frozenset[str]) -> list[tuple[int, str, str]]:
    """Comments count too: code can read its own source."""
    if not identifiers and not PLACEHOLDER.search(text):
        return []  # tokenizing for nothing to look for
    try:
        comments = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return []  # ast accepted it, so this is a tokenizer corner; the code itself was scanned
    return [(t.start[0], "task-data", d) for t in comments for _, d in data_hits(t.string, identifiers)]
