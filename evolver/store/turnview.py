"""The model's view of one simulation, as the trusted side recorded it: `turns/<task>__trial<N>.json.gz` (gzip).

For every agent turn: the message tau2 gave the harness, each LLM request the harness made (its
messages and tools) with the model's reply, and the message the harness handed back to tau2. The
harness is the code in between; comparing the two sides (evolver.evolution.harness_changes) names
what it changed.

Compact: a request shares its history with the one before it, so a call stores only how many of
the previous request's messages it keeps (`keep`) and the messages after them (`add`); a list of
tools is stored once and named by its index (0: the tools tau2 gave); the domain policy is stored
once, and a message that holds it says where (`policy_at`) instead of holding a copy. The writer is the trusted worker
(evolver.evaluation.turnlog); nothing of the candidate's writes this file, and nothing reads it
as a result: it is evidence, as hostile in its content as the trajectory beside it.
"""

from __future__ import annotations

import json
from typing import ClassVar, Iterator, Optional

from pydantic import BaseModel, Field

from evolver.store.records import Versioned


class Given(BaseModel):
    """A message of tau2's side, reduced to what the model could be shown: the customer's text
    (role user), a tool's result (role tool, with the id of the call it answers), or the agent's
    own earlier message in a task's starting history (role assistant)."""

    role: str
    content: Optional[str] = None
    id: Optional[str] = None  # a tool result: the call it answers
    error: bool = False
    tool_calls: list[dict] = Field(default_factory=list)  # role assistant: {"id", "name", "arguments": dict}


class Reply(BaseModel):
    """What the model answered one request; tool calls as the provider gave them (arguments: JSON text)."""

    content: Optional[str] = None
    tool_calls: list[dict] = Field(default_factory=list)  # {"id", "name", "arguments": str}


class Call(BaseModel):
    """One LLM request of the harness and the model's answer."""

    keep: int = 0  # the first `keep` messages of the previous request, unchanged
    add: list[dict] = Field(default_factory=list)  # then these (OpenAI-style messages, as the proxy checked them)
    tools: Optional[int] = None  # index into TurnView.tool_sets (0: tau2's own); None: no tools sent
    tool_choice: Optional[str | dict] = None
    reply: Optional[Reply] = None
    error: Optional[str] = None  # the provider refused the request


class Turn(BaseModel):
    given: list[Given] = Field(default_factory=list)  # a turn of several tool results gives them all
    calls: list[Call] = Field(default_factory=list)
    returned: Optional[Given] = None  # role assistant; None when the turn did not finish (the agent failed)
    stop: bool = False  # the harness ended the conversation with this message


class TurnView(Versioned):
    SCHEMA: ClassVar[int] = 1
    MIGRATIONS: ClassVar[dict] = {}
    WHAT: ClassVar[str] = "a turn view"

    schema_version: int = Field(default=SCHEMA, alias="schema")
    policy: str = ""  # the domain policy tau2 gave the agent
    history: list[Given] = Field(default_factory=list)  # the task's starting conversation, given before the first turn
    tool_sets: list[list[dict]] = Field(default_factory=list)  # the first: the tools tau2 gave (OpenAI schemas); then the harness's own
    turns: list[Turn] = Field(default_factory=list)
    cut: Optional[str] = None  # why recording stopped early (the size limit), if it did

    def requests(self) -> Iterator[tuple[int, Call, list[dict]]]:
        """(turn index, call, the request's whole message list), in order: the deltas undone."""
        previous: list[dict] = []
        for n, turn in enumerate(self.turns):
            for call in turn.calls:
                previous = previous[: call.keep] + [self._whole(m) for m in call.add]
                yield n, call, previous

    def _whole(self, message: dict) -> dict:
        if "policy_at" not in message:
            return message
        at, content = message["policy_at"], message.get("content") or ""
        return {**{k: v for k, v in message.items() if k != "policy_at"}, "content": content[:at] + self.policy + content[at:]}

    @property
    def tools(self) -> list[dict]:
        return self.tool_sets[0] if self.tool_sets else []

    def arguments(self) -> Iterator[dict]:
        """The arguments of every tool call on record, the model's and the harness's, as data."""
        for turn in self.turns:
            replies = [call.reply.tool_calls for call in turn.calls if call.reply] + [turn.returned.tool_calls if turn.returned else []]
            for calls in replies:
                for c in calls:
                    args = call_arguments(c.get("arguments"))
                    if isinstance(args, dict):
                        yield args

    def tools_of(self, call: Call) -> Optional[list[dict]]:
        return None if call.tools is None or not 0 <= call.tools < len(self.tool_sets) else self.tool_sets[call.tools]


def call_arguments(value):
    """A call's arguments as data: the model's JSON text parsed when it is an object, else as it came (text that is not JSON)."""
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if isinstance(parsed, dict) else value
