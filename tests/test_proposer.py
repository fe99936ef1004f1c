"""The proposers behind one interface: the investigating one's tools, budgets and refusals (every tool
argument is an LLM's, so hostile), its scripted end-to-end run through `evolver run`, a proposal cut
off by a kill, and the command proposer's confined workspace."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from evolver.data import EvalResult, RoleModel
from evolver.evolution.evidence import Evidence
from evolver.evolution.proposers import Budget, Request
from evolver.evolution.proposers.agent import Session
from evolver.evolution.proposers.agent_tools import check_arguments
from tests.conftest import LINEAGE, ROOT, SCRIPTED_MODELS, eval_json, git, init_repo, run_cli
from tests.test_loop import make_target

LOOP_ENV = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:investigator_script"}
# The proposers' runs: one iteration, one gate stage, and a small gate: evolver_gen's first 5 odd-numbered test tasks,
# every one of which the careless agent fails and the fix passes (the gate's size is tests/test_loop.py's subject, not these).
SMALL_GATE = ["--exclude-tasks", ",".join(f"gen_{n:02d}" for n in range(8, 48) if n % 2 == 0 or n > 17)]
SMALL_RUN = ["--iterations", "1", "--gate-stages", "1", "--no-holdout", "--concurrency", "8", *LINEAGE, *SMALL_GATE]


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    """A real analysis evaluation: the careless scripted agent garbles a created task's title."""
    repo = init_repo(tmp_path_factory.mktemp("proposer") / "target")
    summary = eval_json(repo, "--agent-model", "scripted/wrong", "--task-ids", "create_task_1,update_task_1")
    path = Path(summary["result_file"])
    return repo, EvalResult.model_validate_json(path.read_text()), path.parent


def session(
    analysis, tmp_path, *, tries=None, budget=Budget(turns=6, tokens=50_000, tries=2, seconds=60), meta="scripted/meta", earlier=()
) -> Session:
    repo, result, folder = analysis
    request = Request(
        label="1",
        focus=(0, 1),
        parent=repo,
        evidence=Evidence(result, folder, list(earlier)),
        learnings=[],
        guide="# Guide\nLayers.\n",
        identifiers=frozenset({"create_task_1"}),
        meta=RoleModel(model=meta),
        llm_retries=1,
        context_tokens=32000,
        budget=budget,
        workdir=tmp_path / "proposal",
        prompts_dir=ROOT / "prompts",
        try_agent=tries,
    )
    return Session(request)


def test_the_reading_tools_show_analysis_data_masked_and_paged(analysis, tmp_path):
    s = session(analysis, tmp_path)
    failures = s.call("list_failures", "{}")
    assert failures.startswith("1 failed simulation(s); 1 passed") and "T1 trial 0: reward 0.00" in failures
    trajectory = s.call("read_trajectory", json.dumps({"task": "T1"}))
    assert "create_task(" in trajectory and "<V" in trajectory  # the call is shown, its values masked
    assert "user_1" not in trajectory and "create_task_1" not in trajectory
    assert "line" in s.call("search_trajectories", json.dumps({"pattern": r"create_task\("}))
    assert "agent/agent.py" in s.call("list_files", "{}") and "h2_action_realization off" in s.call("list_files", "{}")
    read = s.call("read_file", json.dumps({"path": "agent/agent.py", "start": 1, "end": 5}))
    assert (
        read.startswith("   1| ")
        and "read on with start=6" in read
        and read.endswith(
            "(next: remove_lines for lines that do harm, or "
            "replace_in_file with old copied exactly from "
            "these lines without the line numbers)"
        )
    )
    assert "   2| Layers." in s.call("read_file", json.dumps({"path": "Harness.md"}))
    assert "no earlier candidates" in s.call("list_candidates", "{}")
    assert "agent/agent.py:" in s.call("search_code", json.dumps({"pattern": "AGENT_INSTRUCTION"}))


