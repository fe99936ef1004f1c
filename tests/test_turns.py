"""The model's view of every turn: recorded on the trusted side, compared into the harness's changes,
and read by the proposers (masked, with the lines of agent/ to read).

A real `evolver eval` on tau2's mock domain with the scripted agent and customer, of a harness that
cuts, drops, adds and rewrites on purpose (tests/scripts/meddling.py), and of one that changes
nothing; `evolver show --turns` and the report are tested on the loop's finished run
(tests/test_loop.py), its bad input in tests/test_bad_input.py.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from evolver.data import EvalResult, RoleModel
from evolver.evolution.evidence import Evidence
from evolver.evolution.harness_changes import changes
from evolver.evolution.proposers import Budget, Request
from evolver.evolution.proposers.agent import Session
from evolver.llm import prepare_environment
from evolver.store.evaldir import EvalDir
from tests.conftest import ROOT, eval_json, failed_evaluation, git, init_repo
from tests.scripts.meddling import meddle

TASKS = "create_task_1,update_task_1,update_task_with_message_history"


@pytest.fixture(scope="module")
def meddled(tmp_path_factory):
    """A harness that meddles, with H3 on (its tool descriptions are a layer's change on purpose), evaluated once."""
    repo = init_repo(tmp_path_factory.mktemp("turns") / "target")
    agent = repo / "agent" / "agent.py"
    agent.write_text(meddle(agent.read_text()))
    switches = repo / "agent" / "harness.toml"
    switches.write_text(switches.read_text().replace("h3_environment_contract = false", "h3_environment_contract = true"))
    git(repo, "commit", "-qam", "meddle")
    summary = eval_json(repo, "--task-ids", TASKS, "--max-steps", "10")
    path = Path(summary["result_file"])
    result = EvalResult.model_validate_json(path.read_text())
    return repo, result, path.parent, {r.task_id: r for r in result.simulations}


def _kinds(found) -> dict:
    out = {}
    for c in found:
        out.setdefault((c.kind, c.layer), set()).add(c.subject)
    return out


def test_the_view_holds_both_sides_of_every_turn_each_request_stored_as_what_is_new(meddled):
    repo, result, folder, sims = meddled
    view = EvalDir(folder).read_turns(sims["create_task_1"])
    assert json.loads(gzip.decompress((folder / sims["create_task_1"].turns_file).read_bytes()))["schema"] == 1
    first = view.turns[0]
    assert first.given[0].role == "user" and first.given[0].content.startswith("Hi, please create a task")  # tau2's side, uncut
    [(_, call, messages)] = [r for r in view.requests() if r[0] == 0]
    assert [m["role"] for m in messages] == ["system", "system", "user"]  # the note in, the greeting out
    assert messages[2]["content"].startswith("please create a task")  # the model's side, cut
    assert view.policy and view.policy in messages[0]["content"] and "policy_at" in call.add[0]  # stored once, put back on reading
    assert call.tools == 1 and view.tools_of(call) != view.tools  # H3's descriptions: the harness's own tool set
    model_title = json.loads(call.reply.tool_calls[0]["arguments"])["title"]
    assert first.returned.tool_calls[0]["arguments"]["title"] == model_title.upper() != model_title
    later = view.turns[1].calls[0]
    assert later.keep >= 3 and [m["role"] for m in later.add] == ["assistant"]  # only what is new: its own call (the result was dropped)
    stop = EvalDir(folder).read_turns(sims["update_task_1"]).turns[-1]
    assert (
        stop.stop and stop.returned.content == "Goodbye. ###STOP###" and stop.calls[-1].reply.tool_calls[0]["name"] == "update_task_status"
    )


def test_the_changes_name_what_the_harness_did_and_nothing_more(meddled):
    repo, result, folder, sims = meddled
    found = {task: changes(EvalDir(folder).read_turns(r), result.harness) for task, r in sims.items()}
    h3 = {
        ("tool_changed", "H3"): {
            f"{t}: description changed" for t in ("create_task", "get_users", "update_task_status", "transfer_to_human_agents")
        }
    }
    assert _kinds(found["create_task_1"]) == {
        **h3,
        ("customer_altered", ""): {"cut"},
        ("message_added", ""): {"system"},
        ("history_dropped", ""): {"agent"},
        ("args_changed", ""): {"create_task(title)"},
        ("result_dropped", ""): {""},
    }
    assert _kinds(found["update_task_1"]) == {**h3, ("to_stop", ""): {""}}
    assert _kinds(found["update_task_with_message_history"]) == h3  # its starting history reached the model whole
    rewrite = next(c for c in found["create_task_1"] if c.kind == "args_changed")
    [(key, before, after)] = rewrite.details
    assert key == "title" and after == before.upper() and rewrite.turn == 1 and rewrite.step == "after the model answered"


def test_a_proposer_reads_the_changes_masked_with_the_lines_to_read(meddled, tmp_path):
    repo, result, folder, sims = meddled
    lines = (repo / "agent" / "agent.py").read_text().splitlines()
    model_call = next(n for n, line in enumerate(lines, 1) if "reply = self.call_llm(context)" in line)
    request = Request(
        label="1",
        focus=(0, 1),
        parent=repo,
        evidence=Evidence(result, folder, parent=repo),
        learnings=[],
        guide="# Guide\n",
        identifiers=frozenset(),
        meta=RoleModel(model="scripted/meta"),
        llm_retries=1,
        context_tokens=32000,
        budget=Budget(turns=4, tokens=50_000, tries=0, seconds=60),
        workdir=tmp_path / "proposal",
        prompts_dir=ROOT / "prompts",
    )
    s = Session(request)
    failures = s.call("list_failures", "{}")
    assert "the harness changed: " in failures and "calls' arguments changed after the model answered: create_task(title)" in failures
    pointed = re.search(
        rf"agent/agent\.py lines {model_call}-\d+ \(generate_next_message, after the model call; "
        r"the lines that change the reply there: ([\d, -]+)\)",
        failures,
    )
    rewrite = next(n for n, line in enumerate(lines, 1) if "call.arguments = {**call.arguments" in line)
    assert pointed and any(int(a) <= rewrite <= int(b or a) for a, _, b in re.findall(r"(\d+)(-(\d+))?", pointed.group(1)))
    assert "(next: read_turn on a failure the harness changed" in failures
    assert re.search(
        r"the harness changed what passed between tau2 and the model in 2 of 2 failed simulation\(s\); most often \(in 1\): "
        r".* -> read_file agent/agent\.py start=\d+ end=\d+ \(.*\) first",
        failures,
    )  # where to look first
    trajectory = s.call("read_trajectory", json.dumps({"task": "T1"}))
    assert re.search(
        r"the harness changed this conversation in turn\(s\) 1, 2, .*: read_turn T1 turn 1, or read_file agent/agent\.py start=\d+",
        trajectory,
    )
    opening = s.opening()
    assert "Start with read_file agent/agent.py start=" in opening
    assert "remove_lines" not in opening  # the lines it names are two runs: removing one shifts the other's numbers
    turn = s.call("read_turn", json.dumps({"task": "T1"}))  # the first turn the harness changed
    assert "turn 1 of" in turn and "the harness handed back to tau2: tool call(s) create_task(" in turn
    assert re.search(r"title: <V\d+> -> <V\d+> \(case changed\)", turn) and "customer message reached the model altered (cut)" in turn
    # how long the value was is task data: only a person reads it (the 1.5B, told "of 18", raised the harness's cut to 18)
    assert re.search(r"<V\d+>\. \(cut to \d+ characters\)", turn), turn
    from evolver.evolution.turntext import Plain, change_line

    cut = next(c for c in request.evidence.view(sims["create_task_1"])[1] if c.kind == "customer_altered")
    assert re.search(r"\(cut to \d+ of \d+ characters\)", change_line(cut, Plain()))
    assert "user_1" not in turn and "Important" not in turn.replace("important", "")  # values masked as in the trajectory
    assert turn.endswith("(next: read_file agent/agent.py at the lines it names)")
    for hostile, answer in [
        ({"task": "G1"}, "gate and holdout tasks are never shown"),
        ({"task": "T1", "turn": 99}, "there is no turn 99"),
        ({"task": "T1", "turn": "x"}, "must be an integer"),
    ]:
        assert answer in s.call("read_turn", json.dumps(hostile))


def test_the_digest_and_the_command_workspace_carry_the_same(meddled, tmp_path):
    from evolver.evolution.digest import build_digest
    from evolver.evolution.proposers.command import prepare_workspace

    repo, result, folder, sims = meddled
    evidence = Evidence(result, folder, parent=repo)
    digest = build_digest(result, folder, harness=evidence.harness_line, turn=evidence.changed_turn)
    assert "the harness changed: " in digest and "reply handed back as a stop" in digest
    # the first changed turn as the model saw it, before the full trajectories that only show tau2's side
    seen = digest.split("## One turn as the model saw it\n")[1].split("## Full trajectories")[0]
    assert "turn 1 of" in seen and "what the harness changed in this turn:" in seen and "user_1" not in seen
    request = Request(
        label="1",
        focus=(0, 1),
        parent=repo,
        evidence=evidence,
        learnings=[],
        guide="# Guide\n",
        identifiers=frozenset(),
        meta=RoleModel(model="scripted/meta"),
        llm_retries=1,
        context_tokens=32000,
        budget=Budget(),
        workdir=tmp_path,
        prompts_dir=ROOT / "prompts",
    )
    prepare_workspace(request, tmp_path / "workspace")
    analysis = tmp_path / "workspace" / "analysis"
    failures = (analysis / "failures.md").read_text()
    assert "the harness changed:" in failures and failures.startswith(
        "the harness changed what passed between tau2 and the model in 2 of 2 "
    )
    # said as places in the files: an external coding agent has no read_file or set_layer tool of ours
    assert " -> agent/agent.py lines " in failures.splitlines()[0] and "read_file" not in failures.splitlines()[0], failures.splitlines()[0]
    turns = (analysis / "T1-trial0.turns.md").read_text()
    assert "what the harness changed in this turn:" in turns and "user_1" not in turns
    # a dropped tool result is shown as tau2 gave it, its keys kept and its values masked
    every = "\n".join(line for r in result.simulations for line in evidence.turns_text(r))
    assert re.search(r'tool result never reached the model: content: \{"task_id": "<V\d+>", ', every), every


def test_a_fault_inside_a_switched_on_layer_is_answered_with_switching_the_layer_off(meddled, tmp_path):
    """When an on layer makes every change the harness made in the failures, the overview names the experiment that
    tells whether the layer is at fault (the 1.5B never found it in three sessions on the planted blocking repair);
    where other changes are made too (the meddling harness with H3 on), it does not."""
    from evolver.evolution.patch import apply_edits, parse_proposal
    from evolver.evolution.proposers.oneshot import starting_patch
    from tests.scripts.planted import FAULTS, plant

    repo = init_repo(tmp_path / "target")
    fault = next(f for f in FAULTS if f.name == "blocking_repair")
    (repo / "evolver.toml").write_text(
        (repo / "evolver.toml").read_text().replace('domain = "mock"', 'domain = "evolver_gen"\nplugins = ["tests.scripts.gen_domain"]')
    )
    agent, switches = repo / "agent" / "agent.py", repo / "agent" / "harness.toml"
    agent.write_text(plant(agent.read_text(), fault))
    switches.write_text(switches.read_text().replace("h2_action_realization = false", "h2_action_realization = true"))
    git(repo, "commit", "-qam", "planted")
    env = {"EVOLVER_SCRIPT": "tests.scripts.planted:script", "PYTHONPATH": str(ROOT)}
    summary = eval_json(repo, "--num-tasks", "2", "--max-steps", "8", "--agent-model", "scripted/bench", env=env)
    path = Path(summary["result_file"])
    evidence = Evidence(EvalResult.model_validate_json(path.read_text()), path.parent, parent=repo)
    assert len(evidence.failed()) == 2
    overview = evidence.harness_overview()
    assert overview.endswith(
        "every change the harness made in these failures is the H2 layer's, which is on: if they are the fault, switching it off "
        "(set_layer layer=h2_action_realization on=false, or h2_action_realization = false in agent/harness.toml) "
        "tries the agent without it"
    ), overview
    assert "set_layer" not in evidence.harness_overview(tools=False) and evidence.harness_overview(tools=False).endswith(
        "switching it off (h2_action_realization = false in agent/harness.toml) tries the agent without it"
    )
    # The one-shot proposer, which has no tools, is given the whole patch for the experiment; it applies.
    start = starting_patch(evidence)
    assert start.startswith("To try the agent without the H2 layer") and "FILE: agent/harness.toml" in start, start
    applied = apply_edits(repo, parse_proposal(f"TITLE: t\nRATIONALE: r\n{start[start.index('FILE:') :]}").edits)
    assert "h2_action_realization = false" in applied["agent/harness.toml"]
    git(repo, "checkout", "--", "agent")
    session = _session(evidence, repo, tmp_path / "blocking")
    assert "set_layer layer=h2_action_realization on=false" in session.opening().rsplit("Budget:", 1)[1]
    # The 1.5B's sessions: a comment-only edit, then submit after submit, each time told "Next: call submit". Now every
    # answer says submit would refuse it, and names the experiment until it is made.
    session.tools_used.update(read_trajectory=1, read_file=1)
    comment = {
        "path": "agent/agent.py",
        "old": "    if kind in JSON_TYPES:\n",
        "new": "    if kind in JSON_TYPES:  # removed for simplicity\n",
    }
    answer = session.call("replace_in_file", json.dumps(comment))
    layer = "Or try the agent without the layer: call set_layer with layer=h2_action_realization on=false."
    assert answer.startswith("applied to") and answer.endswith(
        "(next: change your edit, submit would refuse it: its edits change only comments, layout or a docstring, not code: they cannot "
        f"change a simulation {layer})"
    ), answer
    assert session.call("submit", json.dumps({"title": "t", "rationale": "r"})).startswith("not submitted: its edits change only comments")
    assert session.next_step().startswith("Next: change your edit, submit would refuse it:") and session.next_step().endswith(layer)
    assert session.call("set_layer", json.dumps({"layer": "h2_action_realization", "on": False})).endswith(
        "(next: try_agent on a failing task, then submit)"
    )
    assert session.next_step() == "Next: call submit with a title and a rationale."  # no try_agent in this session; the layer is off
    meddling = Evidence(meddled[1], meddled[2], parent=meddled[0])
    opening = _session(meddling, meddled[0], tmp_path / "meddled").opening().rsplit("Budget:", 1)[1]
    assert meddling.harness_overview() and "switching it off" not in meddling.harness_overview() + opening


def _session(evidence: Evidence, repo: Path, workdir: Path) -> Session:
    request = Request(
        label="1",
        focus=(0, 1),
        parent=repo,
        evidence=evidence,
        learnings=[],
        guide="# Guide\n",
        identifiers=frozenset(),
        meta=RoleModel(model="scripted/meta"),
        llm_retries=1,
        context_tokens=32000,
        budget=Budget(),
        workdir=workdir,
        prompts_dir=ROOT / "prompts",
    )
    return Session(request)


def test_a_harness_that_changes_nothing_shows_nothing(tmp_path):
    repo = init_repo(tmp_path / "target")
    summary = eval_json(repo, "--task-ids", TASKS)
    result = EvalResult.model_validate_json(Path(summary["result_file"]).read_text())
    evaluation = EvalDir(Path(summary["result_file"]).parent)
    assert all(changes(evaluation.read_turns(r), result.harness) == [] for r in result.simulations)


def test_a_view_is_read_only_from_its_own_evaluation(meddled, tmp_path):
    """Gate and holdout simulations are recorded too (for the report): a proposer reads the analysis folder only, and a
    record cannot send a reader to another evaluation's files."""
    repo, result, folder, sims = meddled
    elsewhere = tmp_path / "gate"
    (elsewhere / "turns").mkdir(parents=True)
    (elsewhere / "turns" / "canary.json.gz").write_bytes((folder / sims["create_task_1"].turns_file).read_bytes())
    record = sims["update_task_1"].model_copy(update={"turns_file": f"../../{elsewhere.name}/turns/canary.json.gz"})
    assert EvalDir(folder).read_turns(record) is None


def test_a_flood_of_requests_is_recorded_up_to_a_limit(monkeypatch):
    prepare_environment()  # litellm, imported with the proxy, reads its price list from disk, never the network
    from evolver.evaluation import agent_wire, turnlog

    monkeypatch.setattr(turnlog, "MAX_CHARS", 1000)
    log = turnlog.TurnLog()
    for n in range(5):
        log.call(agent_wire.llm_request({"messages": [{"role": "user", "content": "x" * 400 * (n + 1), "policy_at": 0}]}))
    assert len(log.view.turns[0].calls) == 1 and "later calls are not recorded" in log.view.cut
    assert all("policy_at" not in m for c in log.view.turns[0].calls for m in c.add)  # a candidate cannot forge where the policy stands


def test_an_evaluation_can_leave_the_view_unrecorded(tmp_path):
    """The benchmark's switch (benchmarks/eval_throughput.py): the same evaluation with nothing recorded."""
    from evolver.config_load import load_config
    from evolver.config_requests import eval_request
    from evolver.evaluation.backends.local import LocalBackend

    repo = init_repo(tmp_path / "target")
    cfg = load_config(repo, {"agent_model": "scripted/agent", "user_model": "scripted/user", "judge_model": "scripted/judge"})
    req = eval_request(cfg, repo, tmp_path / "out", local_api_base=None, task_ids=["create_task_1"], trials=1).model_copy(
        update={"record_turns": False}
    )
    backend = LocalBackend()
    try:
        result = backend.evaluate(req, "test", timeout=300)
    finally:
        backend.close()
    assert result.summary.scored == 1 and result.simulations[0].turns_file is None and not (tmp_path / "out" / "turns").exists()


def test_the_digest_says_a_repeated_change_once_per_pattern(tmp_path):
    """Eight failures with the same change would otherwise crowd the full trajectories out of the digest; simulations
    alike in every line are told once, by their labels."""
    from evolver.data import SimRecord
    from evolver.evolution.digest import build_digest

    sims = [
        SimRecord(task_id=f"t{n}", trial=0, outcome="ok", reward=0.0, termination_reason="max_steps", steps=30 + n // 2) for n in range(3)
    ]
    result = failed_evaluation(sims, checkout=".", max_steps=30)
    digest = build_digest(result, tmp_path, harness=lambda record: "14 tool results never reached the model (turns 2-15)")
    assert digest.count("the harness changed: 14 tool results") == 1 and digest.count("the harness changed: the same") == 1
    assert "- T1 (trial 0), T2 (trial 0) (2 simulations alike): " in digest and "- T3 (trial 0): " in digest
    assert digest.count("ended by max_steps after 30 messages") == 1 and digest.count("after 31 messages") == 1
