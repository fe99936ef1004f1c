"""A fake Anthropic provider on 127.0.0.1: the Messages API as api.anthropic.com applies it, answered
by the scripted models (fake_server.FakeProvider: roles, faults, recorded requests, lifetime).

litellm 1.106.2 reaches it as `anthropic/<model>` with ``api_base=fake.api_base``: the origin, without /v1,
because litellm appends /v1/messages to any base that does not already end with it (a base ending in /v1
would post to /v1/v1/messages, which this server, like Anthropic's, answers 404). It sends the key in
x-api-key and anthropic-version: 2023-06-01; without a key here the answer is 401, without a version 400.

The request is checked as Anthropic checks it (anthropic_rules: fields, blocks, tools, tool_choice, thinking
and its rules, tool_use/tool_result pairing, at most 4 cache_control marks), then translated to the OpenAI
chat shape the scripts read (system, user, assistant with tool_calls, tool results as role "tool"), and the
script's reply comes back as content blocks: a signed thinking block first when thinking is on (its
signature is an HMAC of its text under a secret of this server, so a changed, moved or invented block is
refused when it comes back), then text, then tool_use blocks whose ids the tool_result blocks must name.
stop_reason is tool_use, end_turn, stop_sequence or max_tokens (the reply cut at max_tokens, thinking included).

Prompt caching as Anthropic counts it: only prefixes that end at a block marked cache_control
{"type": "ephemeral"} (tools, then system blocks, then message blocks, in that order) are written, once they
hold the model's minimum (1,024 tokens for Sonnet and Opus 4/4.1, 2,048 for the Haiku 3 models, 4,096 for
Opus 4.5 and Haiku 4.5: Anthropic's prompt-caching guide); a later request reads the longest written prefix it
repeats, found at a marked block or up to 20 blocks before one, within the entry's life (5 minutes, or "ttl":
"1h"; each read renews it), per key and model. usage.input_tokens counts only what was neither read
(cache_read_input_tokens) nor written (cache_creation_input_tokens), as Anthropic reports it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Optional

from evolver.scripted import Reply
from tests.scripts import anthropic_rules
from tests.scripts.anthropic_rules import Refusal, Turn, family, thinking_budget
from tests.scripts.fake_server import Answer, FakeProvider, Received, Signer, tokens
from tests.scripts.prompt_cache import PrefixCache, prefixes

PATH = "/v1/messages"
KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
TTL = {"5m": 300.0, "1h": 3600.0}
LOOKBACK = 20  # blocks before a marked one that are checked for a cached prefix


def minimum_cached(model: str) -> int:
    name = family(model)
    if name in ("claude-opus-4-5", "claude-haiku-4-5"):
        return 4096
    return 2048 if name.startswith("claude-3") and "haiku" in name else 1024


class FakeAnthropic(FakeProvider):
    thread_name = "fake-anthropic"

    def __init__(self, roles: Optional[dict[str, str]] = None, faults=None, lifetime: float = 900.0):
        self.signer = Signer()
        self.cache = PrefixCache(TTL["5m"])
        super().__init__(roles, faults, lifetime)

    @property
    def api_base(self) -> str:
        return self.origin

    def error(self, status: int, message: str) -> dict:
        return {
            "type": "error",
            "error": {"type": KINDS.get(status, "api_error"), "message": message},
            "request_id": "req_" + hashlib.sha256(f"{message}{len(self.received)}".encode()).hexdigest()[:24],
        }

    def listing(self) -> dict:
        names = list(self.roles)
        return {
            "data": [{"type": "model", "id": n, "display_name": n, "created_at": "2025-09-29T00:00:00Z"} for n in names],
            "has_more": False,
            "first_id": names[0] if names else None,
            "last_id": names[-1] if names else None,
        }

    def answer(self, request: Received, headers: dict) -> Answer:
        key, version = headers.get("x-api-key"), headers.get("anthropic-version")
        if not key:
            return 401, self.error(401, "x-api-key header is required"), {}
        if version is None:
            return 400, self.error(400, "anthropic-version: header is required"), {}
        if version not in anthropic_rules.VERSIONS:
            return 400, self.error(400, f'anthropic-version: "{version}" is not a valid version'), {}
        if request.path != PATH:
            return 404, self.error(404, "Not Found"), {}
        body, model = request.body, request.model
        role = self.role_of(model)
        if role is None:
            return 404, self.error(404, f"model: {model}"), {}
        forced = self.injected(request)
        if forced is not None:
            return forced
        try:
            turns = anthropic_rules.check(body, self.signer.signed)
        except Refusal as refusal:
            return refusal.status, self.error(refusal.status, refusal.message), {}
        messages = openai_messages(body, turns)
        reply = self.reply(role, messages, openai_tools(body))
        return 200, self._message(model, body, turns, messages, reply, scope=(hashlib.sha256(key.encode()).hexdigest(), model)), {}

    def _message(self, model: str, body: dict, turns: list[Turn], messages: list[dict], reply: Reply, scope: tuple) -> dict:
        blocks, thought = [], 0
        budget = thinking_budget(body)
        if budget:
            text = f"The conversation has {len(turns)} turns; it ends with: {_last_words(messages)[:200]}"
            blocks.append({"type": "thinking", "thinking": text, "signature": self.signer.sign(text)})
            thought = min(budget, tokens(text) + 1)
        text, calls, stop, sequence = reply.content or "", list(reply.tool_calls), None, None
        for candidate in body.get("stop_sequences") or []:
            if candidate in text:
                text, calls, stop, sequence = text[: text.index(candidate)], [], "stop_sequence", candidate
        output = thought + tokens(text) + 8 * len(calls) + 1
        if output > body["max_tokens"]:
            text, calls, stop, output = text[: max(0, body["max_tokens"] - thought - 1) * 4], [], "max_tokens", body["max_tokens"]
        if text:
            blocks.append({"type": "text", "text": text})
        for n, (name, args) in enumerate(calls):
            seed = f"{len(messages)}:{n}:{name}:{json.dumps(args, sort_keys=True)}"
            blocks.append(
                {"type": "tool_use", "id": "toolu_01" + hashlib.sha256(seed.encode()).hexdigest()[:22], "name": name, "input": args}
            )
        return {
            "id": "msg_01" + hashlib.sha256(json.dumps(blocks).encode()).hexdigest()[:22],
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop or ("tool_use" if calls else "end_turn"),
            "stop_sequence": sequence,
            "usage": {**self._input_usage(scope, body, turns, minimum_cached(model)), "output_tokens": output, "service_tier": "standard"},
        }

    def _input_usage(self, scope: tuple, body: dict, turns: list[Turn], minimum: int) -> dict:
        """Input tokens as Anthropic splits them: read from the cache, written to it, and the rest."""
        system = body.get("system")
        system_blocks = [{"type": "text", "text": system}] if isinstance(system, str) else list(system or [])
        marked = [("tool", t) for t in body.get("tools") or []] + [("system", b) for b in system_blocks]
        marked += [(turn.role, block) for turn in turns for _, _, block in turn.blocks]
        chunks = [
            f"{where}:" + json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True) for where, block in marked
        ]
        ends = prefixes(chunks)
        marks = [(n, block["cache_control"].get("ttl", "5m")) for n, (_, block) in enumerate(marked) if "cache_control" in block]
        read = self.cache.read(scope, [ends[k] for n, _ in marks for k in range(max(0, n - LOOKBACK + 1), n + 1)])
        written, life = 0, "5m"
        eligible = [(n, ttl) for n, ttl in marks if ends[n][0] >= minimum]
        for n, ttl in eligible:
            self.cache.write(scope, [ends[n]], TTL[ttl])
        if eligible:
            last, life = max(eligible)
            written = max(0, ends[last][0] - read)
        total = max(1, ends[-1][0] if ends else 0)
        return {
            "input_tokens": max(0, total - read - written),
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": written if life == "5m" else 0,
                "ephemeral_1h_input_tokens": written if life == "1h" else 0,
            },
        }


def openai_messages(body: dict, turns: list[Turn]) -> list[dict]:
    """The conversation in the OpenAI chat shape the scripts read: tool results become role "tool" messages
    and tool_use blocks tool_calls, with the ids the provider issued."""
    out: list[dict] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": system if isinstance(system, str) else "\n\n".join(b["text"] for b in system)})
    for turn in turns:
        if turn.role == "assistant":
            message: dict = {"role": "assistant", "content": "\n\n".join(b["text"] for _, _, b in turn.of_type("text")) or None}
            calls = [
                {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
                for _, _, b in turn.of_type("tool_use")
            ]
            out.append({**message, "tool_calls": calls} if calls else message)
            continue
        texts = []
        for _, _, block in turn.blocks:
            if block["type"] == "tool_result":
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": _result_text(block.get("content"))})
            else:
                texts.append(block["text"])
        if texts:
            out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def openai_tools(body: dict) -> Optional[list[dict]]:
    tools = body.get("tools")
    if not tools:
        return None
    return [
        {"type": "function", "function": {"name": t["name"], "description": t.get("description", ""), "parameters": t["input_schema"]}}
        for t in tools
    ]


def _result_text(content) -> str:
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return str(content or "")


def _last_words(messages: list[dict]) -> str:
    return next((str(m.get("content")) for m in reversed(messages) if m.get("role") in ("user", "tool") and m.get("content")), "")