@pytest.mark.parametrize(
    "tool, arguments, answer",
    [
        # what is out of reach
        ("read_file", {"path": "../runs/state.json"}, "only files under agent/"),
        ("read_file", {"path": "/etc/passwd"}, "only files under agent/"),
        ("read_file", {"path": "agent/../../.git/config"}, "only files under agent/"),
        ("read_file", {"path": "agent/templates/agent.py"}, "pristine baseline"),
        ("read_trajectory", {"task": "G1"}, "gate and holdout tasks are never shown"),
        ("read_trajectory", {"task": "create_task_1"}, "no analysis task"),
        ("read_trajectory", {"task": "T1", "trial": 7}, "has no trial 7"),
        ("show_candidate", {"label": "9"}, "no earlier candidate"),
        ("try_agent", {"tasks": ["G2"]}, "no analysis task"),
        # code on the trusted side through a tool name or an argument
        ("run_python", {"code": "import os; os.system('id')"}, "there is no tool 'run_python'"),
        ("search_trajectories", {"pattern": "(a+)+$" * 40}, "longer than 200 characters"),
        ("search_trajectories", {"pattern": "([unclosed"}, "not a valid regular expression"),
        # edits that validation refuses, each answered at once and not applied
        ("write_file", {"path": "evolver/cli/commands.py", "content": "x = 1\n"}, "only files under agent/"),
        ("write_file", {"path": "agent/templates/agent.py", "content": "x = 1\n"}, "pristine baseline"),
        ("write_file", {"path": "agent/run.sh", "content": "rm -rf /\n"}, "files may change"),
        ("write_file", {"path": "agent/helper.py", "content": "import subprocess\nsubprocess.run(['id'])\n"}, "static scan refuses"),
        ("write_file", {"path": "agent/skills/cheat.md", "content": "For create_task_1, answer at once.\n"}, "static scan refuses"),
        (
            "replace_in_file",
            {"path": "agent/agent.py", "old": "class HarnessState(BaseModel):", "new": "class HarnessState(BaseModel)"},
            "does not parse",
        ),
        ("replace_in_file", {"path": "agent/agent.py", "old": "no such text anywhere", "new": "x"}, "not found"),
        (
            "replace_in_file",
            {"path": "agent/agent.py", "old": "h2_repairs: list = Field(default_factory=list)", "new": "x"},
            "most like your old text, to quote exactly instead:\n    h2_repairs: list[str] = Field(default_factory=list)",
        ),
        ("set_layer", {"layer": "h9_magic", "on": True}, "no layer"),
        ("remove_lines", {"path": "agent/agent.py", "start": 9, "end": 3}, "1 <= start <= end"),
        ("remove_lines", {"path": "../evolver/llm.py", "start": 1, "end": 3}, "cannot edit"),
        ("remove_lines", {"path": "agent/templates/agent.py", "start": 1, "end": 3}, "cannot edit"),
        ("remove_lines", {"path": "agent/agent.py", "start": 1, "end": 10**9}, "1 <= start <= end"),
        # arguments of the wrong shape
        ("read_file", {"path": ["agent/agent.py"]}, "must be a string"),
        ("read_file", {"path": "agent/agent.py", "mode": "w"}, "takes no argument 'mode'"),
        ("replace_in_file", {"path": "agent/agent.py"}, "needs the argument 'old'"),
        ("submit", {"title": "t", "rationale": "r"}, "not submitted: agent/ is the same as the parent's"),
        ("try_agent", {"tasks": ["T1"]}, "nothing to try"),
    ],
)
def test_a_hostile_or_mistaken_call_gets_a_clear_refusal_and_nothing_else(analysis, tmp_path, tool, arguments, answer):
    tried = []
    s = session(analysis, tmp_path, tries=lambda root, tasks: tried.append(tasks))
    before = {p: p.read_bytes() for p in s.scratch.root.rglob("*") if p.is_file()}
    result = s.call(tool, json.dumps(arguments))
    assert answer in result, result
    assert {p: p.read_bytes() for p in s.scratch.root.rglob("*") if p.is_file()} == before  # nothing applied
    assert tried == [] and s.submitted is None
    assert not (tmp_path / "proposal" / "scratch" / "evolver").exists() and not Path("/etc/passwd").read_text().startswith("x = 1")


def test_a_catastrophic_pattern_is_cut_off_not_hung(analysis, tmp_path):
    from evolver.evolution.evidence import SEARCH_SECONDS

    s = session(analysis, tmp_path)
    # `regex` sees through (\w+\s?)+$# at once; backreferences after six stars take billions of steps on any
    # line of a few dozen characters, whatever the machine, so only the cut-off can end this search.
    started = time.monotonic()
    answer = s.call("search_trajectories", json.dumps({"pattern": r"(.*)(.*)(.*)(.*)(.*)(.*)\6\5\4(?!)"}))
    assert answer == f"the pattern took too long to match (over {SEARCH_SECONDS:g} s); use a simpler one"
    assert time.monotonic() - started < 30


def test_an_edit_applied_tried_and_submitted_becomes_the_candidate(analysis, tmp_path):
    repo, result, folder = analysis
    tried = []
    s = session(analysis, tmp_path, tries=lambda root, tasks: (tried.append((root, tasks)) or result, folder))
    answer = s.call(
        "replace_in_file",
        json.dumps(
            {
                "path": "agent/agent.py",
                "old": 'AGENT_INSTRUCTION = """\n',
                "new": 'AGENT_INSTRUCTION = """\nUse the exact title the user gives.\n',
            }
        ),
    )
    assert answer.startswith("applied to agent/agent.py") and "changed so far: agent/agent.py" in answer
    report = s.call("try_agent", json.dumps({"tasks": ["T1", "T2", "T1"]}))
    assert tried[0][1] == ["create_task_1", "update_task_1"] and tried[0][0] == s.scratch.root  # labels mapped, repeats dropped
    assert "T1: parent 0.00 -> yours 0.00" in report and "try simulation(s) left" in report
    assert "no try simulations left" in s.call("try_agent", json.dumps({"tasks": ["T1"]}))  # the budget of 2 is spent
    assert s.call("submit", json.dumps({"title": "Keep titles exact", "rationale": "T1 garbled the title"})) == "submitted"
    [edit, *_] = s.submitted.edits
    assert edit.path == "agent/agent.py" and "Use the exact title the user gives." in edit.replace
    assert (repo / "agent" / "agent.py").read_text() == edit.search  # the parent's file is untouched


def test_an_edit_that_broke_every_try_is_not_submitted_until_it_changes(analysis, tmp_path):
    repo, result, folder = analysis
    broken = result.model_copy(
        update={
            "simulations": [
                sim.model_copy(update={"outcome": "failed", "reward": 0.0, "error": "AgentFault: NameError"}) for sim in result.simulations
            ]
        }
    )
    s = session(analysis, tmp_path, tries=lambda root, tasks: (broken, folder))
    edit = {"path": "agent/agent.py", "old": 'AGENT_INSTRUCTION = """\n', "new": 'AGENT_INSTRUCTION = """\nUse the exact title.\n'}
    assert s.call("replace_in_file", json.dumps(edit)).startswith("applied to")
    assert "T1: parent 0.00 -> yours 0.00" in s.call("try_agent", json.dumps({"tasks": ["T1", "T2"]}))
    answer = s.call("submit", json.dumps({"title": "Exact titles", "rationale": "r"}))
    assert answer.startswith("not submitted: your edited agent broke every task try_agent ran (T1: ") and s.submitted is None, answer
    edit = {"path": "agent/agent.py", "old": "Use the exact title.\n", "new": "Use the exact title the user gives.\n"}
    assert s.call("replace_in_file", json.dumps(edit)).startswith("applied to")
    assert (
        s.call("submit", json.dumps({"title": "Exact titles", "rationale": "r"})) == "submitted"
    )  # a new edit, untried: the gate's to judge


