"""What api.openai.com refuses in a chat completion, decided as its server decides.

Every request, whatever its model's name (OpenAI's own, the tests' "agent" and "user", a vLLM or llama.cpp
model's), is checked as api.openai.com checks it before any model sees it; a 400 invalid_request_error in
OpenAI's words, as users quote them:

- a key the API does not know: "Unrecognized request argument supplied: top_k", param null, code null
  (xlinx/sd-webui-decadetw-auto-prompt-llm#29; reasoning_effort: coroot/coroot#698).
- messages: a list of at least one object ("Invalid 'messages': empty array. ...", code empty_array), each with a
  known role: "Invalid value: 'wizard'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool',
  and 'developer'.", param messages[0].role, code invalid_value ("Missing required parameter: 'messages[0].role'."
  without one); content a string or a list of parts, null only on an assistant message that calls tools:
  "Invalid value for 'content': expected a string, got null.", param messages.[1].content.
- tool messages: each answers a call of the assistant message before its run of tool messages: "Invalid
  parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.", param
  messages.[3].role (smarter-sh/smarter#264, gpt-4-turbo; OpenAI's typo kept); "Missing parameter
  'tool_call_id': messages with role 'tool' must have a 'tool_call_id'."; an id that call did not make: "Invalid
  parameter: 'tool_call_id' of 'call_x' not found in 'tool_calls' of previous message." (FoundationAgents/
  OpenManus#586); and every call answered before the next other message: "An assistant message with 'tool_calls'
  must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have
  response messages: call_x", param messages.[6].role (router-for-me/CLIProxyAPI#2798; litellm's users meet it
  through OpenAIException, aliasrobotics/cai#111).
- tools: "Missing required parameter: 'tools[0].function'." and '...function.name', a name of letters, digits, _
  and - up to 64 ("Invalid 'tools[0].function.name': string does not match pattern. Expected a string that
  matches the pattern '^[a-zA-Z0-9_-]+$'."), parameters a well-formed JSON Schema ("Invalid schema for function
  'f': [] is not of type 'object', 'boolean'.", FoundationAgents/OpenManus#1162: the metaschema's own words) of
  type object ("... schema must be a JSON Schema of 'type: \"object\"', got 'type: \"None\"'.", vercel/ai#7005)
  with properties at its root ("... In context=(), object schema missing properties.", gpt-4o:
  langchain-ai/langchain-mcp-adapters#137) and items on every array ("... In context=('properties', 'configs'),
  array schema missing items.", streamnative/streamnative-mcp-server#26), param tools[0].function.parameters, code
  invalid_function_parameters; tool_choice none, auto, required or a function, and only with tools ("Invalid value
  for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.").

Then OpenAI's own models, by name (gpt-*, chatgpt-*, o1, o3, ...). Reasoning models are the o-series (o1, o3,
o3-mini, o4-mini, ...) and the GPT-5 family (gpt-5, gpt-5-mini, gpt-5-nano, gpt-5.1, ...) except its chat models
(gpt-5-chat-latest). They take temperature 1 only, refuse `max_tokens` for `max_completion_tokens` and `top_p`
outright, and take `reasoning_effort` with the values of their generation; any other model refuses
`reasoning_effort` as an unknown argument. As users quote them (all seen on api.openai.com):

- temperature: "Unsupported value: 'temperature' does not support 0 with this model. Only the default (1) value
  is supported.", param temperature, code unsupported_value (gpt-5 on Azure: gabrii/Cursor-Azure-GPT-5#33;
  gpt-5-mini: QwenLM/qwen-code#921; gpt-5.4: johny-b/llmcomp#69; o1-mini: OpenHands/OpenHands#4131). The value
  is quoted as it was sent (0.0 stays "0.0").
- max_tokens: "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens'
  instead.", param max_tokens, code unsupported_parameter (gpt-5: griptape-ai/ComfyUI-Griptape#312; o1/o3-mini:
  teilomillet/gollm#33; o3: memochou1993/gpt-ai-assistant#361).
- top_p: "Unsupported parameter: 'top_p' is not supported with this model.", param top_p, code
  unsupported_parameter (o1-preview: aandrew-me/tgpt#333; o3: AsyncFuncAI/deepwiki-open#226; o4-mini:
  lobehub/lobehub#7747).
- reasoning_effort on a model without reasoning (gpt-4o, gpt-4o-mini, gpt-4.1): "Unrecognized request argument
  supplied: reasoning_effort", param null, code null (davidmigloz/langchain_dart#712, AAswordman/Operit#1048).
- sampling with reasoning off: the generations that take reasoning_effort "none" (gpt-5.1 and later, where it is
  also the default) take temperature and top_p while the effort is "none" (as litellm 1.106.2 encodes it,
  llms/openai/chat/gpt_5_transformation.py).
- a value the model's generation lacks: "Unsupported value: 'reasoning_effort' does not support 'none' with this
  model. Supported values are: 'minimal', 'low', 'medium', and 'high'." (Kilo-Org/cloud#3807); gpt-5 takes
  minimal..high, gpt-5.1 none/low/medium/high (anomalyco/opencode#4451), the o-series low..high.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

import jsonschema

_OPENAI = re.compile(r"^(gpt-|chatgpt-|o\d+(-|$))")
_REASONING = re.compile(r"^(o\d+|gpt-5)(?![\w.-]*-chat)")
_EFFORTS = {"o": ("low", "medium", "high"), "gpt-5": ("minimal", "low", "medium", "high"), "gpt-5.": ("none", "low", "medium", "high")}
# The chat completion's request body, as the API reference lists it.
PARAMETERS = frozenset(
    {
        "model",
        "messages",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
ROLES = ("system", "assistant", "user", "function", "tool", "developer")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
# Reasoning tokens a reply spends per effort: deterministic stand-ins, large enough that a small
# max_completion_tokens runs out before the visible answer, as it does on the real models.
REASONING_TOKENS = {"none": 0, "minimal": 16, "low": 128, "medium": 512, "high": 2048}


@dataclass(frozen=True)
class Refusal:
    message: str
    param: Optional[str] = None
    code: Optional[str] = None


def is_reasoning(model: str) -> bool:
    return bool(_REASONING.match(model))


def efforts(model: str) -> tuple[str, ...]:
    """The reasoning_effort values a reasoning model takes, by its generation."""
    if model.startswith("o"):
        return _EFFORTS["o"]
    return _EFFORTS["gpt-5."] if model.startswith("gpt-5.") else _EFFORTS["gpt-5"]


def default_effort(model: str) -> str:
    return "none" if "none" in efforts(model) else "medium"


def refusal(model: str, body: dict) -> Optional[Refusal]:
    """OpenAI's refusal of a chat completion request for ``model``, or None when it takes it: what every request
    must be first, then what OpenAI's own models take."""
    return (
        _unknown(body) or _messages(body.get("messages")) or _tools(body) or (_model_rules(model, body) if _OPENAI.match(model) else None)
    )


