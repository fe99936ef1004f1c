"""What the Gemini API (generativelanguage.googleapis.com, v1beta models/*:generateContent) refuses, in its words.

Field names are protobuf JSON: each is taken in camelCase or snake_case (litellm sends both kinds), anything
else is refused as Google refuses it, naming the field and where it was: 'Invalid JSON payload received.
Unknown name "seed": Cannot find field.' at the top, '... Unknown name "const" at
'tools[0].function_declarations[0].parameters.properties[3].value': Cannot find field.' inside
(googleapis/python-genai#425, mnfst/llm-gateway#1858, danny-avila/LibreChat#11761); a function's parameters
are an OpenAPI Schema, so JSON-Schema keys outside it ($ref, const, additionalProperties) are refused the same way.
The rest, as users quote them (400 INVALID_ARGUMENT unless said):

- no key: 403 PERMISSION_DENIED "Method doesn't allow unregistered callers (callers without established identity).
  Please use API Key or other form of API consumer identity to call this API." (google-gemini/deprecated-generative-
  ai-python#463).
- function turns: "Please ensure that function call turn comes immediately after a user turn or after a function
  response turn.", "Please ensure that function response turn comes immediately after a function call turn.",
  "Please ensure that the number of function response parts is equal to the number of function call parts of the
  function call turn." (google-gemini/gemini-cli#26486, #17208; langchain-ai/langchain#27799).
- thinking budgets (Google's thinking guide: 2.5 Pro 128..32768 and never off, 2.5 Flash 0..24576, Flash-Lite 0 or
  512..24576, -1 dynamic): "Budget 0 is invalid. This model only works in thinking mode." (snailyp/gemini-balance
  #206), "The thinking budget (52428) is invalid." (RooCodeInc/Roo-Code#4399).
- Gemini 3 in a function-calling turn: each step's first functionCall part must carry the thoughtSignature it came
  with: "Function call is missing a thought_signature in functionCall parts. This is required for tools to work
  correctly, and missing thought_signature may lead to degraded model performance. Additional data, function call
  `default_api:NAME` , position N. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for
  more details." (lbjlaq/Antigravity-Manager#139). Google's documented dummies pass ("skip_thought_signature_validator",
  "context_engineering_is_the_way_to_go": https://ai.google.dev/gemini-api/docs/thought-signatures#faqs; litellm sends
  the first when it has no signature); any other signature this server did not issue is refused: "Thought signature
  is not valid." (a guess at the text).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Callable

FIELDS = {
    "request": {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings", "cachedContent"},
    "content": {"role", "parts"},
    "part": {"text", "thought", "thoughtSignature", "functionCall", "functionResponse", "inlineData", "fileData"},
    "functionCall": {"name", "args", "id"},
    "functionResponse": {"name", "response", "id"},
    "tool": {"functionDeclarations", "googleSearch", "codeExecution", "urlContext"},
    "functionDeclaration": {"name", "description", "parameters", "response"},
    "schema": {
        "type",
        "format",
        "title",
        "description",
        "nullable",
        "enum",
        "maxItems",
        "minItems",
        "properties",
        "required",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "pattern",
        "example",
        "anyOf",
        "propertyOrdering",
        "default",
        "items",
        "minimum",
        "maximum",
    },
    "toolConfig": {"functionCallingConfig"},
    "functionCallingConfig": {"mode", "allowedFunctionNames"},
    "generationConfig": {
        "temperature",
        "topP",
        "topK",
        "candidateCount",
        "maxOutputTokens",
        "stopSequences",
        "seed",
        "presencePenalty",
        "frequencyPenalty",
        "responseMimeType",
        "responseSchema",
        "responseLogprobs",
        "logprobs",
        "thinkingConfig",
    },
    "thinkingConfig": {"thinkingBudget", "includeThoughts", "thinkingLevel"},
}
MODES = ("MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED")
FUNCTION_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_.:-]{0,63}$")
NO_KEY = (
    "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API "
    "consumer identity to call this API."
)
# Thinking budgets by model family: (lowest, highest, may it be 0); -1 asks the model to decide.
DUMMY_SIGNATURES = {b"skip_thought_signature_validator", b"context_engineering_is_the_way_to_go"}
BUDGETS = {"gemini-2.5-pro": (128, 32768, False), "gemini-2.5-flash-lite": (512, 24576, True), "gemini-2.5-flash": (1, 24576, True)}


class Refusal(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def snake(name: str) -> str:
    return re.sub(r"([A-Z])", r"_\1", name).lower()


def fields(obj, kind: str, where: str) -> dict:
    """``obj`` with its keys in camelCase; a key that is no field of ``kind`` is refused."""
    if not isinstance(obj, dict):
        raise Refusal(f"Invalid value at '{where}', expected an object")  # a guess at the text
    out = {}
    for key, value in obj.items():
        if camel(key) not in FIELDS[kind]:
            at = f" at '{where}'" if where else ""
            raise Refusal(f'Invalid JSON payload received. Unknown name "{key}"{at}: Cannot find field.')
        out[camel(key)] = value
    return out


def signed_text(call: dict) -> str:
    """What a function call's thought signature signs: the call itself."""
    return f"{call.get('name')}:{json.dumps(call.get('args') or {}, sort_keys=True)}"