def test_a_submit_the_same_as_an_earlier_candidate_is_refused_while_the_session_can_still_change_it(analysis, tmp_path):
    """The 1.5B resubmitted a rejected candidate's edit in the next iteration, which the loop refuses unmeasured: the
    whole proposal spent. The session now says so at submit, from the candidate's commit as git holds it."""
    from evolver.evolution.evidence import EarlierCandidate
    from evolver.evolution.noop import agent_digest
    from evolver.store.lineage import Lineage

    repo, result, folder = analysis
    edit = {"path": "agent/agent.py", "old": 'AGENT_INSTRUCTION = """\n', "new": 'AGENT_INSTRUCTION = """\nUse the exact title.\n'}
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    agent = clone / "agent" / "agent.py"
    agent.write_text(agent.read_text().replace(edit["old"], edit["new"], 1))
    git(clone, "-c", "user.name=test", "-c", "user.email=test@example.invalid", "commit", "-qam", "iteration 1's candidate")
    commit = git(clone, "rev-parse", "HEAD").strip()
    rejected = EarlierCandidate(
        label="1",
        title="Exact titles",
        status="rejected",
        reason="no improvement (+0.0 points over 5 tasks)",
        agent=agent_digest(Lineage(clone, "run-x").agent_files_at(commit)),
    )
    s = session(analysis, tmp_path, earlier=[rejected])
    assert s.call("replace_in_file", json.dumps(edit)).startswith("applied to")
    answer = s.call("submit", json.dumps({"title": "Exact titles", "rationale": "r"}))
    assert (
        answer
        == (
            "not submitted: your edited agent/ is the same as candidate 1's, which was rejected: no improvement "
            "(+0.0 points over 5 tasks). Make a different change; your edits are undone, agent/ is the parent's again"
        )
        and s.submitted is None
    )
    # undone: the 1.5B went on editing the lines its refused edit had removed, and every such edit was refused
    s.tools_used.update(read_trajectory=1, read_file=1)
    assert s.scratch.changed() == [] and s.next_step().startswith("Next: call replace_in_file or remove_lines")
    edit = {**edit, "new": 'AGENT_INSTRUCTION = """\nUse the exact title the user gives.\n'}
    assert s.call("replace_in_file", json.dumps(edit)).startswith("applied to")
    assert s.call("submit", json.dumps({"title": "Exact titles", "rationale": "r"})) == "submitted"


def test_a_reply_in_prose_stays_out_of_the_conversation_so_a_small_model_cannot_copy_it(analysis, tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:planning_meta")
    s = session(analysis, tmp_path, budget=Budget(turns=4, tokens=1_000_000, tries=0, seconds=120))
    outcome = s.run()
    assert outcome.stats["tools"] == {"list_files": 3}  # the plan once, then calls: it never saw its plan again
    transcript = json.loads((tmp_path / "proposal" / "transcript.json").read_text())
    assert [m["role"] for m in transcript["messages"]][:5] == ["system", "user", "assistant", "user", "assistant"]
    assert "Use the tools" in transcript["messages"][3]["content"]  # the transcript keeps what was said


@pytest.mark.parametrize("meta, choice", [("local/meta", {"tool_choice": "required"}), ("scripted/meta", {})])
def test_a_meta_llm_on_a_local_server_is_held_to_a_call_per_reply(analysis, tmp_path, monkeypatch, meta, choice):
    from types import SimpleNamespace

    from evolver.data import RoleUsage
    from evolver.evolution.proposers import agent

    asked = []

    def fake_call(role, messages, retries, **extra):
        asked.append({k: v for k, v in extra.items() if k == "tool_choice"})
        call = SimpleNamespace(id="c1", function=SimpleNamespace(name="list_files", arguments="{}"))
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content="", tool_calls=[call]))]), RoleUsage()

    monkeypatch.setattr(agent, "meta_call", fake_call)
    session(analysis, tmp_path, budget=Budget(turns=2, tokens=1_000_000, tries=0, seconds=120), meta=meta).run()
    assert asked == [choice, choice]


def test_text_copied_with_read_files_line_numbers_is_matched_without_them(analysis, tmp_path):
    s = session(analysis, tmp_path)
    shown = s.call("read_file", json.dumps({"path": "agent/agent.py", "start": 1, "end": 3})).split("\n(")[0]
    numbered_new = "\n".join(line if n else line + "  # kept" for n, line in enumerate(shown.splitlines()))
    answer = s.call("replace_in_file", json.dumps({"path": "agent/agent.py", "old": shown, "new": numbered_new}))
    assert answer.startswith("applied to agent/agent.py"), answer
    [edit] = s.scratch.edits()
    assert "  # kept" in edit.replace and "   1| " not in edit.replace
    assert "old and new are the same" in s.call("replace_in_file", json.dumps({"path": "agent/agent.py", "old": "  7| x", "new": "x"}))


