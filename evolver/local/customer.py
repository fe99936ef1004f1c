"""The user-role adapter: tau2's user simulator played by a small local model.

tau2 asks its user model for the customer's next message with its own system
prompt (the simulation guidelines and the task's scenario) followed by the
conversation with the roles flipped: the agent's messages as "user", the
customer's own as "assistant". A small instruction-tuned model in the
assistant's seat, handed "Hi! How can I help you today?", answers like an
assistant ("Hello! How can I assist you today?") and never states its task, so
no agent can solve one (measured: docs/local_model.md).

For the `local/` provider's user role (evolver.local.serving) the request is
presented so that the model writes the customer's message instead; each step
can be chosen on its own, so benchmarks/local_model.py can measure which help:

- transcript: tau2's system prompt stays as it is; the conversation becomes one
  message, a transcript with "Agent:" and "Customer:" lines, ending with the
  request to write the customer's next message. The model writes about the
  customer instead of being addressed as the helper;
- reminder: a short note that the model is the customer, not the agent, and, when
  the customer has not spoken yet, that its first message says what it needs;
- prefill: the customer's first message is begun for the model (OPENING), so it
  starts as someone asking, not offering;
- recheck: a reply that reads like an assistant's (ASSISTANT_LIKE) or says again
  word for word what the customer already said (a small model's loop) is asked
  again once, with every other step on and a note against both.

Only what tau2 gives the user model is used: its system prompt and the
conversation. No task answers, no evaluation criteria; tau2's evaluation
sees the customer's messages as tau2 would have recorded them.

Requests that carry user tools (tau2's telecom domain) keep tau2's chat form,
whose tool calls and results have no transcript form here: they get the
reminder and the recheck only.
"""

from __future__ import annotations

import re

# The request option of the `local/` provider that chooses the steps (evolver.config sets it for a local user).
OPTION = "user_adapter"
STEPS = ("transcript", "reminder", "prefill", "recheck")
# The steps `user_adapter = true` turns on (the measured choice: docs/local_model.md).
DEFAULT_STEPS = frozenset(STEPS)

AGENT, CUSTOMER = "Agent", "Customer"
OPENING = "Hi, I need"
REMINDER = "You are the customer, not the agent: write only the customer's next message, in the customer's own words."
FIRST_MESSAGE = " The customer has not spoken yet: their first message says what they need, as the scenario describes."
ASK = "Write the customer's next message."
RECHECK_NOTE = " Do not offer help and do not repeat an earlier message: the customer asks for what they need, or answers the agent's last message."

# Phrases with which an assistant offers help; a customer asking for it does not use them.
ASSISTANT_LIKE = re.compile(
    r"\bhow (?:can|may|could|might) i (?:help|assist)"
    r"|\bwhat can i (?:do|help)"
    r"|\b(?:i'm|i am) (?:here|happy|glad) to (?:help|assist)"
    r"|\banything else i can\b"
    r"|\bcan(?:'t|not) (?:help|assist) (?:you|with)"
    r"|\bassist you\b"
    r"|\bhelp you (?:with|today)\b"
    r"|\bas an ai\b"
    r"|^\s*agent\s*:",
    re.IGNORECASE,
)
# A label the model may put before the customer's line, or the agent's next line it may go on to write.
LEADING_LABEL = re.compile(r"^\s*\**customer\**\s*:\s*", re.IGNORECASE)
AGENT_LINE = re.compile(r"\n\s*\**agent\**\s*:", re.IGNORECASE)


def parse_steps(value) -> frozenset[str]:
    """The steps a request's `user_adapter` option turns on: true (the default steps), false, or a list of names."""
    if value is True:
        return DEFAULT_STEPS
    if not value:
        return frozenset()
    unknown = set(value) - set(STEPS)
    if unknown:
        raise ValueError(f"unknown user_adapter steps {sorted(unknown)}; known: {', '.join(STEPS)}")
    return frozenset(value)


def present(messages: list[dict], steps: frozenset[str], has_tools: bool, recheck: bool = False) -> tuple[list[dict], str]:
    """The request as the model sees it, and the text its reply is begun with ("" for none);
    ``recheck``: the re-ask of a reply that went out of the customer's role."""
    system = [m for m in messages[:1] if m.get("role") == "system"]
    conversation = messages[len(system):]
    first = not any(m.get("role") == "assistant" for m in conversation)  # flipped: "assistant" is the customer
    note = REMINDER + (FIRST_MESSAGE if first else "") + (RECHECK_NOTE if recheck else "")
    if has_tools or "transcript" not in steps:
        presented = list(messages)
        if "reminder" in steps:
            presented.append({"role": "system", "content": note})
    else:
        ask = (note + " " if "reminder" in steps else "") + ASK
        presented = system + [{"role": "user", "content": transcript(conversation) + "\n\n" + ask}]
    opening = OPENING if "prefill" in steps and first and not has_tools else ""
    if opening:
        presented.append({"role": "assistant", "content": opening})
    return presented, opening


def transcript(conversation: list[dict]) -> str:
    """tau2's flipped conversation as labelled lines (the agent spoke as "user", the customer as "assistant")."""
    speaker = {"user": AGENT, "assistant": CUSTOMER}
    lines = [f"{speaker[m['role']]}: {m.get('content') or ''}".rstrip() for m in conversation if m.get("role") in speaker]
    return "\n".join(["The conversation so far:"] + lines)


def customer_text(content: str | None, opening: str) -> str:
    """The customer's message from a reply: no leading "Customer:" label, nothing of an agent's line the
    model went on to write, and begun with the prefilled opening (llama.cpp returns it; other servers may not)."""
    text = LEADING_LABEL.sub("", content or "", count=1)
    text = AGENT_LINE.split(text, maxsplit=1)[0].strip()
    if opening and not text.startswith(opening):
        text = f"{opening} {text}".strip()
    return text


def reads_like_assistant(text: str | None) -> bool:
    """The reply offers help instead of asking for it."""
    return bool(text) and bool(ASSISTANT_LIKE.search(text))


def repeats_customer(text: str | None, messages: list[dict]) -> bool:
    """The reply begins with, word for word, a message the customer already sent (tau2's flipped
    "assistant" messages): a small model looping on its own line instead of answering the agent."""
    said = [_words(m.get("content")) for m in messages if m.get("role") == "assistant"]
    reply = _words(text)
    return bool(reply) and any(earlier and reply[:len(earlier)] == earlier for earlier in said)


def off_role(text: str | None, messages: list[dict]) -> str | None:
    """Why a reply is not the customer's next message ("assistant_like", "repeats_customer"), or None."""
    if reads_like_assistant(text):
        return "assistant_like"
    if repeats_customer(text, messages):
        return "repeats_customer"
    return None


def _words(text: str | None) -> list[str]:
    return re.findall(r"[a-z0-9_#]+", (text or "").lower())
