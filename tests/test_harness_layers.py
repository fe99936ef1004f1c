"""Harness layers H2-H5 of the agent template: unit checks in-process, effects through real tau2 runs.

The in-process tests load agent/templates/tau_bench.py (our own code, not a
candidate's) with a recording stand-in for tau2's `generate`. The end-to-end
tests run `evolver eval` in a worker subprocess with the scripted agents of
tests/scripts/harness_agents.py on tau2's mock domain.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

from evolver.llm import prepare_environment
from tests.conftest import ROOT, eval_json

TEMPLATE = ROOT / "agent" / "templates" / "tau_bench.py"
SCRIPT = {"EVOLVER_SCRIPT": "tests.scripts.harness_agents:script"}
LAYERS = ["h2_action_realization", "h3_environment_contract", "h4_trajectory_regulation", "h5_procedural_skills"]


@pytest.fixture(scope="module")
def tpl():
    prepare_environment()
    spec = importlib.util.spec_from_file_location("harness_template_under_test", TEMPLATE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the state's annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def msg():
    from tau2.data_model import message

    return message


class FakeLLM:
    """Stands in for tau2's generate: records each request, answers from a queue."""

    def __init__(self, *replies):
        self.replies, self.requests = list(replies), []

    def __call__(self, **kwargs):
        self.requests.append(kwargs)
        return self.replies.pop(0)


def make_agent(tpl, monkeypatch, *replies, **switches):
    from tau2.domains.mock.environment import get_environment

    agent = tpl.HarnessAgent(
        tools=get_environment().get_tools(), domain_policy="Help with tasks.", llm="scripted/x", llm_args={"temperature": 0}
    )
    agent.switches = tpl.HarnessSwitches(**switches)
    fake = FakeLLM(*replies)
    monkeypatch.setattr(tpl, "generate", fake)
    return agent, fake


def say(msg, text):
    return msg.AssistantMessage(role="assistant", content=text, usage={"prompt_tokens": 10, "completion_tokens": 2}, cost=0.1)


def call(msg, name, args, call_id="c1", usage=(10, 2)):
    return msg.AssistantMessage(
        role="assistant",
        tool_calls=[msg.ToolCall(id=call_id, name=name, arguments=args)],
        usage={"prompt_tokens": usage[0], "completion_tokens": usage[1]},
        cost=0.1,
    )


def user(msg, text):
    return msg.UserMessage(role="user", content=text)


def tool_result(msg, text, error=False, call_id="c1"):
    return msg.ToolMessage(id=call_id, role="tool", content=text, error=error)


# ---- the baseline: files, switches, and all layers off == tau2's LLMAgent -----------------


def test_baseline_files_and_switches(tpl, tmp_path):
    assert (ROOT / "agent" / "agent.py").read_text() == TEMPLATE.read_text()
    switches = tomllib.loads((ROOT / "agent" / "templates" / "harness.toml").read_text())
    assert switches == {layer: False for layer in LAYERS}
    assert tpl.HarnessAgent.switches == tpl.HarnessSwitches()
    assert tpl.load_switches(tmp_path / "missing.toml") == tpl.HarnessSwitches()
    (tmp_path / "typo.toml").write_text("h2_action_realisation = true\n")
    with pytest.raises(ValueError, match="h2_action_realisation"):
        tpl.load_switches(tmp_path / "typo.toml")


def test_init_writes_switches_and_skills(repo):
    templates = ROOT / "agent" / "templates"
    assert (repo / "agent" / "harness.toml").read_text() == (templates / "harness.toml").read_text()
    shipped = sorted(p.name for p in (templates / "skills").glob("*.md"))
    assert len(shipped) >= 3
    for name in shipped:
        assert (repo / "agent" / "skills" / name).read_text() == (templates / "skills" / name).read_text()


def test_all_layers_off_sends_what_tau2s_llm_agent_sends(tpl, msg, monkeypatch):
    import tau2.agent.llm_agent as tau2_agent

    first, second = call(msg, "get_users", {}), say(msg, "Done.")
    ours, our_llm = make_agent(tpl, monkeypatch, first, second)
    theirs = tau2_agent.LLMAgent(tools=ours.tools, domain_policy="Help with tasks.", llm="scripted/x", llm_args={"temperature": 0})
    their_llm = FakeLLM(first, second)
    monkeypatch.setattr(tau2_agent, "generate", their_llm)
    for agent in (ours, theirs):
        state = agent.get_init_state()
        reply, state = agent.generate_next_message(user(msg, "Who are the users?"), state)
        assert reply is first
        reply, state = agent.generate_next_message(tool_result(msg, "[]"), state)
        assert reply is second
    for mine, tau2s in zip(our_llm.requests, their_llm.requests, strict=True):
        assert mine["tools"] is ours.tools and tau2s["tools"] is ours.tools
        assert mine["messages"] == tau2s["messages"]  # the whole request, system prompt included
        assert {k: v for k, v in mine.items() if k not in ("tools", "messages")} == {
            k: v for k, v in tau2s.items() if k not in ("tools", "messages")
        }
    assert ours.is_stop(say(msg, tpl.H4_STOP_MESSAGE)) is False


