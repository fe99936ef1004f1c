"""What api.anthropic.com refuses in a Messages request (POST /v1/messages), in its words.

Emulated: the Claude 4 / 4.5 generation with budgeted extended thinking (the adaptive thinking of 4.6 and later,
which litellm sends with output_config, is refused as not emulated). Every refusal is a 400
invalid_request_error unless said otherwise. The texts, as users quote them from api.anthropic.com:

- unknown top-level keys: "seed: Extra inputs are not permitted" (the pattern of "extra_body: Extra inputs are
  not permitted", Aider-AI/aider#4404, and "response_format: ...", amrit110/oli#7); inside a block the path
  names the block's type: "messages.65.content.1.tool_use.text: Extra inputs are not permitted"
  (anthropics/claude-code#4378).
- thinking with a temperature other than 1: "`temperature` may only be set to 1 when thinking is enabled. Please
  consult our documentation at https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking#important-
  considerations-when-using-extended-thinking" (MartialBE/one-hub#529).
- thinking with `top_p` below 0.95: "`top_p` must be greater than or equal to 0.95 or unset when thinking is
  enabled" (as gateways quote it; Anthropic's extended-thinking guide: top_p from 0.95 to 1); with `top_k` at all:
  "`top_k` must be unset when thinking is enabled. Please consult our documentation at ..."
  (quarkiverse/quarkus-langchain4j#1812, claude-opus-4-1; danny-avila/LibreChat#6023).
- thinking with a forced tool choice: "Thinking may not be enabled when tool_choice forces tool use."
  (mastra-ai/mastra#7507, can1357/oh-my-pi#341).
- the tool-use turn's thinking block missing: "messages.1.content.0.type: Expected `thinking` or
  `redacted_thinking`, but found `tool_use`. When `thinking` is enabled, a final `assistant` message must start
  with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). ..."
  (anthropic's own typo kept; anomalyco/opencode#3077, deepset-ai/haystack-core-integrations#2146).
- a thinking block changed: "messages.1.content.0: Invalid `signature` in `thinking` block" (anthropics/claude-code
  #10627; anthropic-sdk-python#1598: any difference from what was returned is refused).
- thinking blocks ending the conversation with thinking off: "messages.1.content.0: When thinking is disabled, an
  `assistant` message in the final position cannot contain `thinking`. ..." (tailcallhq/forgecode#1853).
- "A maximum of 4 blocks with cache_control may be provided. Found 5." (tghamm/Anthropic.SDK#50).
- tool pairing: "messages.2: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_...
  Each `tool_use` block must have a corresponding `tool_result` block in the next message." and "messages.0.
  content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_... Each `tool_result` block must have a
  corresponding `tool_use` block in the previous message." (anthropics/claude-code#6575, #18947).
- "`temperature` and `top_p` cannot both be specified for this model. Please use only one." (Claude 4.5 and
  later: langfuse/langfuse#9882).
- the budget: thinking.budget_tokens at least 1,024 and below max_tokens ("`max_tokens` must be greater than
  `thinking.budget_tokens`", as Anthropic's extended-thinking guide states it).
Consecutive turns of one role are combined into one turn, as the Messages API does today (its old "roles must
alternate" refusal is gone); a system message inside `messages` is refused (litellm turns one into a user turn
for these models). Less certain texts (field paths of missing fields, an image, a redacted_thinking block that
the fake never issued) follow the same pattern and are marked where they are raised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
VERSIONS = ("2023-06-01", "2023-01-01")
TOP_LEVEL = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_k",
    "top_p",
    "tools",
    "tool_choice",
    "thinking",
    "service_tier",
    "container",
    "mcp_servers",
    "context_management",
    "output_config",
}
BLOCK_FIELDS = {  # the fields of each content block, by role; "cache_control" where it may be set
    "text": {"text", "cache_control", "citations"},
    "tool_use": {"id", "name", "input", "cache_control"},
    "tool_result": {"tool_use_id", "content", "is_error", "cache_control"},
    "thinking": {"thinking", "signature"},
    "redacted_thinking": {"data"},
}
REQUIRED = {
    "text": ("text",),
    "tool_use": ("id", "name", "input"),
    "tool_result": ("tool_use_id",),
    "thinking": ("thinking", "signature"),
    "redacted_thinking": ("data",),
}
ROLE_BLOCKS = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use", "thinking", "redacted_thinking")}
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
MAX_OUTPUT = {
    "claude-sonnet-4-5": 64000,
    "claude-haiku-4-5": 64000,
    "claude-opus-4-5": 64000,
    "claude-sonnet-4": 64000,
    "claude-opus-4-1": 32000,
    "claude-opus-4": 32000,
    "claude-3-7-sonnet": 64000,
    "claude-3-5-haiku": 8192,
}


class Refusal(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


@dataclass
class Turn:
    """Consecutive messages of one role, combined: (message index, block index, block) for each block."""

    role: str
    blocks: list[tuple[int, int, dict]] = field(default_factory=list)

    @property
    def first(self) -> int:
        return self.blocks[0][0]

    def of_type(self, kind: str) -> list[tuple[int, int, dict]]:
        return [b for b in self.blocks if b[2].get("type") == kind]


def family(model: str) -> str:
    """A model's name without its date: claude-sonnet-4-5-20250929 -> claude-sonnet-4-5."""
    return re.sub(r"-\d{8}$", "", model)


