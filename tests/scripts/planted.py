"""Planted faults: eight variants of the template agent, each with one deliberate fault of the kinds
Life-Harness's layers target, for benchmarks/planted_faults.py and tests/test_proposer.py. Two of them
(rewritten_call, dropped_history) leave tau2's trajectory looking like the model's own mistake: only
the model's view of each turn (evolver.store.turnview) shows the harness at work.

With the scripted customer and the scripted agent below (EVOLVER_SCRIPT=tests.scripts.planted:script,
--agent-model scripted/bench), the template solves every task of the test domain built on tau2's mock
environment (tests/scripts/gen_domain.py: create a task with a title) and each faulty variant solves
none, so a proposer that finds the fault can win back all of it.

The scripted agent is tau2's competent mock agent with two needs a real model has too: it follows
its instructions only when it sees them (no system prompt: it garbles titles), and it confirms a
tool's result only with the user's request in view (otherwise it asks again, and a second task is
created). The scripted meta-agent (tests/scripts/meta_agent.py) reads a failing trajectory and
recognises each fault by its symptom there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from evolver.scripted import Reply, mock_agent, mock_script
from tests.scripts.meta_agent import Fix, investigate

LOST = "I lost track of your request. What did you need?"
SORRY = "Sorry, I cannot do that."  # the faulty repair's refusal (the scripted agent answers a refused call with its own sorry)


@dataclass(frozen=True)
class Planted:
    name: str
    kind: str  # the layer it belongs to, in Life-Harness's terms
    old: str  # text of the template's agent/agent.py
    new: str  # the fault
    switches: tuple[str, ...] = ()  # harness layers the variant turns on
    symptom: str = ""  # what the scripted meta-agent recognises in a failing trajectory
    more: tuple[tuple[str, str], ...] = ()  # further (old, new) changes of the same fault


TURN = "        if isinstance(message, MultiToolMessage):\n            state.messages.extend(message.tool_messages)\n        else:\n            state.messages.append(message)\n"
CONTEXT = "        context = state.system_messages + state.messages + self.guidance(state)\n"
CALL = "        reply = self.call_llm(context)\n"
STOP = "        return any(failed[call_text(c)] >= H4_REPEAT_LIMIT for c in reply.tool_calls or [])\n"
UNKNOWN = "    problems += [f\"unknown argument '{a}' (arguments: {', '.join(props) or 'none'})\" for a in call.arguments if a not in props]\n"
RETRY_END = "        for call in retry.tool_calls or []:\n            repair_call(call, schemas)\n        return charge_attempt(retry, reply)\n"

FAULTS = [
    Planted("argument_coercion", "H2 action realization: an argument coercion corrupts every tool call", CALL,
            CALL + "        for call in reply.tool_calls or []:  # normalise arguments\n"
                   "            call.arguments = {k: v.upper() if isinstance(v, str) else v for k, v in call.arguments.items()}\n",
            symptom=r"tool ERROR"),
    # Only the model's view tells it apart from a model that writes a wrong title: the trajectory shows the call as tau2 got it.
    Planted("rewritten_call", "H2 action realization: the model's tool call is rewritten after it answered", CALL,
            CALL + "        for call in reply.tool_calls or []:  # keep arguments short for the tools\n"
                   "            call.arguments = {k: v[:10] if isinstance(v, str) else v for k, v in call.arguments.items()}\n",
            symptom=r"arguments changed after the model answered"),
    Planted("dropped_tool_results", "history: tool results never reach the model", TURN,
            "        if not isinstance(message, (MultiToolMessage, ToolMessage)):  # results are in the environment already\n"
            "            state.messages.append(message)\n",
            symptom=r"create_task\([^\n]*\)\ntool: [^\n]*\nassistant -> tool create_task"),
    Planted("early_stop", "H4 trajectory regulation: a stop rule ends conversations before the agent acts", STOP,
            STOP.replace("or [])", "or []) or len(state.messages) >= 2"), switches=("h4_trajectory_regulation",),
            symptom=r"ended by agent_stop after 3 messages"),
    # The state keeps the conversation; only the prompt loses it, so the trajectory looks like a forgetful model.
    Planted("dropped_history", "the prompt: the earlier turns of the conversation are dropped from it", CONTEXT,
            "        context = state.system_messages + state.messages[-2:] + self.guidance(state)  # the latest exchange is what matters\n",
            symptom=r"earlier messages? of the conversation left out"),
    Planted("state_reset", "state: the conversation is forgotten at every turn", TURN,
            "        state.messages = []  # start each turn clean\n" + TURN,
            symptom=LOST[:20]),
    # The check is inverted (every valid argument is "unknown"), and what is still broken after the retry is refused.
    Planted("blocking_repair", "H2 action realization: a repair that blocks valid calls", UNKNOWN,
            UNKNOWN.replace("if a not in props", "if a in props"), switches=("h2_action_realization",),
            symptom=r"\nuser: [^\n]*\nassistant: Sorry, that did not work",
            more=((RETRY_END, RETRY_END.replace("            repair_call(call, schemas)\n",
                                                 f"            if repair_call(call, schemas):\n"
                                                 f"                return AssistantMessage(role=\"assistant\", content=\"{SORRY}\")\n")),)),
    # last: its symptom (a wrong result, no error) is what every other fault shows too
    Planted("lost_instruction", "the prompt: the system instructions never reach the model", CONTEXT,
            "        context = state.messages + self.guidance(state)\n",
            symptom=r"wrong final database state(?![\s\S]*tool ERROR)"),
]


def plant(template: str, fault: Planted) -> str:
    for old, new in [(fault.old, fault.new), *fault.more]:
        assert template.count(old) == 1, f"{fault.name}: the template changed; update tests/scripts/planted.py"
        template = template.replace(old, new)
    return template


def fixes() -> list[Fix]:
    """What the scripted meta-agent knows: each fault's symptom and the edits that remove it."""
    return [Fix(symptom=f.symptom, path="agent/agent.py", old=f.new, new=f.old, title=f"Undo the {f.name.replace('_', ' ')}",
                more=tuple((new, old) for old, new in f.more)) for f in FAULTS]