def test_the_guides_examples_apply_to_a_fresh_agent(tmp_path):
    from evolver.cli.scaffold import init_repo
    from evolver.evolution import patch

    examples = re.findall(r"```\n(TITLE:.*?)```", (ROOT / "Harness.md").read_text(), re.S)
    assert len(examples) == 5  # the format, then one example per layer
    for n, example in enumerate(examples[1:]):
        init_repo(tmp_path / str(n))
        written = patch.apply_edits(tmp_path / str(n), patch.parse_proposal(example).edits)
        assert "agent/agent.py" in written or any(p.startswith("agent/skills/") for p in written)


# ---- H2 action realization -----------------------------------------------------------------


def test_h2_repairs_what_is_mechanical_and_reports_the_rest(tpl, monkeypatch):
    agent, _ = make_agent(tpl, monkeypatch)
    schemas = {t.name: t.openai_schema for t in agent.tools}
    from tau2.data_model.message import ToolCall

    def check(name, args):
        c = ToolCall(id="x", name=name, arguments=dict(args))
        return c, tpl.repair_call(c, schemas)

    c, problem = check("UpdateTaskStatus", {"task_id": "task_1", "status": " Completed"})
    assert problem is None and c.name == "update_task_status" and c.arguments == {"task_id": "task_1", "status": "completed"}
    c, problem = check("create_task", {"user_id": "user_1", "title": "T", "description": None})
    assert problem is None  # an optional argument left empty is valid
    assert "status' must be of type string" in check("update_task_status", {"task_id": "task_1", "status": True})[1]
    assert "must be one of ['pending', 'completed']" in check("update_task_status", {"task_id": "task_1", "status": "done"})[1]
    assert "missing required argument 'title'" in check("create_task", {"user_id": "user_1"})[1]
    assert "unknown argument 'owner'" in check("create_task", {"user_id": "user_1", "title": "T", "owner": "me"})[1]
    assert "Unknown tool 'delete_task'. Available tools: create_task, get_users" in check("delete_task", {})[1]

    number = {
        "function": {
            "name": "f",
            "parameters": {
                "properties": {
                    "n": {"type": "integer"},
                    "x": {"type": "number"},
                    "s": {"type": "string"},
                    "b": {"type": "boolean"},
                    "l": {"type": "array"},
                    "o": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                },
                "required": ["n"],
            },
        }
    }
    c = ToolCall(name="f", arguments={"n": "5", "x": "2.5", "s": 1234, "b": "TRUE", "l": '["a"]', "o": "7"})
    assert tpl.repair_call(c, {"f": number}) is None
    assert c.arguments == {"n": 5, "x": 2.5, "s": "1234", "b": True, "l": ["a"], "o": 7}
    c = ToolCall(name="f", arguments={"n": "five"})
    assert "argument 'n' must be of type integer" in tpl.repair_call(c, {"f": number})


def test_h2_reads_calls_written_as_text(tpl, msg, monkeypatch):
    text = '```json\n{"name": "create_task", "arguments": {"user_id": "user_1", "title": "Meeting"}}\n```'
    agent, llm = make_agent(tpl, monkeypatch, say(msg, text), h2_action_realization=True)
    reply, state = agent.generate_next_message(user(msg, "Create a task called 'Meeting' for user_1."), agent.get_init_state())
    assert reply.content is None
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("create_task", {"user_id": "user_1", "title": "Meeting"})]
    assert len(llm.requests) == 1 and state.h2_repairs == ["read 1 call(s) written as text"]


def test_h2_sends_a_broken_call_back_for_one_retry(tpl, msg, monkeypatch):
    broken = call(msg, "update_task_status", {"task_id": "task_1", "status": True}, usage=(10, 2))
    fixed = call(msg, "update_task_status", {"task_id": "task_1", "status": "completed"}, call_id="c2", usage=(20, 3))
    agent, llm = make_agent(tpl, monkeypatch, broken, fixed, h2_action_realization=True)
    reply, state = agent.generate_next_message(user(msg, "Mark task_1 as completed."), agent.get_init_state())
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("update_task_status", {"task_id": "task_1", "status": "completed"})]
    assert len(llm.requests) == 2
    *_, shown_call, feedback = llm.requests[1]["messages"]
    assert shown_call is broken and feedback.error and feedback.id == "c1"
    assert "Error: not executed. Invalid call to update_task_status: argument 'status'" in feedback.content
    assert reply.usage == {"prompt_tokens": 30, "completion_tokens": 5} and reply.cost == pytest.approx(0.2)
    assert state.messages[-1] is reply and len(state.messages) == 2  # the discarded attempt stays out of the history
    assert state.h2_repairs == ["sent back: Invalid call to update_task_status: argument 'status' must be of type string, got bool True."]

    still_broken = call(msg, "update_task_status", {"task_id": "task_1", "status": "done"})
    agent, llm = make_agent(tpl, monkeypatch, broken, still_broken, h2_action_realization=True)
    reply, _ = agent.generate_next_message(user(msg, "Mark task_1 as completed."), agent.get_init_state())
    assert reply.tool_calls[0].arguments["status"] == "done" and len(llm.requests) == 2  # one retry only, then the environment answers


