"""What a request to a model may carry, decided from litellm's model information, not from lists of names.

Every LLM call of every role crosses evolver.llm.retrying, which sends what ``shape`` keeps:

- an option the model does not take (litellm's supported parameters for it) is left out: Anthropic's
  models take no ``seed``, OpenAI's reasoning models no ``stop`` or ``top_p``;
- an option litellm itself would refuse for this model, with this reasoning setting, is left out: an
  OpenAI reasoning model takes temperature 1 only (litellm's own mapping is asked, value by value);
- where litellm maps the request to Anthropic's extended thinking (a reasoning effort, or a ``thinking``
  table), Anthropic's rules hold: temperature 1 (left out), no forced tool choice ("auto" instead),
  ``max_tokens`` above the thinking budget litellm sends for the effort;
- an OpenAI reasoning model's token limit goes as ``max_completion_tokens``, the name it takes.

What is left out is said once, in the command's preflight line for the role (evolver.cli.preflight).
evolver's own providers (the scripted test models, the embedded model) are judged as litellm judges
them: by OpenAI's list of parameters (no reasoning effort). The thinking blocks of a tool-using turn
must reach the provider again with that turn (``ThinkingMemory``), and a growing conversation is
marked for the provider's prompt cache where the provider needs marks (``cache_marked``).
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

# Options litellm maps per model (its OpenAI parameters): each is checked against the model. Everything
# else passes as it is: the conversation (messages, tools), the client's settings (api_base, timeout,
# extra_body, drop_params) and the arguments of evolver's own providers.
CHECKED = (
    "temperature",
    "top_p",
    "n",
    "stop",
    "max_tokens",
    "max_completion_tokens",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "tool_choice",
    "parallel_tool_calls",
    "logprobs",
    "top_logprobs",
    "reasoning_effort",
    "thinking",
    "response_format",
    "verbosity",
    "service_tier",
)
CONTEXT = ("reasoning_effort", "thinking")  # what decides whether the model reasons: every other option is judged with them
THINKING_ON = ("enabled", "adaptive")
MIN_TOP_P_THINKING = 0.95  # Anthropic takes top_p from 0.95 to 1 while it thinks
DEFAULT_EFFORT = "medium"  # the effort a reasoning model is budgeted for when none is set

# The preflight's request (evolver.cli.preflight): one short exchange, shaped like a role's real ones.
PREFLIGHT_TEXT = "evolver checks that this model takes its requests: answer with the single word ok."
PREFLIGHT_TOOL = {
    "type": "function",
    "function": {
        "name": "evolver_preflight",
        "description": "Does nothing: evolver checks that the model takes tools. Do not call it.",
        "parameters": {"type": "object", "properties": {"note": {"type": "string", "description": "any text"}}, "required": []},
    },
}


def preflight_messages() -> list[dict]:
    return [{"role": "system", "content": "You are being checked before a run."}, {"role": "user", "content": PREFLIGHT_TEXT}]


def is_preflight(messages) -> bool:
    """Whether a request is the preflight's (the scripted models answer it themselves): its last message
    holds the preflight's words, as text or as a provider's text blocks."""
    last = messages[-1] if messages else None
    content = last.get("content") if isinstance(last, dict) else getattr(last, "content", None)
    if isinstance(content, list):
        content = " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return isinstance(content, str) and PREFLIGHT_TEXT in content


@dataclass(frozen=True)
class Rules:
    """What one configuration (a model, its endpoint, its options) may carry."""

    left_out: dict[str, str] = field(default_factory=dict)  # option -> why it is not sent
    replaced: dict[str, Any] = field(default_factory=dict)  # option -> what is sent instead
    removed: tuple[str, ...] = ()  # options sent under another name (in replaced)
    changed: tuple[str, ...] = ()  # what a replacement changed, in words
    reasoning_budget: Optional[int] = None  # tokens the model may think before it answers, when it reasons on this request

    def notes(self) -> list[str]:
        return [f"{name} ({why})" for name, why in self.left_out.items()] + list(self.changed)


@dataclass(frozen=True)
class Shaped:
    kwargs: dict
    rules: Rules


def shape(kwargs: dict) -> Shaped:
    """The request ``kwargs`` (litellm.completion's) as its model takes it, and the rules applied."""
    options = {k: v for k, v in kwargs.items() if k in CHECKED and v is not None}
    placed = _provider(str(kwargs.get("model") or ""), kwargs.get("api_base")) if options else None
    rules = _rules(str(kwargs.get("model") or ""), *placed, json.dumps(options, sort_keys=True, default=str)) if placed else Rules()
    if not (rules.left_out or rules.replaced):
        return Shaped(kwargs, rules)
    out = {k: v for k, v in kwargs.items() if k not in rules.left_out and k not in rules.removed}
    return Shaped({**out, **rules.replaced}, rules)


def rules_for(model: str, api_base: Optional[str], options: dict) -> Rules:
    """The rules for a role's configuration plus the options a caller adds (a proposer's temperature)."""
    kwargs = {"model": model, "api_base": api_base, **options}
    return shape(kwargs).rules


def takes(model: str, api_base: Optional[str], args: dict, option: str, value: Any) -> bool:
    """Whether a request with the role's ``args`` may carry ``option`` = ``value`` (a proposer varies only those)."""
    return option not in rules_for(model, api_base, {**args, option: value}).left_out


def placed_name(model: str, api_base: Optional[str]) -> str:
    """The model as litellm places it, its provider first (gpt-4.1 -> openai/gpt-4.1): one form for a default
    model and a configured one."""
    placed = _provider(model, api_base)
    return model if placed is None or model.startswith(f"{placed[1]}/") else f"{placed[1]}/{placed[0]}"


_placed: dict[tuple[str, Optional[str]], tuple[str, str]] = {}


def _provider(model: str, api_base: Optional[str]) -> Optional[tuple[str, str]]:
    """(the model's own name, its litellm provider), or None for a model string litellm cannot place (yet:
    evolver's own providers, scripted and local, are placed once registered, as litellm's completion places
    them; or never: litellm refuses the call itself)."""
    if (model, api_base) in _placed:
        return _placed[(model, api_base)]
    import litellm
    from litellm.utils import custom_llm_setup

    litellm.suppress_debug_info = True  # its lookups print a provider list to the terminal
    custom_llm_setup()
    try:
        name, provider, _, _ = litellm.get_llm_provider(model=model, api_base=api_base)
    except Exception:  # noqa: BLE001 - litellm raises its own BadRequestError, said at the call
        return None
    _placed[(model, api_base)] = (name, provider)
    return name, provider


@functools.lru_cache(maxsize=512)
def _rules(model: str, name: str, provider: str, options_text: str) -> Rules:
    import litellm

    options = json.loads(options_text)
    try:  # litellm's own fallback for a provider with no list of its own: OpenAI's
        supported = litellm.get_supported_openai_params(model=name, custom_llm_provider=provider) or litellm.get_supported_openai_params(
            model=name, custom_llm_provider="openai"
        )
    except Exception:  # noqa: BLE001 - a provider litellm knows no parameters of
        supported = None
    if not supported:
        return Rules()
    left_out = {k: f"{provider}'s {name} does not take it" for k in options if k not in supported}
    context = {k: options[k] for k in CONTEXT if k in options and k not in left_out}

    def mapped(extra: dict) -> Optional[dict]:
        return _mapped(name, provider, {**context, **extra})

    for key, value in options.items():
        if key not in left_out and key not in context and mapped({key: value}) is None:
            left_out[key] = (
                f"{name} takes {'only 1' if key == 'temperature' else 'none'} while it reasons"
                if context or litellm.supports_reasoning(model=model)
                else f"{name} does not take {json.dumps(value)}"
            )
    kept = {k: v for k, v in options.items() if k not in left_out and k not in context}
    sent = mapped(kept) or {}
    thinking = sent.get("thinking") if isinstance(sent.get("thinking"), dict) else None
    if thinking and thinking.get("type") in THINKING_ON:
        return _thinking_rules(options, left_out, thinking)
    # A model whose token limit litellm sends as max_completion_tokens (OpenAI's reasoning models) gets it under that
    # name. A model that thinks unless told not to (those, Gemini 2.5) spends part of its limit thinking: it needs room
    # there. Anthropic's think only when asked to (a thinking table: above).
    renamed = "max_completion_tokens" in (mapped({"max_tokens": 1}) or {})
    moved = renamed and "max_tokens" in kept and "max_completion_tokens" not in kept
    asked_only = "thinking" in (_mapped(name, provider, {"reasoning_effort": "low"}) or {})
    reasons = not asked_only and litellm.supports_reasoning(model=model) and options.get("reasoning_effort") != "none"
    return Rules(
        left_out=left_out,
        replaced={"max_completion_tokens": kept["max_tokens"]} if moved else {},
        removed=("max_tokens",) if moved else (),
        reasoning_budget=thinking_budget(options.get("reasoning_effort") or DEFAULT_EFFORT) if reasons else None,
    )


_STRICT = threading.Lock()


def _mapped(name: str, provider: str, options: dict) -> Optional[dict]:
    """What litellm would send a model for these options (its own mapping); None when it refuses them."""
    import litellm
    from litellm.utils import get_optional_params

    # litellm's global drop_params wins over the argument, and tau2 turns it on when it is imported: off for the
    # question, so that the answer does not depend on what else this process imported (the rules are cached)
    with _STRICT:
        dropped, litellm.drop_params = litellm.drop_params, False
        try:
            return get_optional_params(model=name, custom_llm_provider=provider, **options)
        except litellm.UnsupportedParamsError:
            return None
        except Exception:  # noqa: BLE001 - any other fault of litellm's mapping is said at the call itself
            return {}
        finally:
            litellm.drop_params = dropped


def _thinking_rules(options: dict, left_out: dict, thinking: dict) -> Rules:
    """Anthropic's extended thinking: temperature 1, top_p from 0.95, no forced tool choice, max_tokens above the budget."""
    left_out = dict(left_out)
    replaced: dict[str, Any] = {}
    changed: list[str] = []
    if "temperature" in options and "temperature" not in left_out and options["temperature"] != 1:
        left_out["temperature"] = "thinking takes only 1"
    if "top_p" in options and "top_p" not in left_out and options["top_p"] < MIN_TOP_P_THINKING:
        left_out["top_p"] = f"thinking takes {MIN_TOP_P_THINKING} to 1"
    choice = options.get("tool_choice")
    if choice is not None and "tool_choice" not in left_out and (choice == "required" or isinstance(choice, dict)):
        replaced["tool_choice"] = "auto"
        changed.append(f"tool_choice {json.dumps(choice)} -> auto (thinking forces no tool)")
    budget = thinking.get("budget_tokens") if isinstance(thinking.get("budget_tokens"), int) else None
    for key in ("max_tokens", "max_completion_tokens"):
        limit = options.get(key)
        if budget and isinstance(limit, int) and key not in left_out and limit <= budget:
            replaced[key] = budget + limit
            changed.append(f"{key} {limit} -> {budget + limit} (above the thinking budget of {budget})")
    return Rules(left_out=left_out, replaced=replaced, changed=tuple(changed), reasoning_budget=budget)


def thinking_budget(effort: str) -> Optional[int]:
    """The thinking budget litellm sends Anthropic for a reasoning effort (litellm.constants), None for none."""
    from litellm import constants

    return getattr(constants, f"DEFAULT_REASONING_EFFORT_{str(effort).upper()}_THINKING_BUDGET", None) if effort != "none" else None


def answer_limit(model: str, api_base: Optional[str], args: dict, tokens: int) -> int:
    """A caller's room for the answer as a token limit: a model that reasons on this request spends part of
    its limit thinking, so its thinking budget comes on top."""
    return tokens + (rules_for(model, api_base, {**args, "max_tokens": tokens}).reasoning_budget or 0)


# ---- what goes back with a conversation ----------------------------------------------------------------

CACHE_MARK = {"type": "ephemeral"}
MAX_CACHE_MARKS = 4  # Anthropic refuses a fifth


@functools.lru_cache(maxsize=64)
def needs_cache_marks(model: str, api_base: Optional[str]) -> bool:
    """Whether the model's provider caches only up to marked blocks (Anthropic's cache_control, through
    litellm) and the model caches at all; OpenAI and Gemini cache a long prefix by themselves."""
    import litellm
    from litellm.utils import ProviderConfigManager, supports_prompt_caching

    placed = _provider(model, api_base)
    if placed is None:
        return False
    name, provider = placed
    try:
        config = ProviderConfigManager.get_provider_chat_config(model=name, provider=litellm.LlmProviders(provider))
        caches = supports_prompt_caching(model=model)
    except Exception:  # noqa: BLE001 - a provider litellm has no configuration for
        return False
    return isinstance(config, litellm.AnthropicConfig) and bool(caches)


def cache_marked(messages: list, model: str, api_base: Optional[str]) -> list:
    """A conversation that only grows, marked for the provider's prompt cache: the system prompt (with the
    tools before it) and the two latest turns, so that each request reads what the one before wrote.
    Unmarked where the provider needs no marks; the caller's list is not changed."""
    if not needs_cache_marks(model, api_base):
        return messages
    out = list(messages)
    marks = 0
    latest = [i for i, m in enumerate(out) if isinstance(m, dict) and m.get("role") in ("user", "tool")][-2:]
    for i in ([0] if out and isinstance(out[0], dict) and out[0].get("role") == "system" else []) + latest:
        if marks < MAX_CACHE_MARKS:
            out[i] = _marked(out[i])
            marks += 1
    return out


def _marked(message: dict) -> dict:
    content = message.get("content")
    if message.get("role") == "tool" or not isinstance(content, (str, list)):
        return {**message, "cache_control": CACHE_MARK}
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else [dict(b) for b in content]
    if blocks:
        blocks[-1] = {**blocks[-1], "cache_control": CACHE_MARK}
    return {**message, "content": blocks}


class ThinkingMemory:
    """The thinking blocks of the turns that called tools, by tool call id, for one side's conversations.

    Anthropic refuses a tool-using turn handed back without the thinking blocks it came with, signed. A
    conversation rebuilt from plain data (tau2's messages, a candidate's) has lost them: they are put back
    on the assistant message that carries those calls, unchanged. The candidate never sees them (the proxy
    hands it content and calls only), so it cannot forge one; it can only name its own calls' ids."""

    def __init__(self, size: int = 4096):
        self.size, self.blocks, self.lock = size, OrderedDict(), threading.Lock()

    def remember(self, response) -> None:
        try:
            message = response.choices[0].message
        except (AttributeError, IndexError):
            return
        blocks = getattr(message, "thinking_blocks", None)
        if not blocks:
            return
        with self.lock:
            for call in getattr(message, "tool_calls", None) or []:
                self.blocks[call.id] = [dict(b) for b in blocks]
                self.blocks.move_to_end(call.id)
            while len(self.blocks) > self.size:
                self.blocks.popitem(last=False)

    def restore(self, messages: list) -> list:
        """``messages`` with each remembered turn's thinking blocks put back (a new list where one changed)."""
        if not self.blocks:
            return messages
        out = None
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls") and not m.get("thinking_blocks")):
                continue
            first = m["tool_calls"][0]
            call_id = first.get("id") if isinstance(first, dict) else getattr(first, "id", None)
            with self.lock:
                blocks = self.blocks.get(call_id)
            if blocks:
                out = out or list(messages)
                out[i] = {**m, "thinking_blocks": blocks}
        return out or messages