def bench_agent(messages: list[dict]) -> Reply:
    system = str(messages[0].get("content") or "") if messages and messages[0].get("role") == "system" else ""
    conversation = [m for m in messages if m.get("role") != "system"]
    if not conversation:
        return Reply("How can I help you with your tasks?")
    last = conversation[-1]
    if last.get("role") == "tool" and not any(m.get("role") == "user" for m in conversation):
        return Reply(LOST)
    return mock_agent(messages, careless="<policy>" not in system)


def digest_answer(messages: list[dict]) -> Reply:
    """The one-shot proposer's scripted meta-LLM: the same knowledge, matched against the digest it is shown;
    each answer sent back (its SEARCH text was not in the file) is followed by the next fix that matches."""
    prompt = "\n".join(str(m.get("content") or "") for m in messages[:2])
    hypotheses = [f for f in fixes() if re.search(f.symptom, prompt)]
    answered = sum(1 for m in messages if m.get("role") == "assistant")
    if answered >= len(hypotheses):
        return Reply("I cannot tell what is wrong from this digest.")
    fix = hypotheses[answered]
    blocks = "".join(f"<<<<<<< SEARCH\n{old}=======\n{new}>>>>>>> REPLACE\n" for old, new in [(fix.old, fix.new), *fix.more])
    return Reply(f"TITLE: {fix.title}\nRATIONALE: the digest shows it\nFILE: {fix.path}\n{blocks}")


def script(name, messages, tools):
    if name == "bench":
        return bench_agent(messages)
    if name == "meta":
        return investigate(messages, fixes()) if tools else digest_answer(messages)
    return mock_script(name, messages, tools)
