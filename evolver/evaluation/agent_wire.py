"""What crosses between the trusted side and the agent process, checked: the agent's LLM requests rebuilt from
checked parts (roles, text, tool calls, tool schemas; nothing else reaches the model), its replies as tau2 messages
within bounds, and the model's answers sent back as plain data. Anything else is the candidate's fault (AgentFault)."""

from __future__ import annotations

from tau2.data_model.message import AssistantMessage, ToolCall
from tau2.utils.llm_utils import get_response_usage

from evolver.data import RoleUsage
from evolver.evaluation.agent_host import decode_message

MAX_REPLY_CHARS = 100_000
MAX_TOOL_CALLS = 32
MAX_LLM_MESSAGES = 1000
MAX_TOOLS = 256
LLM_ROLES = ("system", "user", "assistant", "tool")


class AgentFault(Exception):
    """The candidate's agent failed the simulation; the message says how (it scores 0)."""


def assistant_message(wire, usage: RoleUsage) -> AssistantMessage:
    """The agent's reply, rebuilt from its content and tool calls only; usage and cost are the
    trusted side's count of this turn's LLM calls, never the agent's own claim."""
    try:
        message = decode_message(wire)
    except ValueError as exc:
        raise AgentFault(f"the agent's reply is not a valid tau2 message: {clipped(str(exc), 300)}") from None
    if not isinstance(message, AssistantMessage):
        raise AgentFault(f"the agent replied with a {type(message).__name__}, not an AssistantMessage")
    if message.content is not None and len(message.content) > MAX_REPLY_CHARS:
        raise AgentFault(f"the agent's reply has {len(message.content):,} characters (limit {MAX_REPLY_CHARS:,})")
    if message.content is not None and not _encodable(message.content):
        # A lone surrogate cannot be sent to the customer's provider: the failed request would read as
        # the trusted side's infrastructure error, a route to turn a lost task into an unscored one.
        raise AgentFault("the agent's reply is not valid Unicode text (it holds a lone surrogate)")
    calls = message.tool_calls or []
    if len(calls) > MAX_TOOL_CALLS:
        raise AgentFault(f"the agent's reply has {len(calls)} tool calls (limit {MAX_TOOL_CALLS})")
    return AssistantMessage(
        role="assistant",
        content=message.content,
        tool_calls=[ToolCall(id=c.id, name=c.name, arguments=c.arguments, requestor="assistant") for c in calls] or None,
        cost=usage.cost,
        usage={"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
    )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def llm_request(request: dict) -> dict:
    """Messages, tools and tool choice from an agent's LLM request, rebuilt from checked parts;
    nothing else passes. Content is text only: an image or file part names a URL that some
    providers' adapters fetch from this trusted process, a request the candidate must not steer."""
    messages, tools, choice = request.get("messages"), request.get("tools"), request.get("tool_choice")
    if not isinstance(messages, list) or not messages or len(messages) > MAX_LLM_MESSAGES:
        raise AgentFault("the agent's LLM request has no valid message list")
    kwargs: dict = {"messages": [_llm_message(m) for m in messages]}
    if tools is not None:
        if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
            raise AgentFault("the agent's LLM request has malformed tools")
        kwargs["tools"] = [{"type": "function", "function": _llm_function(t)} for t in tools] or None
    if choice is not None:
        if isinstance(choice, dict):
            function = choice.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str):
                raise AgentFault("the agent's LLM request has an invalid tool_choice")
            choice = {"type": "function", "function": {"name": name}}
        elif choice not in ("auto", "none", "required"):
            raise AgentFault("the agent's LLM request has an invalid tool_choice")
        kwargs["tool_choice"] = choice
    return kwargs


def _llm_message(m) -> dict:
    if not isinstance(m, dict) or m.get("role") not in LLM_ROLES:
        raise AgentFault("the agent's LLM request has a message without a valid role")
    clean = {"role": m["role"], "content": _llm_content(m.get("content"))}
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            if not isinstance(m[key], str):
                raise AgentFault(f"the agent's LLM request has a message whose '{key}' is not text")
            clean[key] = m[key]
    calls = m.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list) or len(calls) > MAX_TOOL_CALLS:
            raise AgentFault("the agent's LLM request has malformed tool calls")
        clean["tool_calls"] = [_llm_tool_call(c) for c in calls] or None
    return clean


def _llm_content(content):
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return [{"type": "text", "text": p["text"]} for p in content]
    raise AgentFault("the agent's LLM request has content other than text (only text reaches the model)")


def _llm_tool_call(call) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not (
        isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("arguments"), str)
        and isinstance(call.get("id"), str)
    ):
        raise AgentFault("the agent's LLM request has a malformed tool call")
    return {"id": call["id"], "type": "function", "function": {"name": function["name"], "arguments": function["arguments"]}}


def _llm_function(tool) -> dict:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not (
        isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("description", ""), str)
        and isinstance(function.get("parameters", {}), dict)
    ):
        raise AgentFault("the agent's LLM request has malformed tools")
    return {k: function[k] for k in ("name", "description", "parameters", "strict") if k in function}


def response_wire(response) -> dict:
    """The parts of a completion an agent needs, as plain JSON."""
    choice = response.choices[0]
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in choice.message.tool_calls or []
    ]
    usage = get_response_usage(response) or {}
    return {
        "id": getattr(response, "id", None) or "evolver",
        "model": getattr(response, "model", None) or "evolver-proxy",
        "choices": [
            {
                "index": 0,
                "finish_reason": choice.finish_reason,
                "message": {"role": "assistant", "content": choice.message.content, "tool_calls": calls or None},
            }
        ],
        "usage": {
            "prompt_tokens": usage.get("prompt_tokens") or 0,
            "completion_tokens": usage.get("completion_tokens") or 0,
            "total_tokens": (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0),
        },
    }


def clipped(value, limit: int = 2000) -> str:
    return str(value)[:limit]