def thinking_budget(body: dict) -> Optional[int]:
    thinking = body.get("thinking") or {}
    return thinking.get("budget_tokens") if thinking.get("type") == "enabled" else None


def blocks_of(content) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])


def check(body: dict, signed: Callable[[str, str], bool]) -> list[Turn]:
    """Refuse (raise Refusal) what Anthropic refuses; the conversation as combined turns otherwise.
    ``signed(thinking, signature)`` says whether the server issued that thinking block."""
    for key in body:
        if key not in TOP_LEVEL:
            raise Refusal(f"{key}: Extra inputs are not permitted")
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            raise Refusal(f"{key}: Field required")
    if body.get("stream"):
        raise Refusal("fake provider: streaming is not emulated")
    model, max_tokens = str(body["model"]), body["max_tokens"]
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise Refusal("max_tokens: Input should be greater than or equal to 1")
    if max_tokens > MAX_OUTPUT.get(family(model), max_tokens):
        raise Refusal(
            f"max_tokens: {max_tokens} > {MAX_OUTPUT[family(model)]}, which is the maximum allowed number of output tokens for {model}"
        )
    _sampling(body, model)
    _system(body.get("system"))
    names = _tools(body.get("tools"))
    _tool_choice(body.get("tool_choice"), names)
    turns = _turns(body["messages"])
    _thinking(body, turns, signed)
    marks = _cache_marks(body, turns)
    if marks > 4:
        raise Refusal(f"A maximum of 4 blocks with cache_control may be provided. Found {marks}.")
    _pairs(turns)
    return turns


def _sampling(body: dict, model: str) -> None:
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None and not 0 <= value <= 1:
            raise Refusal(f"{key}: Input should be {'less' if value > 1 else 'greater'} than or equal to {1 if value > 1 else 0}")
    later = re.match(r"claude-(sonnet|haiku|opus)-4-[5-9]", family(model))
    if later and body.get("temperature") is not None and body.get("top_p") is not None:
        raise Refusal("`temperature` and `top_p` cannot both be specified for this model. Please use only one.")