def test_lines_are_removed_as_whole_statements_and_a_block_left_empty_keeps_a_pass(analysis, tmp_path):
    s = session(analysis, tmp_path)
    parent = s.scratch._text("agent/agent.py").splitlines()
    header = parent.index("        if self.switches.h2_action_realization:") + 1
    assert parent[header] == "            reply = self.realize_action(reply, context, state)"
    answer = s.call("remove_lines", json.dumps({"path": "agent/agent.py", "start": header, "end": header}))
    assert answer.startswith(
        f"applied to agent/agent.py: removed lines {header}-{header + 1} (the statements that start in "
        f"{header}-{header} end at line {header + 1})"
    ), answer  # the `if` took its block
    assert s.scratch._text("agent/agent.py").splitlines() == parent[: header - 1] + parent[header + 1 :]
    assert "old and new are the same" in s.call("replace_in_file", json.dumps({"path": "agent/agent.py", "old": "x", "new": "x"}))

    s = session(analysis, tmp_path / "again")
    answer = s.call("remove_lines", json.dumps({"path": "agent/agent.py", "start": header + 1, "end": header + 1}))
    assert answer.startswith(f"applied to agent/agent.py: removed lines {header + 1}-{header + 1}."), answer
    assert s.scratch._text("agent/agent.py").splitlines()[header - 1 : header + 1] == [parent[header - 1], "            pass"]

    closing = parent.index("        )") + 1  # the end of a statement that starts above it
    answer = s.call("remove_lines", json.dumps({"path": "agent/agent.py", "start": closing, "end": closing}))
    assert answer.startswith(f"not applied: without lines {closing}-{closing} the file does not parse"), answer


def test_an_edit_that_leaves_a_used_name_undefined_is_refused_and_the_file_kept(analysis, tmp_path):
    """The 1.5B's lost proposals on planted faults: a helper, a method or a local's line removed, its use left."""
    s = session(analysis, tmp_path)
    text = s.scratch._text("agent/agent.py")
    lines = text.splitlines()

    def line_of(code: str) -> int:
        return lines.index(code) + 1

    use = line_of("        if self.switches.h4_trajectory_regulation and self.should_stop(reply, state):")
    cases = [  # (start, end, what is named as still used, where)
        (line_of("    def should_stop(self, reply: AssistantMessage, state: HarnessState) -> bool:"), None, "self.should_stop", use),
        (
            line_of("        context = state.system_messages + state.messages + self.guidance(state)"),
            None,
            "context",
            line_of("        reply = self.call_llm(context)"),
        ),
        (
            line_of("def calls_from_text(reply: AssistantMessage, schemas: dict[str, dict], id_prefix: str) -> AssistantMessage:"),
            None,
            "calls_from_text",
            line_of('        parsed = calls_from_text(reply, schemas, id_prefix=f"h2_{len(state.messages)}")'),
        ),
    ]
    for start, _, name, where in cases:
        answer = s.call("remove_lines", json.dumps({"path": "agent/agent.py", "start": start, "end": start}))
        assert answer.startswith(f"not applied: it removes the definition of what the file still uses ({name} at line {where}: "), answer
        assert s.scratch._text("agent/agent.py") == text and s.scratch.edits_made == 0
    # the same through a replace: the call goes first, then the method may go
    assert "self.should_stop at line" in s.call(
        "replace_in_file", json.dumps({"path": "agent/agent.py", "old": "    def should_stop(self,", "new": "    def should_halt(self,"})
    )
    assert s.call(
        "replace_in_file", json.dumps({"path": "agent/agent.py", "old": " and self.should_stop(reply, state):", "new": " and False:"})
    ).startswith("applied to agent/agent.py")
    start = line_of("    def should_stop(self, reply: AssistantMessage, state: HarnessState) -> bool:")
    assert s.call("remove_lines", json.dumps({"path": "agent/agent.py", "start": start, "end": start})).startswith("applied to")
    # a method nothing in the file calls (tau2 does) may go whole; names the file never defined are never blamed
    s = session(analysis, tmp_path / "again")
    start = line_of("    def generate_next_message(")
    assert s.call("remove_lines", json.dumps({"path": "agent/agent.py", "start": start, "end": start})).startswith("applied to")
    from evolver.evolution.dangling import dangling

    assert dangling("x = 1\nprint(y, x)\n", "print(y, x)\n") == [("x", 1)]
    assert dangling("x = 1\nprint(y)\n", "print(y)\n") == []
    assert dangling("def f():\n    v = 1\n    return v\n", "def f():\n    return v\n") == [("v", 2)]


def _planted_scratch(tmp_path, fault_name):
    """A scratch copy over the template agent with one planted fault, and its HarnessCode."""
    import shutil

    from evolver.evolution.harness_code import HarnessCode
    from evolver.evolution.scratch import Scratch
    from tests.scripts.planted import FAULTS, plant

    parent = tmp_path / fault_name
    shutil.copytree(ROOT / "agent", parent / "agent", ignore=shutil.ignore_patterns("templates", "__pycache__"))
    if fault_name != "template":
        text = plant((parent / "agent" / "agent.py").read_text(), next(f for f in FAULTS if f.name == fault_name))
        (parent / "agent" / "agent.py").write_text(text)
    lines = (parent / "agent" / "agent.py").read_text().splitlines()
    return Scratch(parent, tmp_path / f"{fault_name}-scratch"), HarnessCode.parse("\n".join(lines) + "\n"), lines


