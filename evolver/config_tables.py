"""The table settings: a role's litellm arguments ([agent_args], [user_args], [meta_args], [judge_args])
and the rate limits ([rate_limits]), what each may hold and how each is read from a file, a variable or flags.

Each is checked key by key, one line on the first fault, before anything is spent (evolver.config_load
reads every setting through here for these two).
"""

from __future__ import annotations

import json
import tomllib
from typing import Any, Optional

from evolver.config import REASONING_EFFORTS, SPECS
from evolver.data import USER_ADAPTER
from evolver.errors import UsageError


def _whole(low: Optional[int]):
    def check(value):
        if not isinstance(value, int) or isinstance(value, bool):
            return "is not a whole number"
        return f"must be at least {low}" if low is not None and value < low else None

    return check


def _number(low: float, high: float, above: bool = False):
    def check(value):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or value in (float("inf"), float("-inf")):
            return "is not a finite number"
        if (value <= low if above else value < low) or value > high:
            return f"must be more than {low:g}" if above else f"must be between {low:g} and {high:g}"
        return None

    return check


def _one_of(choices: tuple[str, ...]):
    return lambda value: None if value in choices else f"is not one of: {', '.join(choices)}"


def _boolean(value):
    return None if isinstance(value, bool) else "is not true or false"


def _stops(value):
    texts = [value] if isinstance(value, str) else value
    ok = isinstance(texts, list) and 1 <= len(texts) <= 4 and all(isinstance(t, str) and t for t in texts)
    return None if ok else "is not a text or a list of 1 to 4 texts"


# Keys a request body must hold as evolver builds them: extra_body may not replace them.
BODY_KEYS = ("model", "messages", "tools", "tool_choice", "stream", "n", "api_key")


def _body(value):
    if not isinstance(value, dict):
        return "is not a table"
    taken = sorted(set(value) & set(BODY_KEYS))
    return f"may not set {', '.join(taken)} (evolver builds the request's {', '.join(taken)} itself)" if taken else None


def _table(value):
    return None if isinstance(value, dict) else "is not a table"


# The litellm arguments a role's table (agent_args, user_args, meta_args, judge_args) may hold: what
# hosted and self-hosted models need beside the model string. Name -> (check, what it accepts).
LLM_ARGS: dict[str, tuple[Any, str]] = {
    "max_tokens": (_whole(1), "a whole number, 1 or more"),
    "max_completion_tokens": (_whole(1), "a whole number, 1 or more (reasoning tokens included)"),
    "temperature": (_number(0, 2), "a number, 0-2"),
    "top_p": (_number(0, 1), "a number, 0-1"),
    "seed": (_whole(None), "a whole number"),
    "presence_penalty": (_number(-2, 2), "a number, -2-2"),
    "frequency_penalty": (_number(-2, 2), "a number, -2-2"),
    "reasoning_effort": (_one_of(REASONING_EFFORTS), ", ".join(REASONING_EFFORTS)),
    "verbosity": (_one_of(("low", "medium", "high")), "low, medium, high"),
    "stop": (_stops, "a text, or a list of 1 to 4 texts"),
    "timeout": (_number(0, 86400, above=True), "seconds per request, more than 0"),
    "parallel_tool_calls": (_boolean, "true, false"),
    "drop_params": (_boolean, "true, false: litellm drops what the model does not take (evolver leaves that out already: docs/models.md)"),
    "extra_body": (_body, "a table of the provider's own options, sent in the request body (not model, messages, tools)"),
    "thinking": (_table, 'a table, e.g. {type = "enabled", budget_tokens = 2048} (Anthropic)'),
}
# Arguments that have a place of their own, or that evolver must set itself: refused in a table, with where they go.
REFUSED_ARGS: dict[str, str] = {
    "model": "the model is {role}_model",
    "api_base": "the server is api_base or {role}_api_base",
    "base_url": "the server is api_base or {role}_api_base",
    "api_key": "keys stay in the provider's environment variable (OPENAI_API_KEY, ...), never in a setting",
    "extra_headers": "headers can carry credentials; give the key through the provider's environment variable",
    "num_retries": "retries are llm_retries",
    "messages": "evolver builds each request's messages itself",
    "tools": "evolver builds each request's tools itself",
    "tool_choice": "evolver builds each request's tool_choice itself",
    "stream": "evolver reads whole answers",
    "n": "evolver reads one answer per call",
    USER_ADAPTER: "the embedded user's adapter is local_user_adapter",
}
# Arguments that have a setting of their own for some roles: role -> setting.
OWN_SETTINGS = {
    "temperature": {"agent": "agent_temperature", "user": "user_temperature"},
    "reasoning_effort": {r: f"{r}_reasoning_effort" for r in ("agent", "user", "meta")},
}


