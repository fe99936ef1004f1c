"""Scripted agents that exercise the harness layers on tau2's mock domain.

EVOLVER_SCRIPT=tests.scripts.harness_agents:script, then --agent-model scripted/<name>:

  scripted/agent     the competent mock agent (evolver.scripted.mock_agent)
  scripted/sloppy    writes every first attempt of a tool call malformed, the
                     kind fixed by the tool (see MALFORMED); after a tool error
                     it writes the call correctly, as a model does when told
  scripted/stubborn  repeats one failing call, whatever the tools or notes say
  scripted/probe     reports which skills (H5) it found in its context

The user and judge are evolver.scripted's. A system message after the
conversation is harness guidance (H4 notes, H5 skills): a real model reads it
along with the rest, and only the probe looks at it, so the other scripted
agents see the conversation without it.
"""

from __future__ import annotations

import json
import re
from typing import Optional

from evolver.scripted import QUOTED, Reply, mock_agent, mock_judge, mock_user

# How each tool's call is malformed on the first attempt (tau2 mock domain).
MALFORMED = {
    "create_task": "json_text",  # the call written as JSON in the message text
    "update_task_status": "wrong_type",  # status given as a boolean instead of "completed"
    "transfer_to_human_agents": "unknown_tool",  # a tool name that does not exist
}


def _conversation(messages: list[dict]) -> list[dict]:
    return [m for i, m in enumerate(messages) if i == 0 or m.get("role") != "system"]


def _calls(message: dict) -> list[tuple[str, dict]]:
    out = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function") or c
        args = fn.get("arguments")
        out.append((fn.get("name"), json.loads(args) if isinstance(args, str) else args))
    return out


def _malformed(intended: Reply) -> Reply:
    name, args = intended.tool_calls[0]
    kind = MALFORMED.get(name)
    if kind == "json_text":
        return Reply("```json\n" + json.dumps({"name": name, "arguments": args}) + "\n```")
    if kind == "wrong_type":
        return Reply(tool_calls=[(name, {**args, "status": True})])
    if kind == "unknown_tool":
        return Reply(tool_calls=[(name + "_v2", args)])
    return intended


def sloppy_agent(messages: list[dict]) -> Reply:
    last = messages[-1]
    if last.get("role") == "tool" and "error" in str(last.get("content") or "").lower():
        i = max(n for n, m in enumerate(messages) if m.get("role") == "assistant")
        intended = mock_agent(messages[:i])
        if intended.tool_calls and _calls(messages[i]) != intended.tool_calls:
            return intended  # told what was wrong: write the call properly
        return Reply("Sorry, that did not work.")
    intended = mock_agent(messages)
    return _malformed(intended) if intended.tool_calls else intended


def stubborn_agent(messages: list[dict]) -> Reply:
    user_request = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    title = QUOTED.search(user_request)
    return Reply(tool_calls=[("create_task", {"user_id": "user_404", "title": title.group(1) if title else "Task"})])


SKILL = re.compile(r'<skill name="([^"]+)">')


def probe_agent(messages: list[dict]) -> Reply:
    found = sorted({s for m in messages[1:] if m.get("role") == "system" for s in SKILL.findall(str(m.get("content")))})
    return Reply("skills in context: " + (", ".join(found) or "none"))


def script(name: str, messages: list[dict], tools: Optional[list[dict]]) -> Reply:
    if name == "user":
        return mock_user(messages)
    if name == "judge":
        return mock_judge(messages)
    if name == "probe":
        return probe_agent(messages)
    agents = {"agent": mock_agent, "sloppy": sloppy_agent, "stubborn": stubborn_agent}
    if name not in agents:
        raise ValueError(f"harness_agents.script has no role named {name!r}")
    return agents[name](_conversation(messages))
