"""What the provider says about its limit (a 429, Retry-After, x-ratelimit-limit-* headers, the tokens a call
used), and what a call costs before it is made."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Optional

CHARS_PER_TOKEN = 4


@dataclass
class Answer:
    """What one call's answer told the lane."""

    limited: bool = False  # a 429
    retry_after: Optional[float] = None  # seconds, from Retry-After
    limit_requests: Optional[float] = None  # x-ratelimit-limit-requests: per minute
    limit_tokens: Optional[float] = None  # x-ratelimit-limit-tokens: per minute
    tokens: Optional[int] = None  # what the call used (prompt and completion), once answered


def read_headers(headers) -> Answer:
    """Retry-After and x-ratelimit-limit-* from a response's headers (litellm prefixes a provider's own
    with llm_provider-); anything unreadable is left out."""
    if not headers:
        return Answer()
    flat = {str(k).lower().removeprefix("llm_provider-"): str(v) for k, v in dict(headers).items()}
    return Answer(
        retry_after=_seconds(flat.get("retry-after-ms"), 0.001) or _seconds(flat.get("retry-after"), 1.0),
        limit_requests=_number(flat.get("x-ratelimit-limit-requests")),
        limit_tokens=_number(flat.get("x-ratelimit-limit-tokens")),
    )


def _number(text: Optional[str]) -> Optional[float]:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value and math.isfinite(value) and value > 0 else None


def _seconds(text: Optional[str], unit: float) -> Optional[float]:
    """Retry-After: seconds (or ms), or "1.5s"; an HTTP date is not read (hosted APIs send seconds)."""
    if text is None:
        return None
    found = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s)?\s*", text)
    if not found:
        return None
    try:
        value = float(found.group(1)) * (0.001 if found.group(2) == "ms" else unit)
    except ValueError:
        return None
    return min(value, 120.0) if math.isfinite(value) else None


def answer_of(response=None, error: Optional[BaseException] = None, limited: bool = False) -> Answer:
    """What a litellm response or error says: its headers (litellm keeps a provider's in
    _hidden_params["additional_headers"], and on an error in litellm_response_headers) and its usage."""
    if error is not None:
        headers = getattr(error, "litellm_response_headers", None) or getattr(getattr(error, "response", None), "headers", None)
        found = read_headers(headers)
        found.limited = limited
        return found
    hidden = getattr(response, "_hidden_params", None) or {}
    found = read_headers(hidden.get("additional_headers") if isinstance(hidden, dict) else None)
    usage = getattr(response, "usage", None)
    total = getattr(usage, "total_tokens", None) if usage is not None else None
    found.tokens = int(total) if isinstance(total, (int, float)) else None
    return found


def estimate_tokens(kwargs: dict) -> int:
    """A call's tokens before it is made, as providers count them for a limit: the prompt (about four
    characters a token) and the completion it may write (max_tokens, when given)."""
    chars = 0
    for message in kwargs.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
        chars += len(content) if isinstance(content, str) else len(json.dumps(content, default=str)) if content else 0
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        chars += len(json.dumps(calls, default=str)) if calls else 0
    if kwargs.get("tools"):
        chars += len(json.dumps(kwargs["tools"], default=str))
    most = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens") or 0
    return max(1, chars // CHARS_PER_TOKEN + (most if isinstance(most, int) else 0))
