"""What api.openai.com refuses in a chat completion, decided as its server decides: by the model's name.

Only OpenAI's own model names (gpt-*, chatgpt-*, o1, o3, ...) follow these rules; any other name (the tests'
"agent", "user", a vLLM or llama.cpp model) is an OpenAI-compatible server's, which takes what it is sent.

Reasoning models are the o-series (o1, o3, o3-mini, o4-mini, ...) and the GPT-5 family (gpt-5, gpt-5-mini,
gpt-5-nano, gpt-5.1, ...) except its chat models (gpt-5-chat-latest). They take temperature 1 only, refuse
`max_tokens` for `max_completion_tokens` and `top_p` outright, and take `reasoning_effort` with the values of
their generation; any other model refuses `reasoning_effort` as an unknown argument. Every refusal is a 400
with type invalid_request_error, in OpenAI's words, as users quote them (all seen on api.openai.com):

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

_OPENAI = re.compile(r"^(gpt-|chatgpt-|o\d+(-|$))")
_REASONING = re.compile(r"^(o\d+|gpt-5)(?![\w.-]*-chat)")
_EFFORTS = {"o": ("low", "medium", "high"), "gpt-5": ("minimal", "low", "medium", "high"), "gpt-5.": ("none", "low", "medium", "high")}
# Reasoning tokens a reply spends per effort: deterministic stand-ins, large enough that a small
# max_completion_tokens runs out before the visible answer, as it does on the real models.
REASONING_TOKENS = {"none": 0, "minimal": 16, "low": 128, "medium": 512, "high": 2048}


@dataclass(frozen=True)
class Refusal:
    message: str
    param: Optional[str]
    code: Optional[str]


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
    """OpenAI's refusal of a chat completion request for ``model``, or None when it takes it."""
    if not _OPENAI.match(model):
        return None
    if not is_reasoning(model):
        if "reasoning_effort" in body:
            return Refusal("Unrecognized request argument supplied: reasoning_effort", None, None)
        return None
    if "max_tokens" in body:
        return Refusal("Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                       "max_tokens", "unsupported_parameter")
    effort = body.get("reasoning_effort")
    sampling = (effort or default_effort(model)) == "none"  # reasoning off: sampling as a chat model samples
    temperature = body.get("temperature")
    if temperature is not None and temperature != 1 and not sampling:
        return Refusal(f"Unsupported value: 'temperature' does not support {json.dumps(temperature)} with this model. "
                       "Only the default (1) value is supported.", "temperature", "unsupported_value")
    if "top_p" in body and not sampling:
        return Refusal("Unsupported parameter: 'top_p' is not supported with this model.", "top_p", "unsupported_parameter")
    if effort is not None and effort not in efforts(model):
        allowed = [f"'{e}'" for e in efforts(model)]
        return Refusal(f"Unsupported value: 'reasoning_effort' does not support '{effort}' with this model. "
                       f"Supported values are: {', '.join(allowed[:-1])}, and {allowed[-1]}.", "reasoning_effort", "unsupported_value")
    return None
