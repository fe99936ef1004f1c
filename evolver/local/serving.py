"""The serving path of the local model: a litellm provider `local/<label>`.

tau2 calls `litellm.completion(model, messages, tools=..., **llm_args)` and
needs OpenAI-style `tool_calls`. Small Qwen models write their calls as text
(bare JSON, a ```json fence, or <tool_call> tags), which llama.cpp's own
parser does not turn into `tool_calls` (measured: docs/local_model.md). This
provider forwards each request to the llama.cpp server (`api_base`) through
litellm's OpenAI-compatible route and then:

- turns calls written as text into `tool_calls` with evolver.toolcalls,
  keeping any other text as the reply's content, so no genuine reply is lost;
- re-asks, a bounded number of times, when the reply is empty (tau2 would
  raise "AssistantMessage must have either content or tool calls"), with a
  short note and some temperature, since greedy decoding repeats itself;
- re-asks once with decoding constrained to the real tools' schemas when the
  reply is a call to a tool that does not exist (constrained decoding for every
  reply would also force a call where the user needs an answer: measured);
  a request with `tool_choice="required"` (the investigating proposer's: it
  wants nothing but calls) is constrained from the start;
- drops repeated calls of a repetition loop;
- for the label `user` (tau2's user simulator), presents the conversation so that
  a small model plays the customer instead of a second assistant
  (evolver.local.customer). The request option `user_adapter` (true by default,
  false to turn it off, or a list of the adapter's steps) chooses it; it is never
  forwarded to the server, and no other label is touched.

`<label>` is sent as the model name and names the counters. The embedded
llama.cpp server serves its one model whatever the name, so evolver uses
`local/agent`, `local/user`, ... there; against another OpenAI-compatible
server (vLLM, Ollama) use its model name, e.g. `local/qwen2.5:7b`, to get the
same handling for a model whose server has no tool-call parser.

Counters: `stats()`, and, if EVOLVER_LOCAL_STATS names a file, a JSON copy
rewritten after every call (the worker runs in its own process; this is how
the controller reads them).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import Counter, defaultdict
from pathlib import Path

from evolver.data import LOCAL_PROVIDER, USER_ADAPTER, USER_HISTORY
from evolver.llm import ConfigurationError
from evolver.local import customer
from evolver.toolcalls import parse_text_tool_calls

PROVIDER = LOCAL_PROVIDER
STATS_ENV = "EVOLVER_LOCAL_STATS"
REASKS = 2
# A turn of tau2's agent or user is a short message or one call; a small model that
# falls into a repetition loop would otherwise generate up to the server's cap,
# minutes at a few tokens/s. Callers that need longer replies pass max_tokens.
DEFAULT_MAX_TOKENS = 512
REASK_TEMPERATURE = 0.7
REASK_NOTE = "Your last reply was empty. Reply now: write your message"
# The label evolver gives tau2's user simulator (config.Config.role); USER_ADAPTER, imported
# above, is the request option that turns the user-role adapter on, off or to some steps.
USER_LABEL = "user"

_counts: dict[str, Counter] = defaultdict(Counter)
_lock = threading.Lock()


def register() -> None:
    """Register `local/...` with litellm (idempotent). Call before the first completion."""
    import litellm
    from litellm import CustomLLM

    if any(item.get("provider") == PROVIDER for item in litellm.custom_provider_map):
        return

    class LocalLLM(CustomLLM):
        def completion(self, model, messages, api_base=None, *args, optional_params=None, **kwargs):
            return complete(model.split("/", 1)[-1], messages, api_base, dict(optional_params or {}))

    litellm.custom_provider_map.append({"provider": PROVIDER, "custom_handler": LocalLLM()})


def stats() -> dict[str, dict[str, int]]:
    """Counters per label: requests, replies (answers from the server, re-asks included),
    native_tool_calls, text_tool_calls (calls parsed from text), empty (first reply
    empty), reasks, recovered (a re-ask gave a non-empty reply), still_empty,
    truncated (cut at max_tokens), repeated_calls_dropped, unknown_tool_reasks,
    constrained_tool_calls (an unknown-tool reply re-asked into a real call); for the
    user label with the adapter on: as_customer (requests presented to it),
    assistant_like (a reply that read like an assistant's), repeats_customer (a reply
    that repeated the customer's earlier line), echoes_agent (a reply that began with
    the agent's last message), rechecks (re-asks of any of them),
    still_off_role (the re-ask was no better)."""
    with _lock:
        return {label: dict(c) for label, c in _counts.items()}


def reset_stats() -> None:
    with _lock:
        _counts.clear()


def complete(label: str, messages: list, api_base: str | None, params: dict):
    """One completion through the server, with text tool calls parsed and empty replies re-asked."""
    if not api_base:  # a configuration error of the trusted side, never the candidate's (evolver.llm.error_table)
        raise ConfigurationError(f"{PROVIDER}/{label} needs api_base: the URL of the local server, e.g. http://127.0.0.1:PORT/v1")
    tool_names = [t["function"]["name"] for t in params.get("tools") or [] if t.get("function")]
    if not (params.get("max_tokens") or params.get("max_completion_tokens")):
        params["max_tokens"] = DEFAULT_MAX_TOKENS
    steps = customer.parse_steps(params.pop(USER_ADAPTER, True))  # options of this provider, not of the server
    history = params.pop(USER_HISTORY, 0)
    try:
        if label == USER_LABEL and steps:
            return _complete_as_customer(messages, api_base, params, tool_names, steps, history if isinstance(history, int) else 0)
        return _complete(label, messages, api_base, params, tool_names)
    finally:
        _publish()


def _complete_as_customer(messages: list, api_base: str, params: dict, tool_names: list[str], steps: frozenset[str], history: int = 0):
    """tau2's user simulator on a small model: the request presented so that it writes the customer's
    message; with the recheck step, a reply that still offers help or repeats the customer's own
    earlier line is asked again once, with the reminder, the begun message, a note against both, and
    some temperature (the same prompt at temperature 0 repeats itself)."""
    _count(USER_LABEL, "as_customer")
    response = _customer_reply(messages, api_base, params, tool_names, steps, history)
    problem = customer.off_role(response.choices[0].message.content, messages)
    if problem is None:
        return response
    _count(USER_LABEL, problem)
    if "recheck" not in steps:
        return response
    _count(USER_LABEL, "rechecks")
    retry = _customer_reply(messages, api_base, {**params, "temperature": REASK_TEMPERATURE}, tool_names, steps, history, recheck=True)
    if customer.off_role(retry.choices[0].message.content, messages):
        _count(USER_LABEL, "still_off_role")
    return retry


def _customer_reply(
    messages: list, api_base: str, params: dict, tool_names: list[str], steps: frozenset[str], history: int = 0, recheck: bool = False
):
    presented, opening = customer.present(messages, steps, has_tools=bool(tool_names), recheck=recheck, history=history)
    response = _complete(USER_LABEL, presented, api_base, params, tool_names)
    message = response.choices[0].message
    message.content = customer.customer_text(message.content, opening)
    return response


def _complete(label: str, messages: list, api_base: str, params: dict, tool_names: list[str]):
    _count(label, "requests")
    if params.get("tool_choice") == "required" and tool_names:
        # llama.cpp does not hold a small Qwen to a call with this template (it answers prose, or empty
        # <tools></tools>); a caller that wants nothing but calls gets decoding constrained to one.
        _count(label, "required_calls")
        params = {**params, "response_format": _call_schema(params["tools"])}
    response = _forward(label, messages, api_base, params)
    _count(label, "replies")
    if _is_empty(response, tool_names):
        _count(label, "empty")
        for _ in range(REASKS):
            _count(label, "reasks")
            note = REASK_NOTE + (", or call one of the tools." if tool_names else ".")
            nudged = list(messages) + [{"role": "system", "content": note}]
            retry_params = {**params, "temperature": REASK_TEMPERATURE}
            response = _forward(label, nudged, api_base, retry_params)
            _count(label, "replies")
            if not _is_empty(response, tool_names):
                _count(label, "recovered")
                break
        else:
            _count(label, "still_empty")
    choice = response.choices[0]
    truncated = choice.finish_reason == "length"
    if truncated:
        _count(label, "truncated")
    if choice.message.tool_calls:
        _count(label, "native_tool_calls")
    elif tool_names and _apply_text_calls(label, choice, tool_names, len(messages), truncated):
        _count(label, "text_tool_calls")
    elif tool_names and _names_an_unknown_tool(choice.message.content, tool_names):
        # It meant to call a tool but made up the name (e.g. "delete_tasks"): ask again
        # with decoding constrained to the real tools and their argument schemas.
        _count(label, "unknown_tool_reasks")
        constrained = {**params, "response_format": _call_schema(params["tools"])}
        retry = _forward(label, messages, api_base, constrained)
        _count(label, "replies")
        if _apply_text_calls(label, retry.choices[0], tool_names, len(messages), False):
            _count(label, "constrained_tool_calls")
            return retry
    return response


def _forward(name: str, messages: list, api_base: str, params: dict):
    import litellm

    # The server needs no key; the OpenAI client insists on one.
    return litellm.completion(model=f"openai/{name}", messages=messages, api_base=api_base, api_key="not-needed", **params)


def _is_empty(response, tool_names: list[str]) -> bool:
    message = response.choices[0].message
    if message.tool_calls:
        return False
    calls, rest = parse_text_tool_calls(message.content, tool_names)
    return not calls and not rest


def _apply_text_calls(label: str, choice, tool_names: list[str], turn: int, truncated: bool) -> bool:
    """Move calls written in the content into tool_calls; keep the rest as content.

    A small model in a repetition loop writes the same call again and again until
    max_tokens: repeats are dropped, and of a reply cut off that way only the
    first call is kept (the rest is the loop, not a plan)."""
    calls, rest = parse_text_tool_calls(choice.message.content, tool_names)
    if not calls:
        return False
    unique = []
    for call in calls:
        if call not in unique:
            unique.append(call)
    if truncated:
        unique = unique[:1]
    if len(unique) < len(calls):
        _count(label, "repeated_calls_dropped")
    from litellm.types.utils import ChatCompletionMessageToolCall, Function

    choice.message.tool_calls = [
        ChatCompletionMessageToolCall(
            id=_call_id(turn, i, c),
            type="function",
            function=Function(name=c["name"], arguments=json.dumps(c["arguments"])),
        )
        for i, c in enumerate(unique)
    ]
    choice.message.content = rest
    choice.finish_reason = "tool_calls"
    return True


def _names_an_unknown_tool(content: str | None, tool_names: list[str]) -> bool:
    """The reply is call-shaped JSON, but to no tool that exists."""
    calls, _ = parse_text_tool_calls(content)
    return bool(calls) and not parse_text_tool_calls(content, tool_names)[0]


def _call_schema(tools: list[dict]) -> dict:
    """A json_schema response format: one call to a known tool, with valid arguments."""
    options = [
        {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"].get("parameters") or {"type": "object"},
            },
        }
        for t in tools
        if t.get("function")
    ]
    return {"type": "json_schema", "json_schema": {"name": "tool_call", "schema": {"anyOf": options}}}


def _call_id(turn: int, index: int, call: dict) -> str:
    """Deterministic (same request, same id) and distinct across the turns of a conversation."""
    digest = hashlib.sha1(f"{turn}:{index}:{call['name']}:{json.dumps(call['arguments'], sort_keys=True)}".encode()).hexdigest()
    return f"call_{digest[:16]}"


def _count(label: str, key: str) -> None:
    with _lock:
        _counts[label][key] += 1


def _publish() -> None:
    path = os.environ.get(STATS_ENV)
    if path:
        from evolver.data import write_json_atomic

        with _lock:
            write_json_atomic(Path(path), {label: dict(c) for label, c in _counts.items()})