def _cache_control(value, where: str) -> None:
    if not isinstance(value, dict) or value.get("type") != "ephemeral":
        raise Refusal(f"{where}.cache_control.type: Input should be 'ephemeral'")
    if value.get("ttl", "5m") not in ("5m", "1h"):
        raise Refusal(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")


def _system(system) -> None:
    if system is None or isinstance(system, str):
        return
    for i, block in enumerate(system if isinstance(system, list) else [system]):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise Refusal(f"system.{i}.type: Input should be 'text'")
        _fields(block, BLOCK_FIELDS["text"], REQUIRED["text"], f"system.{i}")


def _fields(block: dict, allowed: set, required: tuple, where: str) -> None:
    for key in block:
        if key not in allowed | {"type"}:
            raise Refusal(f"{where}.{key}: Extra inputs are not permitted")
    for key in required:
        if key not in block:
            raise Refusal(f"{where}.{key}: Field required")  # the path's exact form is a guess
    if "cache_control" in block:
        _cache_control(block["cache_control"], where)
    if block.get("type") == "text" and not block.get("text"):
        raise Refusal(f"{where.split('.')[0]}: text content blocks must be non-empty")


def _tools(tools) -> set[str]:
    names: set[str] = set()
    for i, tool in enumerate(tools or []):
        where = f"tools.{i}.custom"
        if tool.get("type", "custom") != "custom":
            raise Refusal(f"fake provider: server tool {tool.get('type')!r} is not emulated")
        _fields(tool, {"name", "description", "input_schema", "cache_control"}, ("name", "input_schema"), where)
        if not TOOL_NAME.match(str(tool["name"])):
            raise Refusal(f"{where}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
        if not isinstance(tool["input_schema"], dict) or tool["input_schema"].get("type") != "object":
            raise Refusal(f"{where}.input_schema.type: Input should be 'object'")
        if tool["name"] in names:
            raise Refusal("tools: Tool names must be unique.")
        names.add(tool["name"])
    return names


def _tool_choice(choice, names: set[str]) -> None:
    if choice is None:
        return
    kinds = ("auto", "any", "tool", "none")
    if not isinstance(choice, dict) or choice.get("type") not in kinds:
        found = choice.get("type") if isinstance(choice, dict) else choice
        raise Refusal(
            f"tool_choice: Input tag '{found}' found using 'type' does not match any of the expected tags: 'auto', 'any', 'tool', 'none'"
        )
    allowed = {"type", "disable_parallel_tool_use"} | ({"name"} if choice["type"] == "tool" else set())
    _fields(choice, allowed, ("name",) if choice["type"] == "tool" else (), f"tool_choice.{choice['type']}")


def _turns(messages) -> list[Turn]:
    if not isinstance(messages, list) or not messages:
        raise Refusal("messages: at least one message is required")
    turns: list[Turn] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise Refusal(f"messages.{i}: Input should be a valid dictionary")
        for key in message:
            if key not in ("role", "content"):
                raise Refusal(f"messages.{i}.{key}: Extra inputs are not permitted")
        role = message.get("role")
        if role not in ROLE_BLOCKS:
            raise Refusal(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        blocks = blocks_of(message.get("content"))
        if not blocks:
            raise Refusal(f"messages.{i}: all messages must have non-empty content except for the optional final assistant message")
        if not turns or turns[-1].role != role:
            turns.append(Turn(role))
        for j, block in enumerate(blocks):
            if not isinstance(block, dict):
                raise Refusal(f"messages.{i}.content.{j}: Input should be a valid dictionary")
            kind = block.get("type")
            if kind == "image":
                raise Refusal("fake provider: images are not emulated")
            if kind not in ROLE_BLOCKS[role]:
                raise Refusal(
                    f"messages.{i}.content.{j}.type: Input should be {' or '.join(repr(k) for k in ROLE_BLOCKS[role])}"
                )  # a guess
            _fields(block, BLOCK_FIELDS[kind], REQUIRED[kind], f"messages.{i}.content.{j}.{kind}")
            turns[-1].blocks.append((i, j, block))
    return turns


def _thinking(body: dict, turns: list[Turn], signed: Callable[[str, str], bool]) -> None:
    thinking = body.get("thinking")
    if (thinking or {}).get("type") == "adaptive" or "output_config" in body:
        raise Refusal("fake provider: adaptive thinking and output_config (Claude 4.6 and later) are not emulated")
    if thinking is not None:
        if thinking.get("type") not in ("enabled", "disabled"):
            raise Refusal(
                f"thinking: Input tag '{thinking.get('type')}' found using 'type' does not match any of the expected tags: 'disabled', 'enabled'"
            )
        if thinking["type"] == "enabled":
            _fields(thinking, {"budget_tokens"}, ("budget_tokens",), "thinking.enabled")
    budget = thinking_budget(body)
    for turn in turns:
        for i, j, block in turn.of_type("thinking"):
            if not signed(block["thinking"], block["signature"]):
                raise Refusal(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")
        for i, j, _ in turn.of_type("redacted_thinking"):
            raise Refusal(f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block")  # the fake issues none: any is forged
    if budget is None:
        final = turns[-1]
        if final.role == "assistant" and final.of_type("thinking"):
            i, j, _ = final.of_type("thinking")[0]
            raise Refusal(
                f"messages.{i}.content.{j}: When thinking is disabled, an `assistant` message in the final position cannot "
                "contain `thinking`. To use thinking blocks, enable `thinking` in your request."
            )
        return
    if not isinstance(budget, int) or budget < 1024:
        raise Refusal("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
    if body["max_tokens"] <= budget:
        raise Refusal(
            f"`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at {DOCS}#max-tokens-and-context-window-size"
        )
    if body.get("temperature") not in (None, 1):
        raise Refusal(
            f"`temperature` may only be set to 1 when thinking is enabled. Please consult our documentation at {DOCS}"
            "#important-considerations-when-using-extended-thinking"
        )
    if body.get("top_p") is not None and body["top_p"] < 0.95:
        raise Refusal("`top_p` must be greater than or equal to 0.95 or unset when thinking is enabled")
    if body.get("top_k") is not None:
        raise Refusal(
            f"`top_k` must be unset when thinking is enabled. Please consult our documentation at {DOCS}"
            "#important-considerations-when-using-extended-thinking"
        )
    if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
        raise Refusal("Thinking may not be enabled when tool_choice forces tool use.")
    if len(turns) >= 2 and turns[-1].role == "user" and turns[-1].of_type("tool_result") and turns[-2].role == "assistant":
        i, j, first = turns[-2].blocks[0]
        if first.get("type") not in ("thinking", "redacted_thinking"):
            raise Refusal(
                f"messages.{i}.content.{j}.type: Expected `thinking` or `redacted_thinking`, but found `{first.get('type')}`. When "
                "`thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of "
                "`tool_use` and `tool_result` blocks). We recommend you include thinking blocks from previous turns. To avoid this "
                f"requirement, disable `thinking`. Please consult our documentation at {DOCS}"
            )


def _cache_marks(body: dict, turns: list[Turn]) -> int:
    system = body.get("system")
    blocks = [*(body.get("tools") or []), *(system if isinstance(system, list) else []), *(b for t in turns for _, _, b in t.blocks)]
    return sum("cache_control" in b for b in blocks)


def _pairs(turns: list[Turn]) -> None:
    for n, turn in enumerate(turns):
        if turn.role == "assistant":
            asked = [b["id"] for _, _, b in turn.of_type("tool_use")]
            answered = {b["tool_use_id"] for _, _, b in turns[n + 1].of_type("tool_result")} if n + 1 < len(turns) else set()
            missing = [i for i in asked if i not in answered]
            if missing:
                raise Refusal(
                    f"messages.{turn.blocks[-1][0]}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in the next message."
                )
        else:
            asked = {b["id"] for _, _, b in turns[n - 1].of_type("tool_use")} if n and turns[n - 1].role == "assistant" else set()
            for i, j, block in turn.of_type("tool_result"):
                if block["tool_use_id"] not in asked:
                    raise Refusal(
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {block['tool_use_id']}. "
                        "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                    )