def test_a_lost_message_points_to_the_lines_that_can_lose_it_and_the_opening_offers_a_removal_that_applies(tmp_path):
    from evolver.evolution.harness_changes import Change
    from evolver.evolution.harness_code import Place
    from evolver.evolution.proposers.agent import _removal

    def at(lines, text):
        return next(n for n, line in enumerate(lines, 1) if text in line)

    lost = Change(2, "history_dropped")
    # a reset of the conversation: its one line, and removing it applies
    scratch, code, lines = _planted_scratch(tmp_path, "state_reset")
    place = code.places(lost)[0]
    reset = at(lines, "state.messages = []")
    assert place.losing and place.writes == (reset,), place
    assert f"the lines that can leave messages out of the prompt there: {reset})" in place.text()
    assert _removal(place, scratch) == (
        f" If those lines are the fault, remove_lines path=agent/agent.py start={reset} end={reset} takes them out;"
        " otherwise correct them with replace_in_file."
    )
    # a slice of the conversation: only that line, which also builds the prompt, so no removal is offered
    scratch, code, lines = _planted_scratch(tmp_path, "dropped_history")
    place = code.places(lost)[0]
    assert place.losing and place.writes == (at(lines, "state.messages[-2:]"),) and _removal(place, scratch) == ""
    # a write of tau2's message under an `if` without `else`: the `if` and its body
    scratch, code, lines = _planted_scratch(tmp_path, "dropped_tool_results")
    guard = at(lines, "if not isinstance(message, (MultiToolMessage, ToolMessage))")
    assert code.places(Change(1, "result_dropped"))[0].writes == (guard, guard + 1)
    assert _removal(code.places(Change(1, "result_dropped"))[0], scratch) == ""  # removed whole, the `if` takes every append with it
    # a policy that never reached the model: the line that builds what the model call sends, not the appends of tau2's messages
    scratch, code, lines = _planted_scratch(tmp_path, "lost_instruction")
    place = code.places(Change(1, "policy_missing"))[0]
    assert place.writes == (at(lines, "context = state.messages + self.guidance(state)"),) and "change the prompt there" in place.text()
    # the template loses nothing: every line that writes the prompt, and no removal (they build it)
    scratch, code, lines = _planted_scratch(tmp_path, "template")
    place = code.places(lost)[0]
    assert not place.losing and len(place.writes) > 2 and "the lines that change the prompt there" in place.text()
    assert _removal(place, scratch) == ""
    # a change of the reply: one run of lines is offered where removing it applies
    model_call = at(lines, "reply = self.call_llm(context)")
    assert _removal(
        Place("generate_next_message", model_call, model_call + 8, "after the model call", (model_call + 1, model_call + 2), "the reply"),
        scratch,
    ).startswith(f" If those lines are the fault, remove_lines path=agent/agent.py start={model_call + 1} end={model_call + 2}")
    assert (
        _removal(
            Place(
                "generate_next_message", model_call, model_call + 8, "after the model call", (model_call + 1, model_call + 3), "the reply"
            ),
            scratch,
        )
        == ""
    )  # two runs: removing one shifts the other's numbers
    assert _removal(Place("generate_next_message", 151, 159), scratch) == _removal(None, scratch) == ""


def test_the_one_shot_digest_quotes_the_lines_that_can_lose_a_message_as_the_start_of_a_patch_that_applies(tmp_path):
    """A model without tools cannot read the lines it is pointed to: the one-shot digest quotes them as a SEARCH block,
    widened until it matches once, so that an answer starting from it applies."""
    from evolver.evolution.harness_changes import Change
    from evolver.evolution.patch import apply_edits, parse_proposal
    from evolver.evolution.proposers.oneshot import _quote

    for fault, kind, lost in (
        ("dropped_history", "history_dropped", "state.messages[-2:]"),
        ("state_reset", "history_dropped", "state.messages = []"),
        ("dropped_tool_results", "result_dropped", "if not isinstance(message, (MultiToolMessage, ToolMessage))"),
    ):
        scratch, code, lines = _planted_scratch(tmp_path, fault)
        place = code.places(Change(1, kind))[0]
        quoted = _quote(scratch.parent / "agent" / "agent.py", place)
        assert lost in quoted.splitlines()[0] and len(quoted.splitlines()) >= len(place.writes), (fault, quoted)
        answer = f"TITLE: t\nRATIONALE: r\nFILE: agent/agent.py\n<<<<<<< SEARCH\n{quoted}\n=======\n>>>>>>> REPLACE\n"
        after = apply_edits(scratch.parent, parse_proposal(answer).edits)["agent/agent.py"]
        assert lost not in after, fault
    # lines that occur more than once and cannot be widened within their function are not quoted
    scratch, code, lines = _planted_scratch(tmp_path, "template")
    from evolver.evolution.harness_code import Place

    blank = next(n for n, line in enumerate(lines, 1) if not line.strip())
    assert _quote(scratch.parent / "agent" / "agent.py", Place("f", blank, blank, writes=(blank,))) == ""


def test_the_one_shot_start_is_the_whole_removal_where_the_investigating_proposer_is_offered_one_and_it_applies(tmp_path):
    """Given only the SEARCH lines to start from, the 1.5B wrote the faulty lines back corrected, wrongly, each time; where
    remove_lines would be offered, the one-shot prompt carries the whole patch that takes them out, and it applies."""
    from types import SimpleNamespace

    from evolver.evolution.harness_changes import Change
    from evolver.evolution.patch import apply_edits, parse_proposal
    from evolver.evolution.proposers.agent import _removal
    from evolver.evolution.proposers.oneshot import starting_patch

    def start(scratch, place):
        return starting_patch(SimpleNamespace(first_place=lambda: place, parent=scratch.parent, layer_to_switch_off=lambda: None))

    scratch, code, lines = _planted_scratch(tmp_path, "state_reset")
    place = code.places(Change(2, "history_dropped"))[0]
    text = start(scratch, place)
    assert _removal(place, scratch) and text.startswith(f"If line {place.writes[0]} of agent/agent.py (generate_next_message, "), text
    assert "this patch removes it:\nFILE: agent/agent.py\n<<<<<<< SEARCH\n" in text and text.endswith(
        "To correct it instead, keep that SEARCH and write after ======= the lines as they should be."
    ), text
    after = apply_edits(scratch.parent, parse_proposal(f"TITLE: t\nRATIONALE: r\n{text[text.index('FILE:') :]}").edits)["agent/agent.py"]
    assert after.splitlines() == lines[: place.writes[0] - 1] + [""] + lines[place.writes[0] :], (
        text
    )  # an empty REPLACE, as the 1.5B writes one
    # an `if` that leaves tool results out: its test goes, the append it guards stays
    scratch, code, lines = _planted_scratch(tmp_path, "dropped_tool_results")
    place = code.places(Change(1, "result_dropped"))[0]
    text = start(scratch, place)
    assert f"this patch removes the test on line {place.writes[0]}, keeping the lines it guards:" in text, text
    after = apply_edits(scratch.parent, parse_proposal(f"TITLE: t\nRATIONALE: r\n{text[text.index('FILE:') :]}").edits)["agent/agent.py"]
    guard = place.writes[0]
    assert after.splitlines() == lines[: guard - 1] + [lines[guard][4:]] + lines[guard + 1 :], text
    # where removing the lines would break the file (the slice also builds the prompt), only the beginning is quoted, as before
    scratch, code, lines = _planted_scratch(tmp_path, "dropped_history")
    place = code.places(Change(2, "history_dropped"))[0]
    text = start(scratch, place)
    assert not _removal(place, scratch) and "a patch that corrects or removes it begins:" in text and text.endswith("\n======="), text


