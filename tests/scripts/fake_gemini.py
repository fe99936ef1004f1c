"""A fake Gemini API on 127.0.0.1: generateContent as generativelanguage.googleapis.com applies it, answered by
the scripted models (fake_server.FakeProvider: roles, faults, recorded requests, lifetime).

litellm 1.106.2 can be pointed at it: for `gemini/<model>` with an api_base it posts to
``{api_base}/models/{model}:generateContent`` with the key in x-goog-api-key (litellm/llms/vertex_ai/
vertex_llm_base.py, _check_custom_proxy, the branch for custom_llm_provider "gemini"), so ``api_base`` here is the
origin plus /v1beta, the layout of Google's own base URL. A key is needed (403 without one, in the header or as
?key=).

The request is checked as Gemini checks it (gemini_rules: field names in camelCase or snake_case, the function
declarations' schemas, the order and count of function call and response turns, the thinking budget of the
model's family, Gemini 3's thought signatures), translated to the OpenAI chat shape the scripts read (function
calls get ids by position, which their responses inherit, as Gemini 2.5 pairs them by order), and the reply comes
back as parts: a thought summary first when thinkingConfig.includeThoughts is on, text, functionCall parts, the
first of them signed (thoughtSignature) when the model thinks. The thinking models (2.5 and 3) think unless the
budget is 0: usageMetadata.thoughtsTokenCount counts it, and it counts against maxOutputTokens (finishReason
MAX_TOKENS, the answer cut, when they run out). Implicit caching: cachedContentTokenCount is the longest prefix of
the prompt (system instruction, tools, contents), in 128-token steps from the model's minimum (2,048 tokens for
2.5, 4,096 for 3: https://ai.google.dev/gemini-api/docs/caching, updated 2026-10-13; earlier versions of that page
said 1,024 for 2.5 Flash and 4,096 for 2.5 Pro), that the same key sent the same model recently; the step is a
guess, Google documents only the minimum.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from typing import Optional

from evolver.scripted import Reply
from tests.scripts import gemini_rules
from tests.scripts.fake_server import Answer, FakeProvider, Received, Signer, tokens
from tests.scripts.gemini_rules import Refusal
from tests.scripts.prompt_cache import PrefixCache, automatic

PATH = re.compile(r"^/v1beta/models/([^/:]+):(\w+)$")
STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
THOUGHTS = 256  # tokens a thinking reply spends (at most its budget): a deterministic stand-in


def minimum_cached(model: str) -> Optional[int]:
    if model.startswith("gemini-2.5"):
        return 2048
    return 4096 if model.startswith("gemini-3") else None


class FakeGemini(FakeProvider):
    thread_name = "fake-gemini"

    def __init__(self, roles: Optional[dict[str, str]] = None, faults=None, lifetime: float = 900.0, cache_ttl: float = 300.0):
        self.signer = Signer()
        self.cache = PrefixCache(cache_ttl)
        super().__init__(roles, faults, lifetime)

    @property
    def api_base(self) -> str:
        return f"{self.origin}/v1beta"

    def model_of(self, path: str, body: dict) -> str:
        found = PATH.match(urllib.parse.urlsplit(path).path)
        return found.group(1) if found else ""

    def error(self, status: int, message: str) -> dict:
        return {"error": {"code": status, "message": message, "status": STATUS.get(status, "UNKNOWN")}}

    def listing(self) -> dict:
        return {"models": [{"name": f"models/{name}", "supportedGenerationMethods": ["generateContent"]} for name in self.roles]}

    def answer(self, request: Received, headers: dict) -> Answer:
        key = headers.get("x-goog-api-key") or headers.get("query:key")
        if not key:
            return 403, self.error(403, gemini_rules.NO_KEY), {}
        found = PATH.match(urllib.parse.urlsplit(request.path).path)
        if not found:
            return 404, self.error(404, "Not Found"), {}
        if found.group(2) != "generateContent":
            return 400, self.error(400, f"fake provider: {found.group(2)} is not emulated"), {}
        model = request.model
        role = self.role_of(model)
        if role is None:
            return (
                404,
                self.error(
                    404,
                    f"models/{model} is not found for API version v1beta, or is not supported for generateContent. "
                    "Call ListModels to see the list of available models and their supported methods.",
                ),
                {},
            )
        forced = self.injected(request)
        if forced is not None:
            return forced
        try:
            checked = gemini_rules.check(request.body, model, self.signer.signed)
        except Refusal as refusal:
            return refusal.status, self.error(refusal.status, refusal.message), {}
        messages = openai_messages(checked)
        reply = self.reply(role, messages, openai_tools(checked))
        return 200, self._response(model, checked, reply, scope=(hashlib.sha256(key.encode()).hexdigest(), model)), {}

    def _response(self, model: str, request: dict, reply: Reply, scope: tuple) -> dict:
        config = request["generationConfig"]
        thinking = config["thinkingConfig"]
        budget = thinking.get("thinkingBudget", -1)
        thinks = model.startswith(("gemini-2.5", "gemini-3")) and budget != 0
        thoughts = (THOUGHTS if budget == -1 else min(budget, THOUGHTS)) if thinks else 0
        text, calls, finish = reply.content or "", list(reply.tool_calls), "STOP"
        for stop in config.get("stopSequences") or []:
            if stop in text:
                text, calls = text[: text.index(stop)], []
        visible = tokens(text) + 8 * len(calls) + (1 if text or calls else 0)
        cap = config.get("maxOutputTokens")
        if cap and thoughts + visible > cap:
            thoughts = min(thoughts, cap)
            text, calls, finish, visible = text[: (cap - thoughts) * 4], [], "MAX_TOKENS", max(0, cap - thoughts)
        parts: list[dict] = []
        if thinks and thinking.get("includeThoughts"):
            parts.append({"text": f"Thinking about a conversation of {len(request['contents'])} turns.", "thought": True})
        if text:
            parts.append({"text": text})
        for n, (name, args) in enumerate(calls):
            call = {"name": name, "args": args}
            signature = {"thoughtSignature": self.signer.sign(gemini_rules.signed_text(call))} if thinks and n == 0 else {}
            parts.append({"functionCall": call, **signature})
        prompt = _prompt_text(request)
        minimum = minimum_cached(model)
        cached = self.cache.read(scope, automatic(prompt, minimum)) if minimum else 0
        if minimum:
            self.cache.write(scope, automatic(prompt, minimum))
        prompt_tokens = max(1, tokens(prompt))
        usage = {
            "promptTokenCount": prompt_tokens,
            "candidatesTokenCount": visible,
            "totalTokenCount": prompt_tokens + visible + thoughts,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt_tokens}],
        }
        if cached:
            usage |= {"cachedContentTokenCount": cached, "cacheTokensDetails": [{"modality": "TEXT", "tokenCount": cached}]}
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        content = {"role": "model", "parts": parts} if parts else {"role": "model"}
        return {
            "candidates": [{"content": content, "finishReason": finish, "index": 0}],
            "usageMetadata": usage,
            "modelVersion": model,
            "responseId": hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24],
        }


def openai_messages(request: dict) -> list[dict]:
    """The conversation in the OpenAI chat shape the scripts read; function call n of content k is call_k_n, and the
    responses of the next content take those ids in order."""
    out: list[dict] = []
    system = request.get("systemInstruction")
    if system:
        out.append({"role": "system", "content": "\n\n".join(p.get("text", "") for p in system["parts"])})
    asked: list[str] = []
    for k, content in enumerate(request["contents"]):
        parts = content["parts"]
        if content.get("role") == "model":
            message: dict = {
                "role": "assistant",
                "content": "\n\n".join(p["text"] for p in parts if "text" in p and not p.get("thought")) or None,
            }
            calls = [p["functionCall"] for p in parts if "functionCall" in p]
            asked = [f"call_{k}_{n}" for n in range(len(calls))]
            tool_calls = [
                {"id": i, "type": "function", "function": {"name": c.get("name"), "arguments": json.dumps(c.get("args") or {})}}
                for i, c in zip(asked, calls)
            ]
            out.append({**message, "tool_calls": tool_calls} if tool_calls else message)
            continue
        answers = [p["functionResponse"] for p in parts if "functionResponse" in p]
        out += [{"role": "tool", "tool_call_id": i, "content": _response_text(a.get("response"))} for i, a in zip(asked, answers)]
        texts = [p["text"] for p in parts if "text" in p]
        if texts:
            out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def openai_tools(request: dict) -> Optional[list[dict]]:
    declarations = [d for tool in request["tools"] for d in tool["functionDeclarations"]]
    if not declarations:
        return None
    return [
        {
            "type": "function",
            "function": {"name": d["name"], "description": d.get("description", ""), "parameters": d.get("parameters", {})},
        }
        for d in declarations
    ]


def _response_text(response) -> str:
    if isinstance(response, dict) and len(response) == 1:
        return str(next(iter(response.values())))
    return json.dumps(response)


def _prompt_text(request: dict) -> str:
    """The prompt as one string, in the order the model reads it: what caching and promptTokenCount count."""
    return json.dumps([request.get("systemInstruction"), request["tools"], request["contents"]], sort_keys=True)
