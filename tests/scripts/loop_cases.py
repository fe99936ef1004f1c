"""Scripted LLMs for the loop tests: an agent whose quality depends on its instruction text,
and a meta-LLM that proposes, in turn, four patches chosen from the prompt's history section."""

import os
import re

from evolver.scripted import Reply, mock_agent, mock_script

EXACT = "Use the exact title the user gives."
TRANSFER = "Always transfer the user to a human agent."
# Partial rules: each keeps two of the titles the agent garbles exact (of the tiny domain's, one analysis task and one gate task).
PARTIAL = {"some": ("Keep titles ending in 1 or 3 exact.", (1, 3)), "other": ("Keep titles ending in 1 or 5 exact.", (1, 5))}


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
    # Without the rule, the agent garbles every title that ends in an odd number (but those a partial rule names).
    kept = {n for rule, numbers in PARTIAL.values() if rule in system for n in numbers}
    careless = EXACT not in system and number is not None and int(number.group(1)) % 2 == 1 and int(number.group(1)) not in kept
    return mock_agent(messages, careless=careless)


def _anchor_edit(extra_line):
    return (
        f'FILE: agent/agent.py\n<<<<<<< SEARCH\nAGENT_INSTRUCTION = """\n=======\nAGENT_INSTRUCTION = """\n{extra_line}\n>>>>>>> REPLACE\n'
    )


PROPOSALS = [
    "TITLE: Break the state class\nRATIONALE: a patch with a syntax error\nFILE: agent/agent.py\n<<<<<<< SEARCH\nclass HarnessState(BaseModel):\n=======\nclass HarnessState(BaseModel)\n>>>>>>> REPLACE\n",
    "TITLE: Edit the optimizer\nRATIONALE: a patch outside agent/\nFILE: evolver/cli/commands.py\n<<<<<<< SEARCH\n=======\nprint('hi')\n>>>>>>> REPLACE\n",
    "TITLE: Transfer everyone\nRATIONALE: humans solve everything (this makes the agent worse)\n" + _anchor_edit(TRANSFER),
    "TITLE: Keep the user's exact title\nRATIONALE: Pattern 1: create_task got a garbled title\n" + _anchor_edit(EXACT),
]


def meta(messages):
    prompt = str(messages[1].get("content") or "")
    attempts = len(re.findall(r"^- Iteration \d+:", prompt, re.M))
    return Reply(PROPOSALS[min(attempts, len(PROPOSALS) - 1)])


def contrary(messages):
    """An agent model the rule misleads: it garbles odd-numbered titles only when told to keep them exact."""
    system = str(messages[0].get("content") or "")
    request = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    number = re.search(r"(\d+)'", request)
    return mock_agent(messages, careless=EXACT in system and number is not None and int(number.group(1)) % 2 == 1)


def script(name, messages, tools):
    if name == "agent":
        return agent(messages)
    if name == "contrary":
        return contrary(messages)
    if name == "meta":
        return meta(messages)
    return mock_script(name, messages, tools)


def sloppy_meta(name, messages, tools):
    """Answers in prose first; follows the format once told what was wrong."""
    if "could not be used" in str(messages[-1].get("content")):
        return Reply(PROPOSALS[3])
    return Reply("I think the agent should keep titles exactly as given.")


def revising_meta(name, messages, tools):
    """Proposes the worse patch, then a comment, then the fix: each time it is told its patch cannot be used as it is."""
    told = sum("cannot be used as it is" in str(m.get("content")) for m in messages if m.get("role") == "user")
    return Reply(
        [
            PROPOSALS[2],
            'TITLE: A note\nRATIONALE: r\nFILE: agent/agent.py\n<<<<<<< SEARCH\nAGENT_INSTRUCTION = """\n=======\n# the instruction\nAGENT_INSTRUCTION = """\n>>>>>>> REPLACE\n',
            PROPOSALS[3],
        ][min(told, 2)]
    )


