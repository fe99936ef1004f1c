"""A scripted litellm provider: deterministic stand-in LLMs for tests and benchmarks.

Model strings `scripted/<name>` are answered by a *script*: a function
`(name, messages, tools) -> Reply` chosen with EVOLVER_SCRIPT=module:function
(default: `mock_script` below, which plays tau2's mock domain). Replies depend
only on the request's content, never on call order, so results do not depend
on thread scheduling, retries or resuming. EVOLVER_SCRIPTED_LATENCY adds a
fixed sleep per call (seconds), to model a hosted API in benchmarks;
EVOLVER_SCRIPTED_PRICE gives every scripted model a price (dollars per 1,000
tokens, in and out), so costs and budgets can be tested; EVOLVER_SCRIPTED_CONTEXT (characters)
refuses a longer conversation as a provider refuses one that overflows its context window;
EVOLVER_SCRIPTED_HOLD (a folder) holds every call while the folder has a file `held`, leaving one
file per waiting call there, so a test can see how many calls are in flight at once, whatever the load;
a `held` that reads "simulations" lets evolver's preflight pass and holds every other call, one that reads
"meta" holds only the meta model's (scripted/meta), its preflight let pass too.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from evolver.models import is_preflight

PROVIDER = "scripted"


@dataclass
class Reply:
    content: Optional[str] = None
    tool_calls: list[tuple[str, dict]] = field(default_factory=list)


Script = Callable[[str, list[dict], Optional[list[dict]]], Reply]


def load_script(spec: Optional[str] = None) -> Script:
    """The script EVOLVER_SCRIPT names (every caller reads it per call: tests switch scripts). Evolver's own
    preflight request (evolver.models), which no script plays, is answered before it: every script's models
    pass it, whoever serves them (this provider, or a test's fake provider server)."""
    spec = spec or os.environ.get("EVOLVER_SCRIPT") or "evolver.scripted:mock_script"
    module, _, attr = spec.partition(":")
    script = getattr(importlib.import_module(module), attr)
    return lambda name, messages, tools: Reply("ok") if is_preflight(messages) else script(name, messages, tools)


def register() -> None:
    """Register the provider with litellm (idempotent); call before the first completion."""
    import litellm
    from litellm import CustomLLM, ModelResponse

    if any(item.get("provider") == PROVIDER for item in litellm.custom_provider_map):
        return

    class ScriptedLLM(CustomLLM):
        def completion(self, model, messages, *args, optional_params=None, **kwargs):
            name = model.split("/", 1)[-1]
            tools = (optional_params or {}).get("tools") or kwargs.get("tools")
            limit = int(os.environ.get("EVOLVER_SCRIPTED_CONTEXT", "0") or 0)
            used = sum(len(str(m.get("content") or "")) for m in messages)
            if limit and used > limit:  # as a provider answers a conversation longer than its context window
                raise litellm.ContextWindowExceededError(
                    message=f"scripted/{name}: {used} characters, the context holds {limit}", model=model, llm_provider=PROVIDER
                )
            _wait_while_held(os.environ.get("EVOLVER_SCRIPTED_HOLD"), name, is_preflight(messages))
            reply = load_script()(name, messages, tools)  # read per call: tests switch scripts
            _price(litellm, name)
            latency = float(os.environ.get("EVOLVER_SCRIPTED_LATENCY", "0") or 0)
            if latency:
                time.sleep(latency)
            return _to_model_response(ModelResponse, model, messages, reply)

    litellm.custom_provider_map.append({"provider": PROVIDER, "custom_handler": ScriptedLLM()})


HOLD_LIMIT = 120.0  # seconds: a test that died holding does not leave its workers waiting for ever


def _wait_while_held(folder: Optional[str], name: str, preflight: bool) -> None:
    if not folder:
        return
    try:
        holds = Path(folder, "held").read_text().strip()
    except FileNotFoundError:
        return
    if holds and (preflight or (holds == "meta" and name != "meta")):
        return
    mark = os.path.join(folder, f"call-{os.getpid()}-{threading.get_ident()}")
    open(mark, "w").close()
    deadline = time.monotonic() + HOLD_LIMIT
    while os.path.exists(os.path.join(folder, "held")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.unlink(mark)


def register_price(name: str) -> None:
    """Give the scripted model ``name`` EVOLVER_SCRIPTED_PRICE's price with litellm (the worker does it
    at the first call; a forecast, before any)."""
    import litellm

    _price(litellm, name)


def _price(litellm, name: str) -> None:
    """litellm prices a response by its bare model name; register the scripted one's, once."""
    price = float(os.environ.get("EVOLVER_SCRIPTED_PRICE", "0") or 0)
    if price and name not in litellm.model_cost:
        per_token = price / 1000
        litellm.register_model(
            {name: {"input_cost_per_token": per_token, "output_cost_per_token": per_token, "litellm_provider": "openai", "mode": "chat"}}
        )


def _to_model_response(ModelResponse, model: str, messages: list[dict], reply: Reply):
    calls = [
        {
            "id": "call_" + hashlib.sha1(f"{len(messages)}:{n}:{json.dumps(a, sort_keys=True)}:{i}".encode()).hexdigest()[:12],
            "type": "function",
            "function": {"name": n, "arguments": json.dumps(a)},
        }
        for i, (n, a) in enumerate(reply.tool_calls)
    ]
    prompt_tokens = sum(len(str(m.get("content") or "")) for m in messages) // 4 + 1
    completion_tokens = len(reply.content or "") // 4 + 8 * len(calls) + 1
    return ModelResponse(
        model=model,
        choices=[
            {
                "index": 0,
                "finish_reason": "tool_calls" if calls else "stop",
                "message": {"role": "assistant", "content": reply.content, "tool_calls": calls or None},
            }
        ],
        usage={
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    )


# ---------------------------------------------------------------------------
# The default script: plays tau2's mock domain (task manager).
#   scripted/user   the customer: states the scenario's request, then stops
#   scripted/agent  a competent agent: makes the right tool call, confirms
#   scripted/wrong  a careless agent: creates tasks with the wrong title
#   scripted/judge  the NL-assertion judge: met when the agent confirmed success
# ---------------------------------------------------------------------------

TASK_ID = re.compile(r"\btask_\d+\b")
USER_ID = re.compile(r"\buser_\d+\b")
QUOTED = re.compile(r"'([^']+)'")


def _text(message: dict) -> str:
    return str(message.get("content") or "")


def _scenario(messages: list[dict]) -> str:
    system = _text(messages[0]) if messages and messages[0].get("role") == "system" else ""
    match = re.search(r"<scenario>(.*?)</scenario>", system, re.S)
    return match.group(1) if match else system


def mock_user(messages: list[dict]) -> Reply:
    scenario = _scenario(messages)
    said = [_text(m) for m in messages if m.get("role") == "assistant"]  # the user's own turns
    heard = _text(messages[-1]) if messages[-1].get("role") == "user" else ""
    if "transfer" in heard.lower():
        return Reply("###TRANSFER###")
    if "success" in heard.lower():
        if "compliment" in scenario.lower() and not any("compliment" in s for s in said):
            return Reply("Thanks! Could you also give me a compliment?")
        return Reply("Thank you, that is all. ###STOP###")
    if said and "compliment" in said[-1]:
        return Reply("Thanks! ###STOP###")
    if "delete" in scenario.lower():
        return Reply("Hi, I want to delete all my current tasks.")
    if "create" in scenario.lower() or "request a new task" in scenario.lower():
        title = QUOTED.search(scenario)
        user = USER_ID.search(scenario)
        return Reply(f"Hi, please create a task called '{title.group(1) if title else 'Task'}' for {user.group(0) if user else 'user_1'}.")
    task = TASK_ID.search(scenario)
    return Reply(f"Hi, please mark {task.group(0) if task else 'the task we discussed'} as completed.")


def _last_user_request(messages: list[dict]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            return _text(m)
    return ""


def mock_agent(messages: list[dict], careless: bool = False) -> Reply:
    # Harness notes may follow the conversation as system messages: answer the last real turn.
    last = next((m for m in reversed(messages) if m.get("role") != "system"), messages[-1])
    if last.get("role") == "tool":
        if "error" in _text(last).lower():
            return Reply("Sorry, that did not work.")
        if "transfer" in _text(last).lower():
            return Reply("I am transferring you to a human agent.")
        return Reply("Done: the change was made successfully.")
    request = _last_user_request(messages)
    low = request.lower()
    if "compliment" in low:
        return Reply("You are doing a great job!")
    if "delete" in low:
        return Reply(tool_calls=[("transfer_to_human_agents", {"summary": "User wants to delete tasks."})])
    if "create" in low:
        title = QUOTED.search(request)
        user = USER_ID.search(request)
        title_text = title.group(1) if title else "Task"
        if careless:
            title_text = title_text.upper() + " (copy)"
        return Reply(tool_calls=[("create_task", {"user_id": user.group(0) if user else "user_1", "title": title_text})])
    if "complete" in low:
        ids = TASK_ID.findall(request) or [t for m in messages for t in TASK_ID.findall(_text(m))]
        if ids:
            return Reply(tool_calls=[("update_task_status", {"task_id": ids[-1], "status": "completed"})])
        return Reply("Which task do you mean? Please give me its id.")
    return Reply("How can I help you with your tasks?")


def mock_judge(messages: list[dict]) -> Reply:
    prompt = _text(messages[-1])
    conversation, _, outcomes = prompt.partition("expectedOutcomes:")
    try:
        assertions = ast.literal_eval(outcomes.strip())
    except (ValueError, SyntaxError):
        assertions = [outcomes.strip()]
    met = "successfully" in conversation
    results = [{"expectedOutcome": a, "reasoning": "scripted", "metExpectation": met} for a in assertions]
    return Reply(json.dumps({"results": results}))


def mock_script(name: str, messages: list[dict], tools: Optional[list[dict]]) -> Reply:
    if name == "user":
        return mock_user(messages)
    if name == "judge":
        return mock_judge(messages)
    if name in ("agent", "wrong"):
        return mock_agent(messages, careless=name == "wrong")
    raise ValueError(f"mock_script has no role named {name!r}")
