"""The user-role adapter: tau2's user simulator played by a small local model.

tau2 asks its user model for the customer's next message with its own system
prompt (the simulation guidelines and the task's scenario) followed by the
conversation with the roles flipped: the agent's messages as "user", the
customer's own as "assistant". A small instruction-tuned model in the
assistant's seat, handed "Hi! How can I help you today?", answers like an
assistant ("Hello! How can I assist you today?") and never states its task, so
no agent can solve one (measured: docs/local_model.md).

For the `local/` provider's user role (evolver.local.serving) tau2's request is
kept as it is and three steps are added; each can be chosen on its own, so
benchmarks/local_model.py can measure which help:

- reminder: a short system note after the conversation: the model is the
  customer, not the agent; when the customer has not spoken yet, its first
  message says what it needs; once it has, tau2's own rule is said again: when
  the request is done, the reply is tau2's stop token (a small model otherwise
  thanks the agent to the step limit, and tau2 scores a simulation that hits it 0);
- prefill: the customer's first message is begun for the model (OPENING), so it
  starts as someone asking, not offering;
- recheck: a reply that reads like an assistant's (ASSISTANT_LIKE), says again
  word for word what the customer already said (a small model's loop), or
  begins with the agent's last message word for word (a small model echoing
  its prompt, seen as "I've created a task ... ###STOP###") is asked again once,
  with every step on and a note against all three.

Steps tried and dropped (a stop reminder that also asks for what the scenario
still wants, a check before a bare stop, the conversation recast as one
transcript) and why are in docs/local_model.md.

Only what tau2 gives the user model is used: its system prompt and the
conversation. No task answers, no evaluation criteria; tau2's evaluation sees
the customer's messages as tau2 records them.
"""

from __future__ import annotations

import re

from tau2.user.base import STOP

# The steps, chosen per request by the `local/` provider's option evolver.data.USER_ADAPTER.
STEPS = ("reminder", "prefill", "recheck")

OPENING = "Hi, I need"
REMINDER = "You are the customer, not the agent: write only the customer's next message, in the customer's own words."
FIRST_MESSAGE = " The customer has not spoken yet: their first message says what they need, as the scenario describes."
# A task that begins with a message history: the earlier request there is already met, and the
# small model, told the stop rule, ended at once (a bare stop) or answered as the agent.
CONTINUATION = (
    " The conversation so far happened earlier. The customer now writes again: their message says what they"
    " need now, as the scenario describes."
)
CONTINUATION_OPENING = "Thanks. Now I need"
# tau2's simulation guidelines already ask for it; said again where a small model reads last. It
# names the scenario, not what the customer asked: a task may begin with a message history in which
# an earlier request was already met, and the small model, told "what the customer asked", stopped there.
DONE = f" If the agent has done what the scenario asks for, reply with only {STOP} and nothing else."
RECHECK_NOTE = " Do not offer help and do not repeat an earlier message, the agent's included: the customer asks for what they need, or answers the agent's last message."

ECHO_WORDS = 4  # a shorter agent message ("Done.", "Anything else?") may well be said back by a real customer

# Phrases with which an assistant offers (or refuses) help; a customer asking for it does not use them.
ASSISTANT_LIKE = re.compile(
    r"\bhow (?:can|may|could|might) i (?:help|assist)"
    r"|\bwhat can i (?:do|help)"
    r"|\b(?:i'm|i am) (?:here|happy|glad) to (?:help|assist)"
    r"|\banything else i can\b"
    r"|\bcan(?:'t|not) (?:help|assist) (?:you|with)"
    r"|\bassist you\b"
    r"|\bhelp you (?:with|today)\b"
    r"|\bas an ai\b"
    r"|^\s*(?:sure|certainly|of course|absolutely)\b[\s,.!]*(?:i'll|i will|let me)\b"  # agreeing to do the work
    r"|^\s*agent\s*:",
    re.IGNORECASE,
)


def parse_steps(value) -> frozenset[str]:
    """The steps a request's `user_adapter` option turns on: true (all), false, or a list of names."""
    if value is True:
        return frozenset(STEPS)
    if not value:
        return frozenset()
    unknown = set(value) - set(STEPS)
    if unknown:
        raise ValueError(f"unknown user_adapter steps {sorted(unknown)}; known: {', '.join(STEPS)}")
    return frozenset(value)


def present(
    messages: list[dict], steps: frozenset[str], has_tools: bool, recheck: bool = False, history: int = 0
) -> tuple[list[dict], str]:
    """The request as the model sees it, and the text its reply is begun with ("" for none);
    ``recheck``: the re-ask of a reply that went out of the customer's role; ``history``: how many
    of the customer's messages came with the task's own message history (tau2 gives them to the
    user model as the conversation so far)."""
    spoken = sum(m.get("role") == "assistant" for m in messages)  # flipped: "assistant" is the customer
    first = spoken <= history  # the customer has not spoken live yet
    presented = list(messages)
    if "reminder" in steps or recheck:
        opening_note = (CONTINUATION if spoken else FIRST_MESSAGE) if first else DONE
        presented.append({"role": "system", "content": REMINDER + opening_note + (RECHECK_NOTE if recheck else "")})
    # A begun message leaves no room for a call to one of the customer's own tools (tau2's telecom user has some).
    opening = (CONTINUATION_OPENING if spoken else OPENING) if ("prefill" in steps or recheck) and first and not has_tools else ""
    if opening:
        presented.append({"role": "assistant", "content": opening})
    return presented, opening


def customer_text(content: str | None, opening: str) -> str | None:
    """The customer's message, begun with the prefilled opening (llama.cpp returns it with the
    reply; a server that returns only the continuation gets it put back)."""
    if not opening or (content or "").startswith(opening):
        return content
    return f"{opening} {(content or '').strip()}".strip()


def reads_like_assistant(text: str | None) -> bool:
    """The reply offers help instead of asking for it."""
    return bool(text) and bool(ASSISTANT_LIKE.search(text))


def repeats_customer(text: str | None, messages: list[dict]) -> bool:
    """The reply begins with, word for word, a message the customer already sent (tau2's flipped
    "assistant" messages): a small model looping on its own line instead of answering the agent."""
    said = [_words(m.get("content")) for m in messages if m.get("role") == "assistant"]
    reply = _words(text)
    return bool(reply) and any(earlier and reply[: len(earlier)] == earlier for earlier in said)


def echoes_agent(text: str | None, messages: list[dict]) -> bool:
    """The reply begins with the agent's last message (tau2's flipped "user" role), word for word."""
    last = next((_words(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), [])
    reply = _words(text)
    return len(last) >= ECHO_WORDS and reply[: len(last)] == last


def off_role(text: str | None, messages: list[dict]) -> str | None:
    """Why a reply is not the customer's next message ("assistant_like", "repeats_customer",
    "echoes_agent"), or None."""
    if reads_like_assistant(text):
        return "assistant_like"
    if repeats_customer(text, messages):
        return "repeats_customer"
    if echoes_agent(text, messages):
        return "echoes_agent"
    return None


def _words(text: str | None) -> list[str]:
    return re.findall(r"[a-z0-9_#]+", (text or "").lower())