def family(model: str) -> str | None:
    return next((name for name in BUDGETS if model.startswith(name)), None)


def check(body: dict, model: str, signed: Callable[[str, str], bool]) -> dict:
    """Refuse (raise Refusal) what Gemini refuses; the request with every field name in camelCase otherwise."""
    request = fields(body, "request", "")
    contents = request.get("contents")
    if not contents:
        raise Refusal("* GenerateContentRequest.contents: contents is not specified\n")
    request["contents"] = [_content(c, f"contents[{i}]") for i, c in enumerate(contents)]
    if "systemInstruction" in request:
        request["systemInstruction"] = _content(request["systemInstruction"], "system_instruction")
    request["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(request.get("tools") or [])]
    config = fields(request.get("toolConfig") or {}, "toolConfig", "tool_config")
    calling = fields(config.get("functionCallingConfig") or {}, "functionCallingConfig", "tool_config.function_calling_config")
    if calling.get("mode", "AUTO") not in MODES:
        raise Refusal(
            "Invalid value at 'tool_config.function_calling_config.mode' "
            f'(type.googleapis.com/google.ai.generativelanguage.v1beta.FunctionCallingConfig.Mode), "{calling["mode"]}"'
        )
    request["toolConfig"] = {"functionCallingConfig": calling}
    generation = fields(request.get("generationConfig") or {}, "generationConfig", "generation_config")
    generation["thinkingConfig"] = fields(generation.get("thinkingConfig") or {}, "thinkingConfig", "generation_config.thinking_config")
    request["generationConfig"] = generation
    _budget(model, generation["thinkingConfig"].get("thinkingBudget"))
    _turn_order(request["contents"])
    if model.startswith("gemini-3"):
        _signatures(request["contents"], signed)
    return request


def _content(content, where: str) -> dict:
    content = fields(content, "content", where)
    if content.get("role", "user") not in ("user", "model"):
        raise Refusal("Please use a valid role: user, model.")
    parts = content.get("parts")
    if not parts:
        raise Refusal(f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty.\n")
    content["parts"] = [_part(p, f"{where}.parts[{j}]") for j, p in enumerate(parts)]
    return content


def _part(part, where: str) -> dict:
    part = fields(part, "part", where)
    if "inlineData" in part or "fileData" in part:
        raise Refusal("fake provider: inline and file data are not emulated")
    for kind in ("functionCall", "functionResponse"):
        if kind in part:
            part[kind] = fields(part[kind], kind, f"{where}.{snake(kind)}")
    return part


def _tool(tool, where: str) -> dict:
    tool = fields(tool, "tool", where)
    if set(tool) - {"functionDeclarations"}:
        raise Refusal(f"fake provider: the tools {sorted(set(tool) - {'functionDeclarations'})} are not emulated")
    declarations = []
    for k, declaration in enumerate(tool.get("functionDeclarations") or []):
        at = f"{where}.function_declarations[{k}]"
        declaration = fields(declaration, "functionDeclaration", at)
        if not FUNCTION_NAME.match(str(declaration.get("name", ""))):
            raise Refusal(
                f"* GenerateContentRequest.{at}.name: Invalid function name. Must start with a letter or an underscore. Must be a-z, "
                "A-Z, 0-9, or contain underscores, dots, colons and dashes, with a maximum length of 64.\n"
            )
        if "parameters" in declaration:
            declaration["parameters"] = _schema(declaration["parameters"], f"{at}.parameters")
        declarations.append(declaration)
    return {"functionDeclarations": declarations}


def _schema(schema, where: str) -> dict:
    schema = fields(schema, "schema", where)
    if "properties" in schema:
        schema["properties"] = {
            name: _schema(value, f"{where}.properties[{n}].value") for n, (name, value) in enumerate(schema["properties"].items())
        }
    if "items" in schema:
        schema["items"] = _schema(schema["items"], f"{where}.items")
    if "anyOf" in schema:
        schema["anyOf"] = [_schema(s, f"{where}.any_of[{n}]") for n, s in enumerate(schema["anyOf"])]
    return schema


def _budget(model: str, budget) -> None:
    name = family(model)
    if budget is None or budget == -1 or name is None:
        return
    lowest, highest, may_stop = BUDGETS[name]
    if budget == 0 and not may_stop:
        raise Refusal("Budget 0 is invalid. This model only works in thinking mode.")
    if budget != 0 and not lowest <= budget <= highest:
        raise Refusal(f"The thinking budget ({budget}) is invalid.")


def _turn_order(contents: list[dict]) -> None:
    for n, content in enumerate(contents):
        calls = [p for p in content["parts"] if "functionCall" in p]
        answers = [p for p in content["parts"] if "functionResponse" in p]
        before = contents[n - 1] if n else None
        if calls and (before is None or before.get("role", "user") != "user"):
            raise Refusal("Please ensure that function call turn comes immediately after a user turn or after a function response turn.")
        if answers:
            asked = [p for p in before["parts"] if "functionCall" in p] if before is not None and before.get("role") == "model" else []
            if not asked:
                raise Refusal("Please ensure that function response turn comes immediately after a function call turn.")
            if len(asked) != len(answers):
                raise Refusal(
                    "Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn."
                )


def _signatures(contents: list[dict], signed: Callable[[str, str], bool]) -> None:
    """Gemini 3: the current turn's function calls (since the last user text) carry their steps' signatures."""
    start = max((n for n, c in enumerate(contents) if c.get("role", "user") == "user" and any("text" in p for p in c["parts"])), default=0)
    for n, content in enumerate(contents[start:], start):
        calls = [p for p in content["parts"] if "functionCall" in p]
        if not calls:
            continue
        first = calls[0]
        if "thoughtSignature" not in first:
            raise Refusal(
                "Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly, and "
                f"missing thought_signature may lead to degraded model performance. Additional data, function call `default_api:"
                f"{first['functionCall'].get('name')}` , position {n + 1}. Please refer to https://ai.google.dev/gemini-api/docs/"
                "thought-signatures for more details."
            )
        if not (signed(signed_text(first["functionCall"]), first["thoughtSignature"]) or _dummy(first["thoughtSignature"])):
            raise Refusal("Thought signature is not valid.")


def _dummy(signature) -> bool:
    try:
        return base64.b64decode(str(signature), validate=True) in DUMMY_SIGNATURES
    except (binascii.Error, ValueError):
        return False
