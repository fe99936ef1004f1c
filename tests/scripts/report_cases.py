"""Scripted LLMs for the run report and tracking tests: a run whose lineage has two kept steps.

The agent garbles the titles of two kinds of task (numbers 1 and 3 modulo 4); each of two
rules fixes one kind, so keeping both makes a chain base -> exact -> thorough. The meta-LLM
follows EVOLVER_TEST_PLAN: iteration by iteration, comma-separated, the proposal of each
candidate joined by "+", e.g. "exact+worse,thorough+broken,note".
"""

import os
import re

from evolver.scripted import Reply, mock_agent, mock_script
from tests.scripts.loop_cases import EXACT, PROPOSALS, THOROUGH, TRANSFER, _anchor_edit

ANSWERS = {
    "exact": "TITLE: Keep the user's exact title\nRATIONALE: Titles ending in 1 or 5 were rewritten.\n" + _anchor_edit(EXACT),
    "thorough": "TITLE: Check every detail\nRATIONALE: Titles ending in 3 or 7 were rewritten.\n" + _anchor_edit(THOROUGH),
    "worse": PROPOSALS[2],
    "broken": PROPOSALS[0],
    "optimizer": PROPOSALS[1],
    "note": "TITLE: Be courteous\nRATIONALE: a harmless note\n" + _anchor_edit("Note: be courteous."),
}


def agent(messages):
    system = str(messages[0].get("content") or "")
    if TRANSFER in system:
        return (
            Reply(tool_calls=[("transfer_to_human_agents", {"summary": "transfer"})])
            if messages[-1].get("role") == "user"
            else Reply("You are being transferred.")
        )
    request = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    number = re.search(r"(\d+)'", request)
    kind = int(number.group(1)) % 4 if number else 0
    careless = (kind == 1 and EXACT not in system) or (kind == 3 and THOROUGH not in system)
    return mock_agent(messages, careless=careless)


def meta(messages):
    prompt = str(messages[1].get("content") or "")
    plan = os.environ["EVOLVER_TEST_PLAN"].split(",")
    done = len(set(re.findall(r"^- Iteration (\d+)[a-z]?:", prompt, re.M)))
    choices = plan[min(done, len(plan) - 1)].split("+")
    which = re.search(r"proposal (\d+) of \d+", prompt, re.I)
    return Reply(ANSWERS[choices[int(which.group(1)) - 1 if which else 0]])


def script(name, messages, tools):
    if name == "agent":
        return agent(messages)
    if name == "meta":
        return meta(messages)
    return mock_script(name, messages, tools)
