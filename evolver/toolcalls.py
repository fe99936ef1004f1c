"""Turn tool calls that a model wrote as text into structured calls.

Small open models (Qwen2.5 and the like) often answer a tool-calling prompt
with the call as text instead of the provider's native `tool_calls`:

    {"name": "create_task", "arguments": {"user_id": "user_1", "title": "x"}}
    ```json\n[{"name": ..., "arguments": ...}]\n```
    <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>

This is the one parser for that: the local serving path uses it, and so does
the agent harness for providers that have no parser of their own. It is pure
and needs only the standard library.

Whatever is not a call stays in the remaining text, so a genuine reply to the
user is never hidden; a JSON object that merely looks like data (no call
shape, or an unknown tool name when the names are given) is text too.
"""

from __future__ import annotations

import json
import re
from typing import Iterable, Optional

__all__ = ["parse_text_tool_calls"]

_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n?(.*?)(?:```|\Z)", re.S)
_DECODER = json.JSONDecoder()


def parse_text_tool_calls(text: Optional[str], tool_names: Optional[Iterable[str]] = None) -> tuple[list[dict], Optional[str]]:
    """Return (calls, remaining_text); each call is {"name": str, "arguments": dict}.

    remaining_text is the text with the recognised calls (and the fences or
    tags that held only calls) removed, stripped; None when nothing remains.
    """
    if not text:
        return [], None
    known = set(tool_names) if tool_names is not None else None
    calls: list[dict] = []

    def take(segment: str) -> str:
        """Pull the calls out of a segment; return what is left of it."""
        found, rest = _calls_in(segment, known)
        calls.extend(found)
        return rest

    def fenced(match: re.Match) -> str:
        """A fence that held only calls disappears with its markers."""
        body = match.group(2)
        if match.group(1).lower() not in ("", "json", "tool_call", "tool_code", "python"):
            return match.group(0)
        rest = take(body)
        if rest.strip() == body.strip():
            return match.group(0)
        return rest if rest.strip() else ""

    def fences_then_bare(segment: str) -> str:
        return take(_FENCE.sub(fenced, segment))

    def tagged(match: re.Match) -> str:
        """A tag's content is meant as a call, fenced or not; an empty tag goes."""
        before = len(calls)
        rest = fences_then_bare(match.group(1))
        return match.group(0) if len(calls) == before else rest

    text = fences_then_bare(_TAGGED.sub(tagged, text))
    remaining = text.strip()
    return calls, remaining or None


def _calls_in(text: str, known: Optional[set]) -> tuple[list[dict], str]:
    """Find call-shaped JSON values in text; return them and the text without them."""
    calls: list[dict] = []
    kept: list[str] = []
    i = 0
    while i < len(text):
        start = _next_json_start(text, i)
        if start < 0:
            break
        parsed = _decode_at(text, start)
        if parsed is None:
            kept.append(text[i : start + 1])
            i = start + 1
            continue
        value, end = parsed
        found = _as_calls(value, known)
        if found is None:
            kept.append(text[i:end])
        else:
            calls.extend(found)
            kept.append(text[i:start])
        i = end
    kept.append(text[i:])
    return calls, "".join(kept)


def _next_json_start(text: str, pos: int) -> int:
    starts = [p for p in (text.find("{", pos), text.find("[", pos)) if p >= 0]
    return min(starts) if starts else -1


def _decode_at(text: str, start: int) -> Optional[tuple[object, int]]:
    """Decode one JSON value at start; also accept `{{...}}`, which some chat
    templates teach by example (their doubled braces are Jinja escaping)."""
    try:
        value, end = _DECODER.raw_decode(text, start)
        return value, end
    except json.JSONDecodeError:
        pass
    if text.startswith("{{", start):
        try:
            value, end = _DECODER.raw_decode(text, start + 1)
        except json.JSONDecodeError:
            return None
        close = len(text[end:]) - len(text[end:].lstrip())
        if text.startswith("}", end + close):
            return value, end + close + 1
    return None


def _as_calls(value: object, known: Optional[set]) -> Optional[list[dict]]:
    """The calls a JSON value stands for, or None if it is not (only) calls."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    calls = [_as_call(item, known) for item in items]
    return None if any(c is None for c in calls) else calls


def _as_call(item: object, known: Optional[set]) -> Optional[dict]:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):  # OpenAI's own shape, written as text
        item = item["function"]
    name = item.get("name")
    if not isinstance(name, str) or not name:
        return None
    if known is not None and name not in known:
        return None
    args = item.get("arguments", item.get("parameters"))
    if isinstance(args, str):  # arguments as a JSON string, as OpenAI encodes them
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    if args is None:
        # {"name": "x"} alone is only a call when the name is a known tool.
        if known is None or "arguments" in item or "parameters" in item:
            return None
        args = {}
    if not isinstance(args, dict):
        return None
    return {"name": name, "arguments": args}