COPIED = (
    "TITLE: Nudge the agent back to the user sooner\nRATIONALE: the agent searches silently\nFILE: agent/agent.py\n<<<<<<< SEARCH\n"
    "H4_CALLS_WITHOUT_USER = 8  # tool calls since the user last spoke before a note\n=======\n"
    "H4_CALLS_WITHOUT_USER = 5  # tool calls since the user last spoke before a note\n>>>>>>> REPLACE\n"
    "FILE: agent/harness.toml\n<<<<<<< SEARCH\nh4_trajectory_regulation = false\n=======\nh4_trajectory_regulation = true\n>>>>>>> REPLACE\n"
)


def copying_meta(name, messages, tools):
    """The 1.5B's one-shot habit: the guide's H4 example with H4 switched on; the fix once told it copied an example."""
    told = any("the guide's example patch" in str(m.get("content")) for m in messages if m.get("role") == "user")
    return Reply(PROPOSALS[3] if told else COPIED)


def misquoting_meta(name, messages, tools):
    """Quotes a layer's switch with the wrong value (the 1.5B did, twice after "not found"); quotes the file's line once shown it."""
    if "h4_trajectory_regulation = false  # notes on repeated calls" in str(messages[-1].get("content")):
        return Reply(PROPOSALS[3])
    return Reply(
        "TITLE: H4 on\nRATIONALE: r\nFILE: agent/harness.toml\n<<<<<<< SEARCH\nh4_trajectory_regulation = true\n=======\n"
        "h4_trajectory_regulation = false\n>>>>>>> REPLACE\n"
    )


def unparsed_meta(name, messages, tools):
    """The 1.5B's one-shot answer to a removal with a kept line: it leaves the kept line out, and the file no longer
    parses; it writes the line once told so. EVOLVER_TEST_TOLD caps how many times it mends (default: always)."""
    told = sum("does not parse" in str(m.get("content")) for m in messages if m.get("role") == "user")
    if told and told <= int(os.environ.get("EVOLVER_TEST_TOLD", "9")):
        return Reply(PROPOSALS[3])
    return Reply(
        'TITLE: Drop the instruction\nRATIONALE: r\nFILE: agent/agent.py\n<<<<<<< SEARCH\nAGENT_INSTRUCTION = """\n=======\n'
        ">>>>>>> REPLACE\n"
    )


def prose_meta(name, messages, tools):
    return Reply("No patch today.")


def outage_script(name, messages, tools):
    """The agent's provider fails whenever the agent was told to transfer everyone (iteration 3):
    that candidate's gate is all infrastructure errors, so it is undecided."""
    from litellm import ServiceUnavailableError

    if name == "agent" and TRANSFER in str(messages[0].get("content") or ""):
        raise ServiceUnavailableError(message="scripted outage", llm_provider="scripted", model="scripted/agent")
    return script(name, messages, tools)


def repeating_script(name, messages, tools):
    """A meta-LLM with one idea, proposed again and again: the worse 'Transfer everyone' patch."""
    if name == "meta":
        return Reply(PROPOSALS[2])
    return script(name, messages, tools)


def candidates_script(name, messages, tools):
    """Three candidates per iteration, told apart by the digest's "proposal N of 3": the fix,
    the worse patch and the broken one."""
    if name == "meta":
        found = re.search(r"proposal (\d) of 3", str(messages[1].get("content") or ""), re.I)
        if found:
            return Reply(PROPOSALS[{"1": 3, "2": 2, "3": 0}[found.group(1)]])
    return script(name, messages, tools)


def distinct_candidates_script(name, messages, tools):
    """Candidate i of K adds its own line to the instruction and the rule that fixes titles: K
    distinct candidates, each better than the incumbent, so none is stopped early and each
    runs the whole gate (benchmarks/parallel_candidates.py)."""
    if name == "meta":
        found = re.search(r"proposal (\d+) of \d+", str(messages[1].get("content") or ""), re.I)
        i = found.group(1) if found else "1"
        return Reply(f"TITLE: Note {i}\nRATIONALE: a note and the title rule\n" + _anchor_edit(f"Note {i}: be courteous. {EXACT}"))
    return script(name, messages, tools)