def _unknown(body: dict) -> Optional[Refusal]:
    unknown = next((key for key in body if key not in PARAMETERS), None)
    return Refusal(f"Unrecognized request argument supplied: {unknown}") if unknown else None


def _messages(messages) -> Optional[Refusal]:
    if messages is None:
        return Refusal("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        return Refusal(
            f"Invalid type for 'messages': expected an array of objects, but got {_kind(messages)} instead.", "messages", "invalid_type"
        )
    if not messages:
        return Refusal(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            "messages",
            "empty_array",
        )
    asked: list[str] = []  # the ids of the calls the last assistant message made that no tool message has answered yet
    calling = None  # the index of that assistant message
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return Refusal(
                f"Invalid type for 'messages[{i}]': expected an object, but got {_kind(message)} instead.", f"messages[{i}]", "invalid_type"
            )
        role = message.get("role")
        if role is None:
            return Refusal(f"Missing required parameter: 'messages[{i}].role'.", f"messages[{i}].role", "missing_required_parameter")
        if role not in ROLES:
            return Refusal(f"Invalid value: '{role}'. Supported values are: {_listed(ROLES)}.", f"messages[{i}].role", "invalid_value")
        if role != "tool" and asked:
            return _unanswered(calling, asked)
        content, calls = message.get("content"), message.get("tool_calls")
        if content is None and not (role == "assistant" and calls):
            return Refusal("Invalid value for 'content': expected a string, got null.", f"messages.[{i}].content")
        if not isinstance(content, (str, list, type(None))):
            return Refusal(
                f"Invalid type for 'messages[{i}].content': expected one of a string or array of objects, but got "
                f"{_kind(content)} instead.",
                f"messages[{i}].content",
                "invalid_type",
            )
        if role == "assistant":
            calling, asked = i, [str(c.get("id")) for c in calls or []]
        elif role == "tool":
            if calling is None:
                return Refusal(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            answer = message.get("tool_call_id")
            if answer is None:
                return Refusal(
                    "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.",
                    f"messages.[{i}].tool_call_id",
                )
            if answer not in asked:
                return Refusal(
                    f"Invalid parameter: 'tool_call_id' of '{answer}' not found in 'tool_calls' of previous message.",
                    f"messages.[{i}].tool_call_id",
                )
            asked.remove(answer)
        else:
            calling = None
    return _unanswered(calling, asked) if asked else None


def _unanswered(at: int, ids: list[str]) -> Refusal:
    return Refusal(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. "
        f"The following tool_call_ids did not have response messages: {', '.join(ids)}",
        f"messages.[{at}].role",
    )


def _tools(body: dict) -> Optional[Refusal]:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice is not None and not tools:
        return Refusal("Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.", "tool_choice")
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        return Refusal(f"Invalid value: '{choice}'. Supported values are: 'none', 'auto', and 'required'.", "tool_choice", "invalid_value")
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}].function"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            return Refusal(f"Missing required parameter: '{where}'.", where, "missing_required_parameter")
        name = function.get("name")
        if name is None:
            return Refusal(f"Missing required parameter: '{where}.name'.", f"{where}.name", "missing_required_parameter")
        if not TOOL_NAME.match(str(name)):
            return Refusal(
                f"Invalid '{where}.name': string does not match pattern. Expected a string that matches the pattern '{TOOL_NAME.pattern}'.",
                f"{where}.name",
                "invalid_value",
            )
        if len(name) > 64:
            return Refusal(
                f"Invalid '{where}.name': string too long. Expected a string with maximum length 64, but got a string with "
                f"length {len(name)} instead.",
                f"{where}.name",
                "string_above_max_length",
            )
        problem = _schema_problem(function["parameters"]) if "parameters" in function else None
        if problem:
            return Refusal(f"Invalid schema for function '{name}': {problem}.", f"{where}.parameters", "invalid_function_parameters")
    return None


