"""A candidate can never touch its own score: hostile and broken agents, evaluated for real.

Every case in tests/scripts/hostile.py runs through `evolver eval` with the
sandbox on (tau2, git, subprocesses, the zygote and the sandbox are real; the
LLMs are scripted). Each must end scored no higher than the honest agent, or as
the candidate's own failure, with no file written outside its scratch
directory, no connection made, no key seen, the repository unchanged and no
process left behind. Memory-hungry cases run only inside the sandbox's limit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from evolver.evaluation import sandbox
from tests.conftest import ROOT
from tests.scripts import hostile


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    env = dict(os.environ)
    repo, template = hostile.init_repo(tmp_path_factory.mktemp("sandbox") / "target", env)
    canaries = hostile.Canaries(tmp_path_factory.mktemp("outside"))
    yield repo, template, canaries, env
    canaries.close()


def test_honest_template_scores_the_baseline_inside_the_sandbox(target):
    repo, template, canaries, env = target
    outcome = hostile.run_case(hostile.Case("honest", "import", "", "neutralised"), repo, canaries, template, env)
    assert outcome.problems == []
    assert outcome.summary["avg_reward"] == hostile.BASELINE and outcome.summary["failed"] == 0
    isolation = outcome.result["isolation"]
    assert isolation["mode"] == "sandbox" and isolation["seccomp"] and isolation["landlock_abi"] >= 1
    # the agent's usage is what the trusted side counted
    assert outcome.summary["usage"]["agent"]["prompt_tokens"] > 0


@pytest.mark.parametrize("case", hostile.HOSTILE + hostile.FAULTS, ids=lambda c: c.name)
def test_hostile_or_broken_candidate(target, case):
    repo, template, canaries, env = target
    outcome = hostile.run_case(case, repo, canaries, template, env)
    assert outcome.problems == [], outcome.problems
    if case.name == "forge_usage_and_reward_fields":
        assert outcome.summary["usage"]["agent"]["prompt_tokens"] > 0  # its claim of 0 tokens was ignored


# What docs/sandbox.md says the agent process never gets, or is limited in, and the cases that try it.
CLAIMS = {
    "the run directory": ["read_run_directory", "write_result_files"],
    "the repository or its `.git`": ["read_repository_git", "write_repository_git", "change_user_working_tree"],
    "your home": ["read_user_home"],
    "`/proc`": ["proc_environ"],
    "tau2's `tasks.json` and databases": ["read_tau2_tasks_json", "uncover_tau2_data"],
    "any environment variable or key": ["environment_variables", "environment_holds_only_the_agent_names", "key_in_memory"],
    "the network or any local socket": ["tcp_exfiltration", "unix_socket_connection"],
    "new processes": ["fork", "raw_fork_syscall", "os_system", "detached_subprocess"],
    "signals or ptrace to other processes": ["signal_the_evaluator", "ptrace_the_evaluator"],
    "memory 1 GiB above its start": ["memory_in_turn", "memory_at_import"],
    "120 s of computing per turn": ["hang_in_turn"],
    "64 MiB per file": ["fill_the_disk"],
    "at most 16 LLM calls per turn": ["llm_request_flood"],
    "replies under 100,000 characters": ["huge_reply"],
    "an image or file part": ["llm_request_names_a_url"],
}


@pytest.mark.parametrize("claim", CLAIMS)
def test_every_claim_of_the_sandbox_page_is_tried_by_a_case(claim):
    """A claim dropped from the page, or a case dropped from the table, fails here."""
    table = (ROOT / "docs" / "sandbox.md").read_text().split("### Mechanisms")[0]
    assert claim in table
    names = {c.name for c in hostile.HOSTILE + hostile.FAULTS}
    assert set(CLAIMS[claim]) <= names, set(CLAIMS[claim]) - names


def test_a_new_never_on_the_sandbox_page_needs_a_case():
    table = (ROOT / "docs" / "sandbox.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| never |"))
    items = re.sub(r"\s*\([^()]*\)", "", row.removeprefix("| never |").strip(" |")).split(", ")
    assert set(items) <= set(CLAIMS), set(items) - set(CLAIMS)


def test_no_agent_process_outlives_its_evaluation(target):
    assert hostile.wait_for_no_agents()
    assert not hostile.leftover_sleepers()


def test_llm_requests_carry_messages_and_tools_only():
    from evolver.evaluation.agent_wire import AgentFault, llm_request

    kwargs = llm_request(
        {
            "op": "llm",
            "messages": [{"role": "user", "content": "hi", "api_base": "http://evil"}],
            "tools": None,
            "tool_choice": None,
            "model": "gpt-4o",
            "temperature": 2.0,
            "api_key": "x",
        }
    )
    assert kwargs == {"messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(AgentFault):
        llm_request({"messages": [{"role": "root", "content": "x"}]})
    with pytest.raises(AgentFault):
        llm_request({"messages": [{"role": "user"}], "tool_choice": 7})
    # Only text reaches the model: an image or file part names a URL some providers' adapters fetch.
    for part in (
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}},
        {"type": "file", "file": {"file_id": "x"}},
        {"type": "text", "text": 3},
    ):
        with pytest.raises(AgentFault, match="content other than text"):
            llm_request({"messages": [{"role": "user", "content": [part]}]})
    with pytest.raises(AgentFault, match="tool call"):
        llm_request(
            {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": {}}}]}]}
        )
    with pytest.raises(AgentFault, match="not text"):
        llm_request({"messages": [{"role": "tool", "content": "x", "tool_call_id": {"$ref": "x"}}]})
    # What passes is rebuilt from the checked parts, extra keys dropped at every level.
    kwargs = llm_request(
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "a", "cache_control": {}}],
                    "tool_calls": [{"id": "1", "name": "f", "type": "function", "function": {"name": "f", "arguments": "{}", "x": 1}}],
                }
            ],
            "tools": [
                {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}, "api_base": "x"}}
            ],
            "tool_choice": {"type": "function", "function": {"name": "f"}, "api_key": "x"},
        }
    )
    assert kwargs == {
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "a"}],
                "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            }
        ],
        "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }


NO_LANDLOCK = """
import os, sys, errno, pyseccomp
f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
f.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "landlock_create_ruleset")  # what a kernel without Landlock answers
f.load()
os.execv(sys.executable, [sys.executable, "-m", "evolver", *sys.argv[1:]])
"""


def test_without_landlock_eval_refuses_unless_the_unsafe_flag_is_given(target, tmp_path):
    repo, template, canaries, env = target
    (repo / "agent" / "agent.py").write_text(template)
    subprocess.run(["git", "commit", "-qam", "honest again"], cwd=repo)
    # No warm zygote: this process and its children must all lack Landlock.
    env = {**env, "EVOLVER_ZYGOTE_IDLE": "0", "EVOLVER_RUNTIME_DIR": str(tmp_path / "rt")}
    before = sorted(p.name for p in (repo / "runs").iterdir())
    args = [sys.executable, "-c", NO_LANDLOCK, "eval", str(repo), "--json", *hostile.MODELS, "--task-ids", "create_task_1"]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Landlock is not available" in proc.stderr and "--unsafe-no-sandbox" in proc.stderr
    assert sorted(p.name for p in (repo / "runs").iterdir()) == before  # nothing that could pass for a result
    proc = subprocess.run([*args, "--unsafe-no-sandbox"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(Path(json.loads(proc.stdout)["result_file"]).read_text())
    assert result["isolation"]["mode"] == "none"


HARDCODED = """TITLE: Remember the usual task
RATIONALE: the create task always wants this title
FILE: agent/agent.py
<<<<<<< SEARCH
H5_TOP_K = 2
=======
H5_TOP_K = 2
KNOWN_TASK = "create_task_1"
>>>>>>> REPLACE
"""


def hardcoding_meta(name, messages, tools):
    from evolver.scripted import Reply

    return Reply(HARDCODED)


def test_a_patch_that_copies_task_data_is_refused_with_rule_and_line(target, monkeypatch):
    from evolver.cli.start import PROMPTS_DIR
    from evolver.data import RoleModel
    from evolver.evaluation.worker.tasks import domain_identifiers
    from evolver.evolution.proposers.oneshot import propose

    repo, template, _, _ = target
    (repo / "agent" / "agent.py").write_text(template)
    identifiers = frozenset(domain_identifiers("mock"))
    assert {"create_task_1", "user_1"} <= identifiers and "create_task" not in identifiers  # ids, not tool names
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.test_sandbox:hardcoding_meta")
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]
    outcome = propose(RoleModel(model="scripted/meta"), messages, repo, prompts_dir=PROMPTS_DIR, identifiers=identifiers)
    line = template.splitlines().index("H5_TOP_K = 2") + 2
    assert outcome.refused.startswith(f"refused by the static scan: agent/agent.py:{line}: task-data:")
    assert outcome.findings and "create_task_1" in outcome.findings[0]
    clean = propose(RoleModel(model="scripted/meta"), messages, repo, prompts_dir=PROMPTS_DIR, identifiers=frozenset())
    assert clean.refused is None  # without the identifiers nothing else in the patch is suspicious


def test_the_channel_refuses_what_is_not_a_message():
    import socket

    from evolver.evaluation.channel import HEADER, MAX_FRAME, Channel, ChannelError

    ours, theirs = socket.socketpair()
    chan = Channel(ours)
    for payload in (b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe", b"[1, 2]", b'{"no": "op"}'):
        theirs.sendall(HEADER.pack(len(payload)) + payload)
        with pytest.raises(ChannelError):
            chan.receive(5)
    theirs.sendall(HEADER.pack(MAX_FRAME + 1))
    with pytest.raises(ChannelError, match="over the"):
        chan.receive(5)
    ours.close()
    theirs.close()


def test_grants_cut_out_the_hidden_folder_entry_by_entry(tmp_path):
    """Landlock's grants computed for a hidden folder: a pure function, checked wherever the sandbox cannot run."""
    (tmp_path / "site/tau2/data/tasks").mkdir(parents=True)
    (tmp_path / "site/tau2/agent").mkdir()
    (tmp_path / "site/tau2/__init__.py").write_text("")
    (tmp_path / "site/other").mkdir()
    (tmp_path / "lib").mkdir()
    hidden = ((tmp_path / "site/tau2/data").resolve(),)
    grants = sandbox.excluding(tmp_path.resolve(), hidden)
    expected = {tmp_path / "lib", tmp_path / "site/other", tmp_path / "site/tau2/agent", tmp_path / "site/tau2/__init__.py"}
    assert set(grants) == {p.resolve() for p in expected}
    assert sandbox.excluding((tmp_path / "lib").resolve(), hidden) == [(tmp_path / "lib").resolve()]
    assert sandbox.excluding(hidden[0], hidden) == []