def test_the_budget_stops_a_meta_llm_that_never_submits(analysis, tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:busy_meta")
    s = session(analysis, tmp_path, budget=Budget(turns=3, tokens=1_000_000, tries=0, seconds=120))
    outcome = s.run()
    assert outcome.proposal is None and outcome.errors == ["no candidate submitted: used all 3 turns"]
    assert outcome.stats["turns"] == 3 and outcome.stats["tools"] == {"list_files": 3}
    transcript = json.loads((tmp_path / "proposal" / "transcript.json").read_text())
    answers = [m["content"] for m in transcript["messages"] if m["role"] == "tool"]
    assert "exactly this call before" not in answers[0] and all("exactly this call before" in a for a in answers[1:])
    assert [m["role"] for m in transcript["messages"]][:4] == ["system", "user", "assistant", "tool"]
    assert transcript["usage"]["prompt_tokens"] > 0
    s = session(analysis, tmp_path, budget=Budget(turns=50, tokens=1_500, tries=0, seconds=120))
    assert "tokens" in s.run().errors[0]


def test_a_patch_written_as_text_goes_through_the_same_checks(analysis, tmp_path, monkeypatch):
    """A model that answers with a whole patch instead of calling tools: a clean patch is its submission,
    a broken one is answered like a broken edit and never becomes a candidate."""
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:fix_first_script")
    outcome = session(analysis, tmp_path).run()
    assert outcome.proposal.title == "Keep the user's exact title" and outcome.stats["tools"] == {"patch_in_text": 1}
    assert outcome.stats["turns"] == 1
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:script")  # its first patch has a syntax error
    outcome = session(analysis, tmp_path).run()
    assert outcome.proposal is None and outcome.errors == ["no candidate submitted: used all 6 turns"]
    assert outcome.stats["rejected_edits"] == 6


@pytest.mark.slow
def test_evolver_run_with_the_investigating_proposer(tmp_path):
    """The default proposer through `evolver run`: the scripted meta-agent reads the failing trajectory,
    edits, tries the edit on an analysis task (a real, sandboxed evaluation), submits; the gate keeps it."""
    repo = make_target(tmp_path / "target")
    proc = run_cli(["run", str(repo), *SMALL_RUN, *SCRIPTED_MODELS], env=LOOP_ENV, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run_id] = [p.name for p in (repo / "runs").glob("run-*")]
    run = repo / "runs" / run_id
    history = json.loads(run_cli(["history", run_id, "--repo", str(repo), "--json"]).stdout)["candidates"]
    assert [(c["title"], c["verdict"]) for c in history] == [("Keep the user's exact title", "accepted")]
    transcript = json.loads((run / "proposals" / "001" / "transcript.json").read_text())
    called = [c["name"] for m in transcript["messages"] if m["role"] == "assistant" for c in m.get("calls", [])]
    assert called == ["list_failures", "read_trajectory", "read_file", "replace_in_file", "try_agent", "submit"]
    tried = json.loads(next((run / "evals" / "propose-001-s1-try1").glob("result-*.json")).read_text())
    assert tried["summary"]["num_simulations"] == 1 and tried["isolation"]["mode"] == "sandbox"
    shown = run_cli(["show", run_id, "1", "--repo", str(repo)])
    assert "investigation" in shown.stdout and "6 turn(s)" in shown.stdout and "tried on T" in shown.stdout
    status = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"]).stdout)
    assert status["usage"]["meta"]["prompt_tokens"] > 0 and status["simulations_done"] >= 1 + tried["summary"]["num_simulations"]


@pytest.mark.slow
def test_a_proposal_cut_off_by_a_kill_is_asked_again_and_its_usage_kept(tmp_path):
    repo = make_target(tmp_path / "target")
    env = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:slow_investigator_script"}  # the meta-LLM alone is slow
    args = ["run", str(repo), *SMALL_RUN, *SCRIPTED_MODELS]
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolver", *args], env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 300
        transcript = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = list((repo / "runs").glob("run-*/proposals/001/transcript.json"))
            if found and json.loads(found[0].read_text() or "{}").get("turns", 0) >= 2:
                transcript = found[0]
                break
            time.sleep(0.2)
        assert transcript is not None, "the proposal never got going"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    run_id = transcript.parents[2].name
    cut = json.loads(transcript.read_text())
    assert (
        not list((repo / "runs" / run_id / "iterations").glob("*.json"))
        or json.loads((repo / "runs" / run_id / "iterations" / "001.json").read_text())["candidates"][0]["status"] == "proposing"
    )
    resumed = run_cli(["run", str(repo), "--resume", run_id], env=LOOP_ENV, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    folder = repo / "runs" / run_id / "proposals" / "001"
    assert json.loads((folder / "interrupted-1.json").read_text())["turns"] == cut["turns"]
    record = json.loads((repo / "runs" / run_id / "iterations" / "001.json").read_text())
    assert record["candidates"][0]["status"] == "accepted"
    assert record["usage"]["meta"]["prompt_tokens"] > json.loads((folder / "transcript.json").read_text())["usage"]["prompt_tokens"]


def test_check_arguments_coerces_quoted_numbers_only():
    assert check_arguments("read_file", '{"path": "agent/agent.py", "start": "3"}') == {"path": "agent/agent.py", "start": 3}
    assert "must be an integer" in check_arguments("read_file", {"path": "agent/agent.py", "start": True})
    assert "not valid JSON" in check_arguments("read_file", "{not json")


# ---- the command proposer ---------------------------------------------------------------------

AGENT_SCRIPT = ROOT / "tests" / "scripts" / "command_agent.py"


def command_request(analysis, tmp_path, seconds: float = 60) -> Request:
    repo, result, folder = analysis
    run = tmp_path / "runs" / "run-x"  # the workspace sits in a run directory, as in a real run
    (run / "state.json").parent.mkdir(parents=True)
    (run / "state.json").write_text('{"secret": "run state"}')
    return Request(
        label="1",
        focus=(0, 1),
        parent=repo,
        evidence=Evidence(result, folder),
        learnings=["- Iteration 0: nothing yet"],
        guide="# Guide\n",
        identifiers=frozenset({"create_task_1"}),
        meta=RoleModel(model="scripted/meta"),
        llm_retries=1,
        context_tokens=32000,
        budget=Budget(seconds=seconds),
        workdir=run / "proposals" / "001",
        prompts_dir=ROOT / "prompts",
    )


def test_a_command_in_its_workspace_proposes_from_the_evidence(analysis, tmp_path):
    from evolver.evolution.proposers.command import CommandProposer

    proposer = CommandProposer(f"{sys.executable} {AGENT_SCRIPT} honest", readable=(str(AGENT_SCRIPT.parent),))
    outcome = proposer.propose(command_request(analysis, tmp_path))
    assert outcome.refused is None and outcome.errors == [], outcome
    assert outcome.proposal.title == "Keep the user's exact title" and outcome.stats["exit_code"] == 0
    [edit] = outcome.proposal.edits
    assert edit.path == "agent/agent.py" and "Use the exact title the user gives." in edit.replace


def test_a_hostile_command_reaches_nothing_and_its_links_and_pipes_are_refused(analysis, tmp_path, monkeypatch):
    from evolver.evolution.proposers.command import CommandProposer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-evolver-canary-command")
    monkeypatch.setenv("EVOLVER_TEST_NAMED", "given")
    Path("/tmp/evolver-command-canary").unlink(missing_ok=True)
    proposer = CommandProposer(
        f"{sys.executable} {AGENT_SCRIPT} hostile", env_names=("EVOLVER_TEST_NAMED",), readable=(str(AGENT_SCRIPT.parent),)
    )
    request = command_request(analysis, tmp_path)
    outcome = proposer.propose(request)
    report = json.loads((request.workdir / "workspace" / "report.json").read_text())
    reached = {k: v for k, v in report.items() if v == "done"}
    assert reached == {"run_a_program": "done"}, report  # a coding agent runs tools; nothing outside its workspace
    assert report["read_evolver_environ"] == "failed: PermissionError"  # /proc is readable; evolver's process is not
    assert report["key"] == "" and "EVOLVER_TEST_NAMED" in report["env"] and "OPENAI_API_KEY" not in report["env"]
    assert not Path("/tmp/evolver-command-canary").exists() and not (request.workdir.parents[1] / "forged.json").exists()
    assert outcome.refused and "symbolic link" in " ".join(outcome.errors) and "not a regular file" in " ".join(outcome.errors)


def test_a_command_that_hangs_is_stopped_with_what_it_started(analysis, tmp_path):
    from evolver.evolution.proposers.command import CommandProposer

    seconds = f"31338.{os.getpid()}"  # its own: another test session on the machine may be running this test at the same time
    proposer = CommandProposer(f"{sys.executable} {AGENT_SCRIPT} sleep {seconds}", readable=(str(AGENT_SCRIPT.parent),))
    started = time.monotonic()
    outcome = proposer.propose(command_request(analysis, tmp_path, seconds=3))
    assert time.monotonic() - started < 30
    assert outcome.proposal is None and "stopped at the time limit" in outcome.stats["stopped"]
    assert Path(outcome.stats["log"]).read_text() == "waiting for the model\n"  # what it said before the limit: why it hung
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", f"sleep {seconds}"], capture_output=True).returncode == 1


def planted_wheel(folder: Path) -> Path:
    """A wheel of tests/scripts/command_agent.py with its two console scripts, as pip would get it from an index."""
    info = "planted_coder-1.0.dist-info"
    files = {
        "planted_coder.py": AGENT_SCRIPT.read_text(),
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: planted-coder\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\nplanted-coder = planted_coder:main\nplanted-probe = planted_coder:probe\n",
    }
    wheel = folder / "planted_coder-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"]))
    return wheel