# ---- H3 environment contract ------------------------------------------------------------------


def test_h3_appends_contracts_to_what_the_model_sees_only(tpl, msg, monkeypatch):
    monkeypatch.setitem(tpl.TOOL_CONTRACTS, "create_task", "Create a task only after the user confirmed its title.")
    agent, llm = make_agent(tpl, monkeypatch, say(msg, "Hello."), h3_environment_contract=True)
    agent.generate_next_message(user(msg, "Hi"), agent.get_init_state())
    seen = {t.openai_schema["function"]["name"]: t.openai_schema["function"]["description"] for t in llm.requests[0]["tools"]}
    assert (
        seen["create_task"]
        == "Create a new task for a user.\n\n" + tpl.TOOL_CONTRACTS["*"] + "\n\nCreate a task only after the user confirmed its title."
    )
    assert seen["get_users"].endswith(tpl.TOOL_CONTRACTS["*"]) and "confirmed its title" not in seen["get_users"]
    assert {t.name: t.openai_schema["function"]["description"] for t in agent.tools}["create_task"] == "Create a new task for a user."


# ---- H4 trajectory regulation -----------------------------------------------------------------


def failing_loop(msg, times):
    messages = [user(msg, "Create a task for user_404.")]
    for i in range(times):
        messages += [
            call(msg, "create_task", {"user_id": "user_404", "title": "T"}, call_id=f"c{i}"),
            tool_result(msg, "Error: User user_404 not found", error=True, call_id=f"c{i}"),
        ]
    return messages


def test_h4_notes_repeats_and_error_streaks_then_stops_an_ignored_loop(tpl, msg, monkeypatch):
    agent, _ = make_agent(tpl, monkeypatch, h4_trajectory_regulation=True)
    state = agent.get_init_state()
    state.messages = failing_loop(msg, 1)
    assert agent.regulation_notes(state) == []
    again = call(msg, "create_task", {"title": "T", "user_id": "user_404"}, call_id="new")  # same call, other key order
    assert not agent.should_stop(again, state)
    state.messages = failing_loop(msg, 2)
    notes = agent.regulation_notes(state)
    assert any('create_task({"title": "T", "user_id": "user_404"}) 2 times and it failed every time' in n for n in notes)
    assert any("Your last 2 tool calls failed" in n for n in notes)
    assert agent.should_stop(again, state)
    assert not agent.should_stop(call(msg, "create_task", {"user_id": "user_1", "title": "T"}), state)
    agent.switches = tpl.HarnessSwitches()
    assert agent.guidance(state) == []


