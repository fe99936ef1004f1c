"""Planted faults: eight variants of the template agent, each with one deliberate fault of the kinds
Life-Harness's layers target, for benchmarks/planted_faults.py and tests/test_proposer.py. Two of them
(rewritten_call, dropped_history) leave tau2's trajectory looking like the model's own mistake: only
the model's view of each turn (evolver.store.turnview) shows the harness at work.

With the scripted customer and the scripted agent below (EVOLVER_SCRIPT=tests.scripts.planted:script,
--agent-model scripted/bench) and the layers the faults live in switched on (LAYERS: H2 and H4), the
template solves every task of the planted domain (tests/scripts/planted_domain.py) and each faulty
variant solves none; without a layer, or without the turn method, the tasks that need it fail. The
test domain of tests/scripts/gen_domain.py (one task created per conversation) is played the same way.

The scripted agent does what the customer asks, one tool call at a time, with needs and habits a real
model has too:
- it follows its instructions only when it sees them (no system prompt: it garbles titles);
- it works from the customer's request and the results since, so it needs both in view: without the
  request it says it lost track, without the results it makes the same call again (three times, then
  it tells the customer);
- it takes the customer's words for values and argument names ("Completed" for the status, `name` for
  a task "named" so), which H2 repairs, or sends back naming the tool's arguments, and then it corrects
  the call;
- it makes a call that the tool refused again, ignoring H4's notes, until H4's stop rule ends it.
The customer asks once more when the agent did not confirm success, then gives up. The scripted
meta-agent (tests/scripts/meta_agent.py) reads a failing trajectory and recognises each fault by its
symptom there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import takewhile

from evolver.scripted import QUOTED, TASK_ID, USER_ID, Reply, mock_script
from tests.scripts.meta_agent import Fix, investigate

LOST = "I lost track of your request. What did you need?"
NO_ANSWER = "Sorry, the system did not answer my requests."
UNANSWERED = 3  # calls in a row without a result in view before the agent tells the customer
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
UNKNOWN = (
    "    problems += [f\"unknown argument '{a}' (arguments: {', '.join(props) or 'none'})\" for a in call.arguments if a not in props]\n"
)
RETRY_END = (
    "        for call in retry.tool_calls or []:\n            repair_call(call, schemas)\n        return charge_attempt(retry, reply)\n"
)

FAULTS = [
    Planted(
        "argument_coercion",
        "H2 action realization: an argument coercion corrupts every tool call",
        CALL,
        CALL + "        for call in reply.tool_calls or []:  # normalise arguments\n"
        "            call.arguments = {k: v.upper() if isinstance(v, str) else v for k, v in call.arguments.items()}\n",
        symptom=r"Error: User <V\d+> not found",
    ),  # its user id upper-cased, in the trajectory and the digest alike
    # Only the model's view tells it apart from a model that writes a wrong title: the trajectory shows the call as tau2 got it.
    Planted(
        "rewritten_call",
        "H2 action realization: the model's tool call is rewritten after it answered",
        CALL,
        CALL + "        for call in reply.tool_calls or []:  # keep arguments short for the tools\n"
        "            call.arguments = {k: v[:10] if isinstance(v, str) else v for k, v in call.arguments.items()}\n",
        symptom=r"arguments changed after the model answered",
    ),
    Planted(
        "dropped_tool_results",
        "history: tool results never reach the model",
        TURN,
        "        if not isinstance(message, (MultiToolMessage, ToolMessage)):  # results are in the environment already\n"
        "            state.messages.append(message)\n",
        symptom=r"create_task\([^\n]*\)\ntool: [^\n]*\nassistant -> tool create_task",
    ),
    Planted(
        "early_stop",
        "H4 trajectory regulation: a stop rule ends conversations before the agent acts",
        STOP,
        STOP.replace("or [])", "or []) or len(state.messages) >= 2"),
        switches=("h4_trajectory_regulation",),
        symptom=r"ended by agent_stop after 3 messages",
    ),
    # The state keeps the conversation; only the prompt loses it, so the trajectory looks like a forgetful model.
    Planted(
        "dropped_history",
        "the prompt: the earlier turns of the conversation are dropped from it",
        CONTEXT,
        "        context = state.system_messages + state.messages[-2:] + self.guidance(state)  # the latest exchange is what matters\n",
        symptom=r"earlier messages? of the conversation left out",
    ),
    Planted(
        "state_reset",
        "state: the conversation is forgotten at every turn",
        TURN,
        "        state.messages = []  # start each turn clean\n" + TURN,
        symptom=LOST[:20],
    ),
    # The check is inverted (every valid argument is "unknown"), and what is still broken after the retry is refused.
    Planted(
        "blocking_repair",
        "H2 action realization: a repair that blocks valid calls",
        UNKNOWN,
        UNKNOWN.replace("if a not in props", "if a in props"),
        switches=("h2_action_realization",),
        symptom=r"\nuser: [^\n]*\nassistant: Sorry, that did not work",
        more=(
            (
                RETRY_END,
                RETRY_END.replace(
                    "            repair_call(call, schemas)\n",
                    f"            if repair_call(call, schemas):\n"
                    f'                return AssistantMessage(role="assistant", content="{SORRY}")\n',
                ),
            ),
        ),
    ),
    # last: its symptom (a wrong result, no error) is what every other fault shows too
    Planted(
        "lost_instruction",
        "the prompt: the system instructions never reach the model",
        CONTEXT,
        "        context = state.messages + self.guidance(state)\n",
        symptom=r"wrong final database state(?![\s\S]*tool ERROR)",
    ),
]


LAYERS = tuple(sorted({layer for f in FAULTS for layer in f.switches}))  # the layers the faults live in, on in the benchmark


def plant(template: str, fault: Planted) -> str:
    for old, new in [(fault.old, fault.new), *fault.more]:
        assert template.count(old) == 1, f"{fault.name}: the template changed; update tests/scripts/planted.py"
        template = template.replace(old, new)
    return template


def fixes() -> list[Fix]:
    """What the scripted meta-agent knows: each fault's symptom and the edits that remove it."""
    return [
        Fix(
            symptom=f.symptom,
            path="agent/agent.py",
            old=f.new,
            new=f.old,
            title=f"Undo the {f.name.replace('_', ' ')}",
            more=tuple((new, old) for old, new in f.more),
        )
        for f in FAULTS
    ]


