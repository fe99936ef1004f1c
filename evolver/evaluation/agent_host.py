"""The agent process: runs one simulation's HarnessAgent, the candidate's code, inside the sandbox.

A fresh fork of the keyless zygote, one per simulation, so nothing carries
from one simulation to the next. Before any candidate code runs it empties its
environment, moves into its scratch directory and confines itself
(evolver.evaluation.sandbox); then it imports agent/agent.py from its read-only copy and
serves the trusted evaluator (evolver.evaluation.proxy_agent) over its channel:

  host -> evaluator   {"op": "confined", "isolation": {...}} | {"op": "sandbox_error", "error": ...}
                      {"op": "ready"} | {"op": "import_error", "error": ...}
  evaluator -> host   {"op": "init", "tools": [schema], "policy": str, "history": [msg] | null, "seed": int | null,
                       "max_steps": int}
                      {"op": "next", "message": msg}   ->  {"op": "reply", "message": msg, "stop": bool}
                      {"op": "is_stop", "message": msg} -> {"op": "is_stop", "stop": bool}
                      {"op": "stop"}: the simulation is over
  during a turn       {"op": "llm", "messages": [...], "tools": [...] | null, "tool_choice": ...}
                      -> {"op": "llm_reply", "response": {...}} | {"op": "llm_error", "error": str}
  any failure         {"op": "error", "error": str}, then exit

The model, endpoint, key and sampling settings are not here: an LLM request
carries only messages and tools, and the trusted side answers it. The
environment holds the agent model's name and reasoning effort
(AGENT_MODEL, AGENT_REASONING_EFFORT: names, as auto-harness's agents read
them), never a key; whatever the candidate does with them, the trusted side
calls its own configured model with its own arguments.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import traceback
from pathlib import Path

from evolver.evaluation.channel import Channel

MESSAGE_KINDS = ("UserMessage", "AssistantMessage", "ToolMessage", "MultiToolMessage", "SystemMessage")
PLACEHOLDER_MODEL = "evolver-proxy"  # what the candidate sees as its model; the evaluator decides the real one


def encode_message(message) -> dict:
    return {"kind": type(message).__name__, "data": message.model_dump(mode="json")}


def decode_message(wire) -> object:
    """A tau2 message from the wire; anything else raises ValueError."""
    import tau2.data_model.message as m

    if not isinstance(wire, dict) or wire.get("kind") not in MESSAGE_KINDS or not isinstance(wire.get("data"), dict):
        raise ValueError("not a tau2 message")
    return getattr(m, wire["kind"]).model_validate(wire["data"])


def serve(fd: int, spec: dict) -> int:
    """The agent process's whole life. Returns its exit code."""
    os.dup2(fd, 3)
    os.closerange(4, 1 << 16)  # nothing of the zygote's stays open here
    chan = Channel(socket.socket(fileno=3))
    scratch = Path(spec["scratch"])
    os.environ.clear()  # no secret was ever in this process (the zygote is keyless); no setting leaks either
    os.environ.update({"HOME": str(scratch), "TMPDIR": str(scratch), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    os.environ.update(agent_names(spec.get("names")))
    os.chdir(scratch)
    sys.dont_write_bytecode = True
    try:
        isolation = _confine(spec)
    except Exception as exc:  # noqa: BLE001 - still trusted code: report it as the sandbox's failure
        chan.send({"op": "sandbox_error", "error": f"{type(exc).__name__}: {exc}"})
        return 70
    chan.send({"op": "confined", "isolation": isolation})
    # From here on candidate code runs; nothing this process says is trusted.
    _route_llm_calls(chan)
    try:
        cls = _import_candidate(Path(spec["source"]))
    except BaseException as exc:  # SystemExit and KeyboardInterrupt raised by the candidate too
        chan.send({"op": "import_error", "error": _describe(exc)})
        return 3
    chan.send({"op": "ready"})
    return _serve_turns(chan, cls)


def _confine(spec: dict) -> dict:
    if not spec.get("sandbox", True):
        return {"mode": "none", "why": "--unsafe-no-sandbox"}
    from evolver.evaluation import sandbox

    return sandbox.confine([Path(spec["source"])], Path(spec["scratch"]), sandbox.Limits(**spec.get("limits", {})))


def agent_names(names) -> dict[str, str]:
    """Of what the evaluator sent, only AGENT_ENV's names, as text: nothing else enters the environment."""
    from evolver.data import AGENT_ENV

    names = names if isinstance(names, dict) else {}
    return {k: v for k, v in names.items() if k in AGENT_ENV and isinstance(v, str) and v}


def _import_candidate(source: Path):
    from tau2.agent.llm_agent import LLMAgent

    from evolver.evaluation import tau2_compat

    tau2_compat.install()  # tau2.agent.base_agent and other moved names, for agents written for another tau2
    sys.path.insert(0, str(source))
    import agent.agent as module  # the candidate's agent package, from its read-only copy

    cls = getattr(module, "HarnessAgent", None)
    if not (isinstance(cls, type) and issubclass(cls, LLMAgent)):
        raise TypeError("agent/agent.py must define HarnessAgent, a subclass of tau2's LLMAgent")
    return cls


def _route_llm_calls(chan: Channel) -> None:
    """tau2's generate() calls llm_utils.completion: here that is a request to the evaluator."""
    import tau2.utils.llm_utils as llm_utils
    from litellm import ModelResponse

    lock = threading.Lock()  # one request at a time on the channel, whatever threads the candidate starts

    def completion(model=None, messages=None, tools=None, tool_choice=None, **_ignored):
        with lock:
            chan.send({"op": "llm", "messages": messages, "tools": tools, "tool_choice": tool_choice})
            answer = chan.receive()
        if answer["op"] == "llm_reply":
            return ModelResponse(**answer["response"])
        raise RuntimeError(answer.get("error") or "the LLM request failed")

    llm_utils.completion = completion


def _serve_turns(chan: Channel, cls) -> int:
    agent = state = None
    while True:
        request = chan.receive()
        op = request["op"]
        try:
            if op == "init":
                agent = cls(
                    tools=[_remote_tool(s) for s in request["tools"]], domain_policy=request["policy"], llm=PLACEHOLDER_MODEL, llm_args={}
                )
                agent.max_steps = request.get("max_steps")  # tau2 does not tell an agent its step limit; evolver does
                if request.get("seed") is not None:
                    agent.set_seed(request["seed"])
                history = [decode_message(m) for m in request.get("history") or []] or None
                state = agent.get_init_state(history)
                chan.send({"op": "initialised"})
            elif op == "next":
                reply, state = agent.generate_next_message(decode_message(request["message"]), state)
                chan.send({"op": "reply", "message": encode_message(reply), "stop": bool(agent.is_stop(reply))})
            elif op == "is_stop":
                chan.send({"op": "is_stop", "stop": bool(agent.is_stop(decode_message(request["message"])))})
            else:  # "stop", or anything unknown: the simulation is over
                if agent is not None:
                    agent.stop(None, state)
                return 0
        except BaseException as exc:  # the candidate's failure: say what it was, then end
            chan.send({"op": "error", "error": _describe(exc)})
            return 1


def prepare() -> None:
    """Warm, in the zygote, what every agent process needs before it runs candidate code."""
    _remote_tool_class()
    _complete_litellm_models()
    from evolver.evaluation import tau2_compat  # noqa: F401 - imported here, installed only in an agent process

    _answer_builtin_default_factories()


def _complete_litellm_models() -> None:
    """litellm's response classes finish building their pydantic schemas on first use (six
    classes, about 4 ms of CPU); done here once, every forked agent process inherits them."""
    from litellm import ModelResponse

    call = {"id": "warm", "type": "function", "function": {"name": "warm", "arguments": "{}"}}
    ModelResponse(
        id="warm",
        model=PLACEHOLDER_MODEL,
        usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        choices=[{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "", "tool_calls": [call]}}],
    )


BUILTIN_FACTORIES = (list, dict, set, frozenset, tuple, str, bytes, int, float, bool)


def _answer_builtin_default_factories() -> None:
    """pydantic asks inspect for the signature of every ``default_factory``; for a builtin such as
    ``list`` inspect copies sys.modules, and in a forked process that copy writes the refcount of
    every module, about 2,400 shared pages copied (some 9 ms of kernel time per agent process, for
    a template with four ``Field(default_factory=list)``). A builtin's answer never changes, so it
    is computed here once. Performance only: an unknown pydantic falls through unchanged."""
    from pydantic._internal import _fields, _generate_schema

    original = getattr(_fields, "takes_validated_data_argument", None)
    if original is None or getattr(_generate_schema, "takes_validated_data_argument", None) is not original:
        return
    known = tuple((factory, original(factory)) for factory in BUILTIN_FACTORIES)

    def takes_validated_data_argument(default_factory):
        for factory, answer in known:
            if default_factory is factory:
                return answer
        return original(default_factory)

    _fields.takes_validated_data_argument = _generate_schema.takes_validated_data_argument = takes_validated_data_argument


def _remote_tool(schema: dict):
    """A tool as the agent needs it: its name and OpenAI schema. Tools run in tau2's environment, not here."""
    return _remote_tool_class()(name=schema["function"]["name"], spec=schema)


@functools.lru_cache(maxsize=1)
def _remote_tool_class():
    """Made once: a pydantic class costs milliseconds, and every simulation has several tools."""
    import copy

    from tau2.environment.tool import BaseTool

    class RemoteTool(BaseTool):
        spec: dict

        @property
        def openai_schema(self) -> dict:
            return copy.deepcopy(self.spec)

        def _call(self, *args, **kwargs):
            raise RuntimeError("tools run in tau2's environment, not in the agent")

    return RemoteTool


def _describe(exc: BaseException) -> str:
    tail = "".join(traceback.format_exception(exc)[-3:]).strip()
    return f"{type(exc).__name__}: {exc}\n{tail}"[:4000]
