"""Recording the model's view of every agent turn, on the trusted side (evolver.store.turnview).

The trusted worker already sits on both sides of the candidate's harness: tau2 hands it each
turn's message and takes back the reply (proxy_agent.ProxyAgent), and it answers every LLM
request the harness makes (proxy_agent.AgentProcess, through Settings.completion). Recording
wraps those two places, so what is written is what the trusted side itself sent, checked and
received: the candidate can shape the content of its requests, never the record of them, and
the record is never read as a result.

One TurnLog per simulation, in the thread that runs it (tau2 runs a simulation in one thread):
the worker's recorder starts it (begin) and writes it with the trajectory (current).
"""

from __future__ import annotations

import json
import threading
from typing import Optional

from evolver.evaluation.proxy_agent import ProxyAgent
from evolver.llm import ProviderError
from evolver.store.turnview import Call, Given, Reply, Turn, TurnView

MAX_CHARS = 2_000_000  # message text one simulation's view may hold: a candidate's flood of requests is not stored whole

_local = threading.local()


class TurnLog:
    """What one simulation's harness was given, asked the model, heard back and handed to tau2."""

    def __init__(self):
        self.view = TurnView()
        self.previous: list[dict] = []  # the last request's messages, which the next one usually extends
        self.chars = 0

    def start(self, policy: str, tools: list[dict], history) -> None:
        self.view.policy, self.view.tool_sets = policy or "", [tools]
        self.view.history = [g for m in history or [] for g in given(m)]

    def begin(self, message) -> None:
        self.view.turns.append(Turn(given=given(message)))

    def call(self, request: dict, response=None, error: Optional[str] = None) -> None:
        if self.view.cut:
            return
        messages, tools = request.get("messages") or [], request.get("tools")
        keep = 0
        while keep < min(len(messages), len(self.previous)) and messages[keep] == self.previous[keep]:
            keep += 1
        add = messages[keep:]
        self.chars += sum(_size(m) for m in add) + (_size(tools) if tools and tools not in self.view.tool_sets else 0)
        if self.chars > MAX_CHARS:
            self.view.cut = f"the harness's requests passed {MAX_CHARS:,} characters: later calls are not recorded"
            return
        if tools and tools not in self.view.tool_sets:
            self.view.tool_sets.append(tools)
        if not self.view.turns:  # a request before the first turn: the harness called the model while starting
            self.view.turns.append(Turn())
        self.view.turns[-1].calls.append(
            Call(
                keep=keep,
                add=[self._compact(m) for m in add],
                tools=self.view.tool_sets.index(tools) if tools else None,
                tool_choice=request.get("tool_choice"),
                reply=_reply(response),
                error=error,
            )
        )
        self.previous = messages

    def _compact(self, message: dict) -> dict:
        """The message, its copy of the policy (the system prompt's bulk) named by where it stands."""
        content, policy = message.get("content"), self.view.policy
        if not (policy and isinstance(content, str) and policy in content):
            return message
        at = content.index(policy)
        return {**message, "content": content[:at] + content[at + len(policy) :], "policy_at": at}

    def end(self, reply, stop: bool) -> None:
        [self.view.turns[-1].returned] = given(reply)
        self.view.turns[-1].stop = stop

    def text(self) -> Optional[str]:
        """The view as it goes to disk; None when nothing was recorded (the simulation never started its agent)."""
        if not (self.view.turns or self.view.tool_sets):
            return None
        return json.dumps({"schema": TurnView.SCHEMA, **self.view.model_dump(mode="json", exclude_defaults=True)}, separators=(",", ":"))


def begin(on: bool) -> None:
    """A new simulation starts in this thread: record it, or not."""
    _local.log = TurnLog() if on else None


def current() -> Optional[TurnLog]:
    return getattr(_local, "log", None)


def recorded() -> Optional[str]:
    """This thread's simulation's view, as it goes to disk; None when it was not recorded."""
    log = current()
    return None if log is None else log.text()


def recording(completion):
    """Settings.completion, recording each request (as the proxy checked it) and its answer in the simulation's log."""

    def complete(**kwargs):
        log = current()
        try:
            response = completion(**kwargs)
        except ProviderError:
            raise  # an infrastructure error: the simulation is not scored, nothing to show of it
        except Exception as exc:
            if log is not None:
                log.call(kwargs, error=f"{type(exc).__name__}: {exc}"[:500])
            raise
        if log is not None:
            log.call(kwargs, response)
        return response

    return complete


class RecordingProxyAgent(ProxyAgent):
    """tau2's agent on the trusted side, recording what each turn gave the harness and what it handed back."""

    def get_init_state(self, message_history=None):
        if (log := current()) is not None:
            log.start(self.domain_policy, [t.openai_schema for t in self.tools], message_history)
        return super().get_init_state(message_history)

    def generate_next_message(self, message, state):
        log = current()
        if log is not None:
            log.begin(message)
        reply, state = super().generate_next_message(message, state)
        if log is not None:
            log.end(reply, self.last[1])
        return reply, state


def given(message) -> list[Given]:
    """A tau2 message as the view keeps it; a turn of several tool results is each of them."""
    from tau2.data_model.message import AssistantMessage, MultiToolMessage, ToolMessage

    if message is None:
        return []
    if isinstance(message, MultiToolMessage):
        return [g for m in message.tool_messages for g in given(m)]
    if isinstance(message, ToolMessage):
        return [Given(role="tool", content=message.content, id=message.id, error=bool(message.error))]
    if isinstance(message, AssistantMessage):
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls or []]
        return [Given(role="assistant", content=message.content, tool_calls=calls)]
    return [Given(role=str(getattr(message, "role", "user")), content=getattr(message, "content", None))]


def _reply(response) -> Optional[Reply]:
    if response is None:
        return None
    message = response.choices[0].message
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]
    return Reply(content=message.content, tool_calls=calls)


def _size(value) -> int:
    """Characters of text in a message or a list of tools, roughly: what a flood would fill the disk with."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_size(v) for v in value.values())
    if isinstance(value, list):
        return sum(_size(v) for v in value)
    return 8
