"""A fake OpenAI provider on 127.0.0.1: the scripted models over real HTTP, with api.openai.com's rules.

Each request is answered by the script (evolver.scripted, EVOLVER_SCRIPT) for the role its model plays
(fake_server.FakeProvider: a role map, or the model's own name), so `--agent-model openai/agent --api-base URL`
plays the same roles as `scripted/agent`, through litellm's real OpenAI route. It refuses what OpenAI refuses:
a request without a key (401), a model the role map lacks (404), a path other than /v1/chat/completions, and
(openai_rules) for every model an unknown argument, messages out of order or of an unknown role, a tool message
that answers no call, a call left unanswered and a malformed tool schema; for OpenAI's reasoning models their
temperature, max_tokens, top_p and reasoning_effort. Its usage is
OpenAI's: completion_tokens count the reasoning tokens a reasoning model spent (completion_tokens_details), a
reply that outgrows max_completion_tokens (or max_tokens) is cut with finish_reason "length" (all of it when the
reasoning alone fills it), and prompt_tokens_details.cached_tokens emulates OpenAI's automatic prompt caching:
the longest prefix of 1,024 tokens or more, in 128-token steps, that the same key (organisation) sent the same
model in the last `cache_ttl` seconds.

Per model, a fault can be set instead (fake_server.Fault): an HTTP status, 429s or 500s before it answers, a
context limit past which it answers 400 as OpenAI does for an overflowing context, or a dropped connection.

A `Limit` makes it a rate-limited hosted API: a token bucket per model for requests and one for tokens per
minute (a prompt counts its characters / 4, plus its max_tokens), answering 429 with Retry-After (and, like
OpenAI, x-ratelimit-* headers on every answer when `headers` is on) while a bucket is empty; a fixed latency
per call, and an optional share of 500s and slow answers.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Optional

from evolver.scripted import Reply
from tests.scripts import openai_rules
from tests.scripts.fake_server import Answer, FakeProvider, Fault, Received, tokens
from tests.scripts.prompt_cache import PrefixCache, automatic

__all__ = ["FakeOpenAI", "Fault", "Limit", "ROLE"]

# A request body may name the scripted role that answers it (sent with --agent-arg 'extra_body={fake_role = "agent"}'),
# so that every role can call one model name: one provider limit, as for a user running every role on gpt-4.1-mini.
# (A test hook: api.openai.com would refuse the unknown argument.)
ROLE = "fake_role"
CONTEXT_MESSAGE = "This model's maximum context length is {limit} tokens. However, your messages resulted in {used} tokens."
NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth "
    "(i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the API "
    "from your browser and are prompted for a username and password. You can obtain an API key from "
    "https://platform.openai.com/account/api-keys."
)
PATH = "/v1/chat/completions"


@dataclass
class Limit:
    """What a hosted API allows each model: requests and tokens per minute, as token buckets that hold
    ``burst`` seconds of the limit (OpenAI's hold a minute; a short one keeps a benchmark honest)."""

    rpm: float = 0.0  # 0: no request limit
    tpm: float = 0.0  # 0: no token limit
    burst: float = 2.0  # seconds of the limit a full bucket holds (it starts full)
    latency: float = 0.0  # seconds each answered call takes
    errors: float = 0.0  # share of calls answered 500
    slow: float = 0.0  # share of calls that take ``slow_seconds`` more
    slow_seconds: float = 2.0
    headers: bool = False  # x-ratelimit-limit/remaining/reset-* on every answer, as OpenAI sends them
    seed: int = 0


class _Bucket:
    def __init__(self, per_minute: float, burst: float, now: float):
        self.rate, self.capacity = per_minute / 60.0, max(1.0, per_minute / 60.0 * burst)
        self.level, self.at = self.capacity, now

    def fill(self, now: float) -> None:
        self.level, self.at = min(self.capacity, self.level + (now - self.at) * self.rate), now

    def wait(self, amount: float) -> float:
        """Seconds until ``amount`` is there (0: it is)."""
        return max(0.0, (min(amount, self.capacity) - self.level) / self.rate)


class FakeOpenAI(FakeProvider):
    thread_name = "fake-openai"

    def __init__(
        self,
        faults: Optional[dict[str, Fault]] = None,
        lifetime: float = 900.0,
        limit: Optional[Limit] = None,
        roles: Optional[dict[str, str]] = None,
        cache_ttl: float = 300.0,
        extra_parameters: frozenset = frozenset(),
    ):
        self.limit = limit
        # An OpenAI-compatible server's own arguments beyond OpenAI's (a Qwen server's enable_thinking): none, as api.openai.com
        self.extra_parameters = frozenset(extra_parameters)
        self.buckets: dict[str, tuple[Optional[_Bucket], Optional[_Bucket]]] = {}
        self.random = random.Random(limit.seed if limit else 0)
        self.limited: Counter = Counter()  # model -> 429s answered by the limit
        self.refused: list[float] = []  # when each of them was answered (time.monotonic())
        self.answered: list[float] = []  # when each call the limit let through was answered (time.monotonic())
        self.cache = PrefixCache(cache_ttl)
        super().__init__(roles, faults, lifetime)

    @property
    def api_base(self) -> str:
        return f"{self.origin}/v1"

    def error(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
        kind = {401: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}.get(status)
        kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}

    def answer(self, request: Received, headers: dict) -> Answer:
        body, model = request.body, request.model
        key = headers.get("authorization", "").removeprefix("Bearer").strip()
        if not key:
            return 401, self.error(401, NO_KEY), {}
        if request.path != PATH:
            return 404, self.error(404, f"Invalid URL (POST {request.path})"), {}
        role = body.get(ROLE) or self.role_of(model)
        if role is None:
            return 404, self.error(404, f"The model `{model}` does not exist or you do not have access to it.", code="model_not_found"), {}
        limit_headers: dict = {}
        if self.limit is not None:
            refused, limit_headers = self._over_limit(model, body)
            if refused is not None:
                return (*refused, limit_headers)
        forced = self.injected(request)
        if forced is not None:
            return forced
        rule = openai_rules.refusal(model, {k: v for k, v in body.items() if k != ROLE and k not in self.extra_parameters})
        if rule is not None:
            return 400, self.error(400, rule.message, rule.param, rule.code), {}
        fault = self.faults.get(model, Fault())
        chars = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
        if fault.context_chars is not None and chars > fault.context_chars:
            return (
                400,
                self.error(400, CONTEXT_MESSAGE.format(limit=fault.context_chars // 4, used=chars // 4), code="context_length_exceeded"),
                {},
            )
        messages = body.get("messages", [])
        completion = _completion(model, messages, self.reply(role, messages, body.get("tools")))
        self._account(completion, model, body, scope=(hashlib.sha256(key.encode()).hexdigest(), model))
        return 200, completion, limit_headers

    def _account(self, completion: dict, model: str, body: dict, scope: tuple) -> None:
        """OpenAI's usage on the scripted reply: cached prompt tokens, reasoning tokens, the token limit's cut."""
        prompt = _prompt_text(body)
        cached = self.cache.read(scope, automatic(prompt))
        self.cache.write(scope, automatic(prompt))
        reasoning = 0
        if openai_rules.is_reasoning(model):
            reasoning = openai_rules.REASONING_TOKENS[body.get("reasoning_effort") or openai_rules.default_effort(model)]
        choice = completion["choices"][0]
        visible = completion["usage"]["completion_tokens"]
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        if cap and reasoning + visible > cap:
            reasoning = min(reasoning, cap)
            choice["message"]["content"] = (choice["message"].get("content") or "")[: (cap - reasoning) * 4]
            choice["message"]["tool_calls"], choice["finish_reason"], visible = None, "length", cap - reasoning
        prompt_tokens = max(1, tokens(prompt))
        completion["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": reasoning + visible,
            "total_tokens": prompt_tokens + reasoning + visible,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": reasoning,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def _over_limit(self, model: str, body: dict) -> tuple[Optional[tuple[int, dict]], dict]:
        """The limit's word on one call: (a 429 or an injected 500 to answer, or None to answer it; its headers)."""
        limit, now = self.limit, time.monotonic()
        cost = sum(len(str(m.get("content") or "")) for m in body.get("messages", [])) / 4 + (body.get("max_tokens") or 0)
        with self.lock:
            if model not in self.buckets:
                self.buckets[model] = (
                    _Bucket(limit.rpm, limit.burst, now) if limit.rpm else None,
                    _Bucket(limit.tpm, limit.burst, now) if limit.tpm else None,
                )
            requests, words = self.buckets[model]
            waits = []
            for bucket, amount in ((requests, 1.0), (words, cost)):
                if bucket is not None:
                    bucket.fill(now)
                    waits.append(bucket.wait(amount))
            headers = self._rate_headers(requests, words)
            if any(waits):
                self.limited[model] += 1
                self.refused.append(now)
                return (429, self.error(429, "Rate limit reached for requests")), {"Retry-After": f"{max(waits):.3f}", **headers}
            for bucket, amount in ((requests, 1.0), (words, cost)):
                if bucket is not None:
                    bucket.level -= min(amount, bucket.capacity)
            fail, slow = self.random.random() < limit.errors, self.random.random() < limit.slow
        time.sleep(limit.latency + (limit.slow_seconds if slow else 0.0))
        if fail:
            return (500, self.error(500, "fake provider: an injected server error")), headers
        with self.lock:
            self.answered.append(time.monotonic())
        return None, headers

    def _rate_headers(self, requests: Optional[_Bucket], words: Optional[_Bucket]) -> dict:
        if not self.limit.headers:
            return {}
        out = {}
        for name, bucket in (("requests", requests), ("tokens", words)):
            if bucket is not None:
                out[f"x-ratelimit-limit-{name}"] = str(round(bucket.rate * 60))
                out[f"x-ratelimit-remaining-{name}"] = str(math.floor(bucket.level))
                out[f"x-ratelimit-reset-{name}"] = f"{(bucket.capacity - bucket.level) / bucket.rate:.3f}s"
        return out


def _prompt_text(body: dict) -> str:
    """The prompt as one string, in the order the model reads it (tools, then the messages): what caching and
    prompt_tokens count."""
    parts = [json.dumps(body.get("tools") or [], sort_keys=True)]
    for message in body.get("messages", []):
        parts.append(json.dumps({k: message.get(k) for k in ("role", "content", "tool_calls", "tool_call_id")}, sort_keys=True))
    return "".join(parts)


def _completion(model: str, messages: list[dict], reply: Reply) -> dict:
    """The scripted reply as an OpenAI chat completion, built as the in-process scripted provider builds it."""
    from evolver.llm import prepare_environment

    prepare_environment()  # before litellm's first import: no price list from the network
    from litellm import ModelResponse

    from evolver.scripted import _to_model_response

    return _to_model_response(ModelResponse, model, messages, reply).model_dump()