def _schema_problem(schema) -> Optional[str]:
    """What OpenAI says of a function's parameters, or None: a JSON Schema of type object, with properties, every
    array with its items."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return exc.message
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind != "object":
        return f"schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{kind}\"'"
    if "properties" not in schema:
        return "In context=(), object schema missing properties"
    return _array_without_items(schema, ())


def _array_without_items(schema, context: tuple) -> Optional[str]:
    if isinstance(schema, list):
        return next(filter(None, (_array_without_items(s, (*context, str(n))) for n, s in enumerate(schema))), None)
    if not isinstance(schema, dict):
        return None
    kinds = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
    if "array" in kinds and "items" not in schema:
        return f"In context={context!r}, array schema missing items"
    return next(filter(None, (_array_without_items(v, (*context, k)) for k, v in schema.items() if isinstance(v, (dict, list)))), None)


def _kind(value) -> str:
    """A JSON value's type in OpenAI's words ("but got an integer instead")."""
    if isinstance(value, bool):
        return "a boolean"
    return {int: "an integer", float: "a decimal number", str: "a string", dict: "an object", list: "an array"}.get(type(value), "null")


def _listed(values) -> str:
    quoted = [f"'{v}'" for v in values]
    return f"{', '.join(quoted[:-1])}, and {quoted[-1]}"


def _model_rules(model: str, body: dict) -> Optional[Refusal]:
    if not is_reasoning(model):
        if "reasoning_effort" in body:
            return Refusal("Unrecognized request argument supplied: reasoning_effort", None, None)
        return None
    if "max_tokens" in body:
        return Refusal(
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
            "max_tokens",
            "unsupported_parameter",
        )
    effort = body.get("reasoning_effort")
    sampling = (effort or default_effort(model)) == "none"  # reasoning off: sampling as a chat model samples
    temperature = body.get("temperature")
    if temperature is not None and temperature != 1 and not sampling:
        return Refusal(
            f"Unsupported value: 'temperature' does not support {json.dumps(temperature)} with this model. "
            "Only the default (1) value is supported.",
            "temperature",
            "unsupported_value",
        )
    if "top_p" in body and not sampling:
        return Refusal("Unsupported parameter: 'top_p' is not supported with this model.", "top_p", "unsupported_parameter")
    if effort is not None and effort not in efforts(model):
        allowed = [f"'{e}'" for e in efforts(model)]
        return Refusal(
            f"Unsupported value: 'reasoning_effort' does not support '{effort}' with this model. "
            f"Supported values are: {', '.join(allowed[:-1])}, and {allowed[-1]}.",
            "reasoning_effort",
            "unsupported_value",
        )
    return None