def _arg_value(text: str) -> Any:
    """A --role-arg value: JSON (2048, 0.5, true, {"enable_thinking": false}), a TOML value
    ({enable_thinking = false}), or else the text as it is (medium)."""
    for parse in (json.loads, lambda t: tomllib.loads(f"v = {t}")["v"]):
        try:
            return parse(text)
        except (ValueError, tomllib.TOMLDecodeError):
            continue
    return text


def parse_llm_args(name: str, where: str, raw: Any) -> dict:
    """A role's table of litellm arguments from a file (a TOML table), a variable (a JSON object or a
    TOML inline table) or flags (KEY=VALUE each); every key and value checked, one line on the first fault."""
    role = name.removesuffix("_args")

    def argument(item: str) -> tuple[str, Any]:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{where} {item} is not KEY=VALUE (e.g. {where} max_tokens=2048); fix it")
        return key.strip(), _arg_value(text.strip())

    table, subject = _table_of(
        name, where, raw, argument, '{max_tokens = 2048} or {"max_tokens": 2048}', f"model arguments ([{name}] with one key per line)"
    )
    for key, value in table.items():
        if key in OWN_SETTINGS and role in OWN_SETTINGS[key]:
            raise UsageError(f"{subject}: '{key}' has a setting of its own: set {OWN_SETTINGS[key][role]} instead")
        if key in REFUSED_ARGS:
            raise UsageError(f"{subject}: '{key}' is not taken here: {REFUSED_ARGS[key].format(role=role)}; fix it")
        if key not in LLM_ARGS:
            hint = f" (a [{name}] table holds every key below it: put it at the end of the file)" if key in SPECS else ""
            raise UsageError(f"{subject}: unknown model argument '{key}'{hint}; known: {', '.join(sorted(LLM_ARGS))}; fix it")
        problem = LLM_ARGS[key][0](value)
        if problem:
            raise UsageError(f"{subject}: {key} = {json.dumps(value)} {problem}; fix it")
    return dict(table)


def _table_of(name: str, where: str, raw: Any, item, example: str, what: str) -> tuple[dict, str]:
    """A table setting as given: from a file (a TOML table), a variable (a JSON object or a TOML inline table,
    e.g. ``example``) or flags (one ``item`` each, read into a key and a value). Returns it and how a fault names it."""
    subject = where if where.startswith("--") else f"{where}: {name}"
    if isinstance(raw, list):  # flags
        return dict(item(str(entry)) for entry in raw), subject
    if isinstance(raw, str):  # a variable
        table = _arg_value(raw.strip())
        if not isinstance(table, dict):
            raise UsageError(f"{subject} = {raw!r} is not a table: write {example}; fix it")
        return table, subject
    if isinstance(raw, dict):
        return raw, subject
    raise UsageError(f"{subject} = {raw!r} is not a table of {what}; fix it")


LIMIT_KEYS = ("rpm", "tpm")


def parse_rate_limits(name: str, where: str, raw: Any) -> dict:
    """rate_limits from a file ([rate_limits] with "MODEL" = {rpm = 500, tpm = 200000} per line), a variable (a
    JSON object or a TOML inline table of the same) or flags (MODEL=RPM/TPM each: 500, 500/200000, /200000,
    or MODEL={rpm = 500}); one line on the first fault."""
    example = '"openai/gpt-4.1-mini" = {rpm = 500, tpm = 200000}'

    def limit(item: str) -> tuple[str, Any]:
        model, sep, text = item.partition("=")
        if not sep or not model.strip() or not text.strip():
            raise UsageError(f"{where} {item} is not MODEL=RPM/TPM (e.g. {where} openai/gpt-4.1-mini=500/200000); fix it")
        text = text.strip()
        if "{" not in text:
            rpm, _, tpm = text.partition("/")
            text = "{" + ", ".join(f"{k} = {v.strip()}" for k, v in (("rpm", rpm), ("tpm", tpm)) if v.strip()) + "}"
        try:
            return model.strip(), tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            raise UsageError(f"{where} {item}: the limit is not RPM/TPM in numbers (e.g. 500/200000); fix it") from None

    table, subject = _table_of(name, where, raw, limit, "{" + example + "}", f"limits ([{name}] with one model per line, {example})")
    for model, limit in table.items():
        if not isinstance(limit, dict) or not limit:
            hint = f" (a [{name}] table holds every key below it: put it at the end of the file)" if model in SPECS else ""
            raise UsageError(f"{subject}: '{model}' = {json.dumps(limit)} is not a limit{hint}; write {example}; fix it")
        for key, value in limit.items():
            if key not in LIMIT_KEYS:
                raise UsageError(
                    f"{subject}: '{model}' has '{key}': a limit takes rpm (requests per minute) and tpm (tokens per minute); fix it"
                )
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not value == value
                or value in (float("inf"),)
                or value <= 0
            ):
                raise UsageError(f"{subject}: '{model}' {key} = {json.dumps(value)} is not a number more than 0; fix it")
    return {model: dict(limit) for model, limit in table.items()}
