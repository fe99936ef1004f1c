"""Proposal parsing, the allowlist, the proposer's retries, prompt fitting, and digest masking."""

from __future__ import annotations

import json

import pytest

from evolver.data import EvalResult, EvalSummary, RoleModel, SimRecord
from evolver.digest import build_digest
from evolver.errors import UsageError
from evolver.patch import Edit, ParseError, PatchRejected, apply_edits, check_path, parse_proposal
from evolver.propose import build_messages, propose
from evolver.start import PROMPTS_DIR

AGENT = 'AGENT_INSTRUCTION = """\nBe nice.\n"""\n\n\ndef f():\n    return 1\n'


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "agent.py").write_text(AGENT)
    return tmp_path


def test_parse_two_files_and_multiline_rationale():
    text = ("Here you go.\nTITLE: Two edits\nRATIONALE: Pattern 1 and\nPattern 2.\n"
            "FILE: agent/agent.py\n<<<<<<< SEARCH\nBe nice.\n=======\nBe exact.\n>>>>>>> REPLACE\n"
            "FILE: agent/skills/titles.md\n<<<<<<< SEARCH\n=======\nKeep titles verbatim.\n>>>>>>> REPLACE\n")
    p = parse_proposal(text)
    assert p.title == "Two edits" and p.rationale == "Pattern 1 and\nPattern 2."
    assert [(e.path, e.search, e.replace) for e in p.edits] == [("agent/agent.py", "Be nice.", "Be exact."), ("agent/skills/titles.md", "", "Keep titles verbatim.")]


@pytest.mark.parametrize("text, fragment", [
    ("FILE: agent/agent.py\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n", "no 'TITLE"),
    ("TITLE: x\nRATIONALE: y\n", "no edit blocks"),
    ("TITLE: x\nFILE: agent/agent.py\n<<<<<<< SEARCH\na\n=======\nb\n", "not closed"),
    ("TITLE: x\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n", "must follow a 'FILE"),
])
def test_malformed_proposals(text, fragment):
    with pytest.raises(ParseError, match=fragment):
        parse_proposal(text)


@pytest.mark.parametrize("path", ["evolver/cli.py", "agent/templates/tau_bench.py", "agent/../evolver/cli.py", "/etc/passwd", "agent", "Harness.md"])
def test_allowlist_refuses(path):
    with pytest.raises(PatchRejected) as exc:
        check_path(path)
    assert not exc.value.retryable


def test_apply_checks_everything_before_writing(tree):
    good = Edit("agent/agent.py", "Be nice.", "Be exact.")
    with pytest.raises(PatchRejected, match="does not parse") as exc:
        apply_edits(tree, [good, Edit("agent/agent.py", "    return 1", "    return (")])
    assert not exc.value.retryable
    assert (tree / "agent" / "agent.py").read_text() == AGENT  # nothing written
    with pytest.raises(PatchRejected, match="not found") as exc:
        apply_edits(tree, [Edit("agent/agent.py", "Be rude.", "x")])
    assert exc.value.retryable
    with pytest.raises(PatchRejected, match="found 2 times"):
        apply_edits(tree, [Edit("agent/agent.py", '"""', "'''")])
    apply_edits(tree, [good, Edit("agent/skills/new.md", "", "A skill.")])
    assert "Be exact." in (tree / "agent" / "agent.py").read_text()
    assert (tree / "agent" / "skills" / "new.md").read_text() == "A skill.\n"


def _messages():
    return [{"role": "system", "content": "guide"}, {"role": "user", "content": "fix it"}]


def test_proposer_sends_format_errors_back(tree, monkeypatch):
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:sloppy_meta")
    tree_agent = tree / "agent" / "agent.py"
    tree_agent.write_text('AGENT_INSTRUCTION = """\nBe nice.\n"""\n')
    out = propose(RoleModel(model="scripted/meta"), _messages(), tree, prompts_dir=PROMPTS_DIR)
    assert out.proposal is not None and out.proposal.title == "Keep the user's exact title"
    assert len(out.responses) == 2 and "no 'TITLE" in out.errors[0]
    assert out.usage.prompt_tokens > 0


def test_proposer_gives_up_after_bounded_attempts(tree, monkeypatch):
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:prose_meta")
    out = propose(RoleModel(model="scripted/meta"), _messages(), tree, prompts_dir=PROMPTS_DIR, max_attempts=3)
    assert out.proposal is None and len(out.responses) == 3


def test_prompt_is_shrunk_to_the_context():
    history = [f"- Iteration {i}: something -> rejected." for i in range(200)]
    msgs = build_messages(PROMPTS_DIR, "guide", "agent source", "digest " * 2000, history, context_tokens=6000)
    total = sum(len(m["content"]) for m in msgs)
    assert total <= (6000 - 2500) * 4
    assert "older attempts omitted" in msgs[1]["content"] and "- Iteration 199:" in msgs[1]["content"]
    with pytest.raises(UsageError, match="meta_context_tokens"):
        build_messages(PROMPTS_DIR, "guide " * 4000, "agent", "digest", [], context_tokens=3000)


def test_digest_masks_data_and_keeps_procedure(tmp_path):
    messages = [
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "Please create a task called 'Secret Launch' for user_7 costing $1234."},
        {"role": "assistant", "content": None, "tool_calls": [{"name": "create_task", "arguments": {"user_id": "user_7", "title": "secret launch"}}]},
        {"role": "tool", "content": json.dumps({"task_id": "task_9", "title": "secret launch", "status": "pending"}), "error": False},
    ]
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "trajectories" / "t.json").write_text(json.dumps({"messages": messages}))
    breakdown = {"reward": 0.0, "db_check": {"db_match": False}, "action_checks": [
        {"action": {"name": "create_task", "arguments": {"user_id": "user_7", "title": "Secret Launch"}}, "action_match": False}]}
    rec = SimRecord(task_id="secret_task_id", trial=0, outcome="ok", reward=0.0, reward_breakdown=breakdown, termination_reason="user_stop", steps=4, trajectory_file="trajectories/t.json")
    summary = EvalSummary(num_tasks=1, num_trials=1, num_simulations=1, scored=1, failed=0, infra_errors=0, avg_reward=0.0, pass_hat_k={}, usage={}, duration=1.0)
    result = EvalResult(run_id="r", checkout="c", domain="mock", split=None, task_ids=["secret_task_id"], trials=1, seed=1, max_steps=5, models={}, summary=summary, simulations=[rec])
    digest = build_digest(result, tmp_path)
    for secret in ("Secret Launch", "secret launch", "user_7", "task_9", "1234", "secret_task_id"):
        assert secret not in digest
    assert "expected action missing or wrong: create_task(user_id, title)" in digest
    assert "wrong final database state" in digest and "status" in digest and "pending" in digest
    assert "create_task(user_id=<V" in digest