def test_h4_notes_stagnation_and_the_step_budget(tpl, msg, monkeypatch):
    agent, _ = make_agent(tpl, monkeypatch, h4_trajectory_regulation=True)
    state = agent.get_init_state()
    state.messages = [user(msg, "List everything.")]
    for i in range(tpl.H4_CALLS_WITHOUT_USER):
        state.messages += [call(msg, "get_users", {"page": i}, call_id=f"c{i}"), tool_result(msg, "[]", call_id=f"c{i}")]
    notes = agent.regulation_notes(state)
    assert any(f"{tpl.H4_CALLS_WITHOUT_USER} tool calls since the user last spoke" in n for n in notes)
    assert not any("steps remain" in n for n in notes)
    state.messages += [say(msg, "Still looking."), user(msg, "ok")] * ((tpl.H4_STEP_BUDGET - len(state.messages)) // 2)
    notes = agent.regulation_notes(state)
    assert any("steps remain before the conversation is cut off" in n for n in notes)
    assert any("last two messages to the user were identical" in n for n in notes)


# ---- H5 procedural skills ---------------------------------------------------------------------


def test_h5_retrieves_the_relevant_skill_and_leaves_the_irrelevant_out(tpl, msg, monkeypatch):
    shipped = tpl.load_skills(ROOT / "agent" / "templates" / "skills")
    assert tpl.retrieve_skills("Can I speak to a supervisor, please?", shipped, 2) == ["transfer-to-a-human"]
    assert tpl.retrieve_skills("Error: user not found", shipped, 1) == ["recover-from-tool-errors"]
    assert tpl.retrieve_skills("Nice weather today!", shipped, 2) == []

    skills = {
        "refund-rules": "# Refund rules\nUse when the customer wants a refund for a cancelled order.\n1. Check the order.",
        "seat-changes": "# Seat changes\nUse when the passenger wants another seat on the flight.\n1. Check the cabin.",
    }
    agent, llm = make_agent(tpl, monkeypatch, say(msg, "Sure."), h5_procedural_skills=True)
    agent.skills = skills
    _, state = agent.generate_next_message(user(msg, "I cancelled my order and want my money refunded."), agent.get_init_state())
    guidance = llm.requests[0]["messages"][-1]
    assert guidance.role == "system" and '<skill name="refund-rules">' in guidance.content and "seat-changes" not in guidance.content
    assert state.h5_skills == ["refund-rules"] and guidance not in state.messages


# ---- the layers' effects through real tau2 simulations ----------------------------------------


def switch(repo: Path, **layers: bool) -> None:
    (repo / "agent" / "harness.toml").write_text("".join(f"{k} = {str(layers.get(k, False)).lower()}\n" for k in LAYERS))


def result_of(summary: dict) -> dict:
    return json.loads(Path(summary["result_file"]).read_text())


def test_h2_raises_the_score_of_an_agent_that_writes_malformed_calls(repo):
    """The sloppy agent writes each first call malformed: as JSON text (create_task), with a
    boolean status (update_task_status), or to an unknown tool (transfer). Without H2 the text
    never executes and the boolean is stored silently; only the unknown tool recovers from the
    environment's error. With H2 all three are read, sent back or fixed before they execute."""
    off = eval_json(repo, "--agent-model", "scripted/sloppy", env=SCRIPT)
    switch(repo, h2_action_realization=True)
    on = eval_json(repo, "--agent-model", "scripted/sloppy", env=SCRIPT)
    assert off["avg_reward"] == pytest.approx(1 / 9)
    assert on["avg_reward"] == pytest.approx(8 / 9)  # the one task the competent mock agent fails too
    assert result_of(off)["harness"] == {layer: False for layer in LAYERS}
    assert result_of(on)["harness"] == {**{layer: False for layer in LAYERS}, "h2_action_realization": True}


def test_h4_stops_an_agent_that_repeats_a_failing_call(repo):
    off = result_of(eval_json(repo, "--agent-model", "scripted/stubborn", "--task-ids", "create_task_1", env=SCRIPT))["simulations"][0]
    switch(repo, h4_trajectory_regulation=True)
    on = result_of(eval_json(repo, "--agent-model", "scripted/stubborn", "--task-ids", "create_task_1", env=SCRIPT))["simulations"][0]
    assert (off["termination_reason"], off["steps"]) == ("too_many_errors", 22)  # ten failed calls
    # greeting, request, two failed calls and their errors, then the stop instead of a third attempt
    assert (on["termination_reason"], on["steps"]) == ("agent_stop", 7)


def test_h5_puts_the_relevant_skill_into_a_real_conversation(repo):
    skills = repo / "agent" / "skills"
    (skills / "removing-records.md").write_text(
        "# Removing records\nUse when the user wants to delete or remove records.\n1. Explain what can be removed.\n"
    )
    (skills / "flight-changes.md").write_text(
        "# Flight changes\nUse when the passenger wants to change a flight or a seat.\n1. Check the fare rules.\n"
    )
    switch(repo, h5_procedural_skills=True)
    summary = eval_json(repo, "--agent-model", "scripted/probe", "--task-ids", "impossible_task_1", "--max-steps", "3", env=SCRIPT)
    sim = result_of(summary)["simulations"][0]
    trajectory = json.loads((Path(summary["result_file"]).parent / sim["trajectory_file"]).read_text())
    seen = [m["content"] for m in trajectory["messages"] if m["role"] == "assistant" and m["content"].startswith("skills in context")]
    assert seen and "removing-records" in seen[0] and "flight-changes" not in seen[0]


def test_h4_counts_down_from_the_evaluations_own_step_limit(tpl, msg, monkeypatch):
    agent, _ = make_agent(tpl, monkeypatch, h4_trajectory_regulation=True)
    agent.max_steps = 12  # what evolver sets from --max-steps
    state = agent.get_init_state()
    state.messages = [user(msg, "Hi"), say(msg, "Hello."), user(msg, "ok"), say(msg, "Sure."), user(msg, "go on"), say(msg, "Yes.")]
    assert any("About 6 steps remain" in n for n in agent.regulation_notes(state))
    agent.max_steps = None  # not given: the fallback
    assert not any("steps remain" in n for n in agent.regulation_notes(state))