THOROUGH = "Be thorough: check every detail before you act."
PATCHES = {
    "exact": EXACT,
    "thorough": THOROUGH,
    "worse": TRANSFER,
    "note1": "Note 1: be courteous.",
    "note2": "Note 2: be brief.",
    **{name: rule for name, (rule, _) in PARTIAL.items()},
}


def policy_script(name, messages, tools):
    """The meta-LLM of the loop-policy tests (tests/test_loop_policy.py). EVOLVER_TEST_PROPOSALS
    lists, iteration by iteration, the patches to propose, e.g. "worse,note1"; "exact+thorough"
    gives candidate 1 of 2 'exact' and candidate 2 'thorough'."""
    import os

    if name != "meta":
        return script(name, messages, tools)
    prompt = str(messages[1].get("content") or "")
    plan = os.environ["EVOLVER_TEST_PROPOSALS"].split(",")
    done = len(set(re.findall(r"^- Iteration (\d+)[a-z]?:", prompt, re.M)))
    choices = plan[min(done, len(plan) - 1)].split("+")
    which = re.search(r"proposal (\d+) of \d+", prompt, re.I)
    key = choices[int(which.group(1)) - 1 if which else 0]
    return Reply(f"TITLE: {key}\nRATIONALE: policy test\n" + _anchor_edit(PATCHES[key]))


def fix_first_script(name, messages, tools):
    """The meta-LLM proposes the fix at once: a run of one iteration reaches the gate."""
    return Reply(PROPOSALS[3]) if name == "meta" else script(name, messages, tools)


def investigator_script(name, messages, tools):
    """A tool-using meta-agent (tests/scripts/meta_agent.py) that reads a failing trajectory, sees the
    garbled create_task title and adds the rule the scripted agent needs."""
    from tests.scripts.meta_agent import Fix, investigate

    if name != "meta":
        return script(name, messages, tools)
    fix = Fix(
        symptom=r"create_task",
        path="agent/agent.py",
        old='AGENT_INSTRUCTION = """\n',
        new=f'AGENT_INSTRUCTION = """\n{EXACT}\n',
        title="Keep the user's exact title",
    )
    return investigate(messages, [fix])


def slow_investigator_script(name, messages, tools):
    """investigator_script with a meta-LLM that takes a second a turn (the agent and the customer as fast as ever):
    a proposal long enough to be cut off mid-way, without slowing the run's simulations."""
    import time

    if name == "meta":
        time.sleep(1.0)
    return investigator_script(name, messages, tools)


def busy_meta(name, messages, tools):
    """A meta-LLM that keeps looking and never submits: the proposer's budget has to stop it."""
    return Reply(tool_calls=[("list_files", {})]) if name == "meta" else script(name, messages, tools)


PLAN = "Here is my plan:\n1. **List failures**\n2. **Read a trajectory**\n3. **Fix it**"


def planning_meta(name, messages, tools):
    """A small model's habit: it answers with a plan in prose, and once its plan is in the conversation it
    copies it every turn; it makes a call only while its own prose is out of sight."""
    if name != "meta":
        return script(name, messages, tools)
    if any(m.get("role") == "assistant" and PLAN in str(m.get("content")) for m in messages):
        return Reply(PLAN)
    said = sum(1 for m in messages if m.get("role") == "user" and "Use the tools" in str(m.get("content")))
    return Reply(tool_calls=[("list_files", {})]) if said else Reply(PLAN)


def learned_fix_script(name, messages, tools):
    """The meta-LLM proposes the fix only when the learnings brought from earlier work (learnings_file, e.g.
    auto-harness's workspace/learnings.md) are in its prompt: a candidate then shows they reached it."""
    if name != "meta":
        return script(name, messages, tools)
    seen = "confirm the exchange price difference" in "".join(str(m.get("content") or "") for m in messages)
    return Reply(PROPOSALS[3] if seen else "No patch: nothing was learnt before this run.")