def _text(message: dict) -> str:
    return str(message.get("content") or "")


def _plan(request: str, results: list[str], careless: bool) -> list[tuple[str, dict]]:
    """The calls a request asks for, in order; ``results`` are the successful results seen so far (an update
    of the task just created needs its id from the creation's result)."""
    user = USER_ID.search(request)
    argument = "name" if " named '" in request else "title"  # it takes the customer's word for the argument's name
    titles = [t.upper() + " (copy)" if careless else t for t in QUOTED.findall(request)]
    calls = [("create_task", {"user_id": user.group(0) if user else "user_1", argument: t}) for t in titles]
    if it := re.search(r"mark it as (\w+)", request):  # the status in the customer's word: "Completed", not the tool's "completed"
        created = TASK_ID.search(results[len(titles) - 1]) if len(results) >= len(titles) else None  # the last creation's result
        calls.append(("update_task_status", {"task_id": created.group(0) if created else "", "status": it.group(1)}))
    if other := re.search(r"mark (task_\d+) as (\w+)", request):
        calls.append(("update_task_status", {"task_id": other.group(1), "status": other.group(2)}))
    return calls


def _after_error(view: list[dict]) -> Reply:
    """A call that failed: corrected when the error names the arguments the tool takes (H2's answer), given up
    when that names nothing it can correct, and made again when the tool itself failed: it does not read the
    tool's errors (H4's notes tell it to stop, which it ignores too; H4's stop rule ends it)."""
    asked = next(m for m in reversed(view) if m.get("role") == "assistant" and m.get("tool_calls"))
    fn = asked["tool_calls"][0]["function"]
    name, arguments = fn["name"], json.loads(fn.get("arguments") or "{}")
    error = _text(view[-1])
    if not error.startswith("Error: not executed."):
        return Reply(tool_calls=[(name, arguments)])
    missing = re.findall(r"missing required argument '(\w+)'", error)
    takes = re.search(r"\(arguments: ([^)]*)\)", error)
    stray = [a for a in arguments if takes and a not in takes.group(1).split(", ")]
    if not (missing and stray):
        return Reply("Sorry, that did not work.")
    arguments[missing[0]] = arguments.pop(stray[0])
    return Reply(tool_calls=[(name, arguments)])


def bench_agent(messages: list[dict]) -> Reply:
    system = _text(messages[0]) if messages and messages[0].get("role") == "system" else ""
    view = [m for m in messages if m.get("role") != "system"]  # harness notes after the conversation too
    if not view:
        return Reply("How can I help you with your tasks?")
    asked = [i for i, m in enumerate(view) if m.get("role") == "user"]
    if not asked:
        return Reply(LOST if view[-1].get("role") == "tool" else "How can I help you with your tasks?")
    if view[-1].get("role") == "tool" and _text(view[-1]).startswith("Error"):
        return _after_error(view)
    unanswered = len(list(takewhile(lambda m: m.get("role") == "assistant" and m.get("tool_calls"), reversed(view))))
    if unanswered >= UNANSWERED:
        return Reply(NO_ANSWER)
    request = _text(view[asked[-1]])
    results = [_text(m) for m in view[asked[-1] + 1 :] if m.get("role") == "tool" and not _text(m).startswith("Error")]
    plan = _plan(request, results, careless="<policy>" not in system)
    if not plan:
        return Reply("How can I help you with your tasks?")
    if len(results) < len(plan):
        return Reply(tool_calls=[plan[len(results)]])
    return Reply("Done: the change was made successfully.")


def bench_user(messages: list[dict]) -> Reply:
    """The planted domain's customer asks for what its scenario says, once more when the agent did not confirm
    success, and then gives up; other domains' scenarios are played by tau2's mock customer."""
    scenario = _text(messages[0]) if messages and messages[0].get("role") == "system" else ""
    request = re.search(r'Ask for exactly this: "(.*)"', scenario, re.S)
    if not request:
        return mock_script("user", messages, None)
    heard = _text(messages[-1]) if messages[-1].get("role") == "user" else ""
    said = [m for m in messages if m.get("role") == "assistant"]  # the customer's own turns
    if "success" in heard.lower():
        return Reply("Thank you, that is all. ###STOP###")
    if len(said) >= 2:
        return Reply("Never mind, I will do it myself. ###STOP###")
    return Reply(request.group(1))


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
    if name == "user":
        return bench_user(messages)
    return mock_script(name, messages, tools)