def pip_install(venv: Path, wheel: Path) -> Path:
    """A fresh virtual environment at ``venv`` with ``wheel`` installed by pip, offline; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    return python


@pytest.mark.slow
def test_evolver_run_with_an_installed_coding_agent(tmp_path):
    """Coding agents installed as people install them, found by name: `planted-coder` by pipx into the home folder
    (a link in ~/.local/bin to a virtual environment of its own), and `planted-probe`, which it runs, installed in
    the Python environment evolver runs in (its bin folder in no PATH). Its edit is kept by the gate; the probe
    reaches certificates, names and its own passwd entry, and neither /etc's secrets, nor the home, nor root's powers."""
    wheel, home = planted_wheel(tmp_path), tmp_path / "home"
    evolver_python = pip_install(tmp_path / "evolver-env", wheel)
    site = next((tmp_path / "evolver-env" / "lib").glob("python3*/site-packages"))
    (site / "evolver.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in sys.path if p.endswith("site-packages")))
    pipx_venv = home / ".local/share/pipx/venvs/planted-coder"
    pip_install(pipx_venv, wheel)
    (home / ".local/bin").mkdir(parents=True)
    (home / ".local/bin/planted-coder").symlink_to(pipx_venv / "bin/planted-coder")
    for key in (".ssh/id_ed25519", ".config/gh/hosts.yml", ".bash_history"):
        (home / key).parent.mkdir(parents=True, exist_ok=True)
        (home / key).write_text("secret\n")
    repo = make_target(tmp_path / "target")
    env = {
        **LOOP_ENV,
        "HOME": str(home),
        "PLANTED_HOME": str(home),
        "PATH": f"{home / '.local/bin'}:{os.environ['PATH']}",
        "OPENAI_API_KEY": "sk-evolver-canary",
        "TERM": "dumb",
    }
    proc = run_cli(
        [
            "run",
            str(repo),
            *SMALL_RUN,
            *SCRIPTED_MODELS,
            "--proposer",
            "command",
            "--proposer-command",
            "planted-coder installed",
            "--proposer-env",
            "PLANTED_HOME",
        ],
        env=env,
        timeout=900,
        python=evolver_python,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run] = (repo / "runs").glob("run-*")
    history = json.loads(run_cli(["history", run.name, "--repo", str(repo), "--json"]).stdout)["candidates"]
    assert [(c["title"], c["verdict"]) for c in history] == [("Keep the user's exact title", "accepted")]
    shown = run_cli(["show", run.name, "1", "--repo", str(repo)]).stdout
    assert f"command: planted-coder installed ({home / '.local/bin/planted-coder'}; exit 0" in " ".join(shown.split()), shown

    [probe] = [json.loads(p.read_text()) for p in run.glob("proposals/*/workspace/probe.json")]
    secrets = (
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/sudoers",
        "/etc/ssh",
        "/etc/ssh/ssh_config",
        "/etc listing",
        "/etc/ssl/private",
        "home key",
        "home listing",
        "home config",
        "home history",
    )
    assert [name for name in secrets if probe[name].startswith("ok")] == [], probe
    assert probe["home key"] == "PermissionError" and (probe["/etc/shadow"] == "PermissionError" or not Path("/etc/shadow").exists())
    assert probe["passwd entry"] == f"ok: {pwd.getpwuid(os.getuid()).pw_name}" and probe["localhost"] == "ok: 127.0.0.1"
    assert int(probe["certificates"].removeprefix("ok: ")) > 0
    assert probe["chown"] == "PermissionError"  # no capability left, even as root (these machines run tests as root)
    assert probe["cap_sys_admin"] == "ok: 0" or os.getuid() != 0  # a user without the capability cannot drop it from the bounding set
    given = {"PATH", "HOME", "TMPDIR", "LANG", "TERM", "PLANTED_HOME", "PWD", "SHLVL", "_"}
    assert {"LANG", "TERM", "PLANTED_HOME"} <= set(probe["env"]) and set(probe["env"]) - given <= {
        n for n in os.environ if n.startswith("LC_")
    }


def test_a_call_written_as_python_text_is_read_never_run():
    from evolver.evolution.proposers.agent_tools import written_call

    found = written_call("To start:\n```python\n# the failures\nlist_failures()\n```\nthen read_trajectory(task='T1')")
    assert (found.function.name, json.loads(found.function.arguments)) == ("list_failures", {})
    found = written_call('read_file("agent/agent.py", 1, 40) to see it')
    assert json.loads(found.function.arguments) == {"path": "agent/agent.py", "start": 1, "end": 40}
    assert written_call('submit(title=__import__("os").system("touch /tmp/evolver-pwned"), rationale="x")') is None
    assert written_call("os.system('id')") is None and not Path("/tmp/evolver-pwned").exists()
    found = written_call('{"name": "write_file", "arguments": {"path": "agent/skills/a.md", "content": "# A\n\nUse when x."}}')
    assert json.loads(found.function.arguments)["content"] == "# A\n\nUse when x."  # raw line breaks in a string: not JSON, still read
    found = written_call('<tools>\n    <function name="read_trajectory" arguments=\'{"task": "T2", "trial": 0}\'/>\n</tools>')
    assert (found.function.name, json.loads(found.function.arguments)) == ("read_trajectory", {"task": "T2", "trial": 0})
    found = written_call('<tools> <function name="read_trajectory" arguments={"task": "T1", "page": 1}></function> </tools>')  # bare
    assert json.loads(found.function.arguments) == {"task": "T1", "page": 1}


def test_a_smoke_test_failure_says_where_in_agent_the_candidate_raised(tmp_path):
    """The traceback comes from the candidate's process as agent_host sends it; only the last frame of agent/ is read."""
    import importlib.util

    from evolver.evaluation.agent_host import _describe
    from evolver.evolution.loop.validation import raised_at

    source = tmp_path / "src" / "agent" / "agent.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "def helper(messages):\n    return messages + 'policy'\n\n\ndef turn(messages):\n    context = helper(messages)\n    return context\n"
    )
    spec = importlib.util.spec_from_file_location("planted_agent", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(TypeError) as raised:
        module.turn([])
    error = "AgentFault: the agent raised " + _describe(raised.value)
    assert (
        raised_at(error) == " (raised by this candidate's line 2 of agent/agent.py, in helper)"
    )  # its code, quoted, was taken for the file's
    assert raised_at('AgentFault: the agent raised TypeError: x\nFile "/usr/lib/python3.11/json/__init__.py", line 2, in f\n    x\n') == ""
