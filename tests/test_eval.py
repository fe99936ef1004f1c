"""`evolver eval` end to end: real tau2 mock simulations in a real worker subprocess, scripted LLMs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SCRIPTED_MODELS, eval_json, run_cli

CLOSED = "http://127.0.0.1:9/v1"  # a port nothing listens at


def _result(summary: dict) -> dict:
    return json.loads(Path(summary["result_file"]).read_text())


def test_scripted_agent_that_solves_a_task_gets_reward_1(repo):
    summary = eval_json(repo, "--task-ids", "create_task_1,update_task_1", "--trials", "2")
    assert summary["avg_reward"] == 1.0
    assert summary["pass_hat_k"] == {"1": 1.0, "2": 1.0}
    result = _result(summary)
    assert result["models"]["user"]["model"] == "scripted/user"  # the user simulator is always stated
    sims = result["simulations"]
    assert {(s["task_id"], s["trial"]) for s in sims} == {
        ("create_task_1", 0),
        ("create_task_1", 1),
        ("update_task_1", 0),
        ("update_task_1", 1),
    }
    for sim in sims:
        assert sim["outcome"] == "ok" and sim["termination_reason"] == "user_stop"
        assert sim["usage"]["agent"]["prompt_tokens"] > 0 and sim["usage"]["user"]["completion_tokens"] > 0
        assert sim["reward_breakdown"]["reward_breakdown"]  # which checks passed, for the digest
        trajectory = json.loads((Path(summary["result_file"]).parent / sim["trajectory_file"]).read_text())
        assert any(m.get("tool_calls") for m in trajectory["messages"])


def test_agent_that_does_the_wrong_thing_gets_reward_0(repo):
    models = [a if a != "scripted/agent" else "scripted/wrong" for a in SCRIPTED_MODELS]
    proc = run_cli(["eval", str(repo), "--json", *models, "--task-ids", "create_task_1"])
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["avg_reward"] == 0.0 and summary["failed"] == 0 and summary["infra_errors"] == 0
    db_check = _result(summary)["simulations"][0]["reward_breakdown"]["db_check"]
    assert db_check["db_match"] is False


def test_a_simulation_whose_evaluation_raises_fails_and_keeps_its_trajectory(repo):
    # The agent never creates the task, so the mock domain's assertion about it raises inside tau2's evaluation.
    summary = eval_json(
        repo, "--task-ids", "create_task_1_with_env_assertions", env={"EVOLVER_SCRIPT": "tests.scripts.eval_cases:idle_agent"}
    )
    assert summary["avg_reward"] == 0.0 and summary["failed"] == 1 and summary["infra_errors"] == 0
    sim = _result(summary)["simulations"][0]
    assert sim["outcome"] == "failed" and sim["termination_reason"] == "evaluation_error"
    assert sim["error"].startswith("tau2's evaluation raised ValueError: Task task_2 not found")
    trajectory = json.loads((Path(summary["result_file"]).parent / sim["trajectory_file"]).read_text())
    assert trajectory["messages"][-1]["role"] == "user" and sim["steps"] == len(trajectory["messages"]) > 0


def test_json_output_matches_result_file(repo):
    summary = eval_json(repo, "--num-tasks", "3")
    result = _result(summary)
    for key in ("avg_reward", "pass_hat_k", "num_simulations", "infra_errors", "failed", "usage"):
        assert summary[key] == result["summary"][key]
    assert summary["num_simulations"] == 3 == len(result["simulations"])


def test_provider_outage_is_an_infra_error_not_a_zero(repo):
    summary = eval_json(
        repo, "--task-ids", "create_task_1,impossible_task_1", env={"EVOLVER_SCRIPT": "tests.scripts.eval_cases:flaky_provider"}
    )
    sims = {s["task_id"]: s for s in _result(summary)["simulations"]}
    assert sims["impossible_task_1"]["outcome"] == "infra_error"
    assert sims["impossible_task_1"]["reward"] is None
    assert "ServiceUnavailableError" in sims["impossible_task_1"]["error"]
    assert sims["create_task_1"]["reward"] == 1.0
    # the outage is left out of the score instead of dragging it to 0.5
    assert summary["infra_errors"] == 1 and summary["avg_reward"] == 1.0


def _write_agent(repo: Path, code: str) -> None:
    (repo / "agent" / "agent.py").write_text(code)


TURN = "    ) -> tuple[AssistantMessage, HarnessState]:\n"


def _inject_into_turn(repo: Path, code: str) -> None:
    """Put `code` at the start of HarnessAgent.generate_next_message."""
    template = (repo / "agent" / "agent.py").read_text()
    assert template.count(TURN) == 1
    _write_agent(repo, template.replace(TURN, TURN + "".join(f"        {line}\n" for line in code.splitlines())))


def test_candidate_that_raises_at_import_gives_a_clear_error(repo):
    _write_agent(repo, "raise RuntimeError('broken candidate')\n")
    proc = run_cli(["eval", str(repo), "--json", *SCRIPTED_MODELS, "--task-ids", "create_task_1"])
    assert proc.returncode == 1
    assert "agent/agent.py failed to import: RuntimeError: broken candidate" in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["failed"] == 1 and summary["avg_reward"] == 0.0 and summary["infra_errors"] == 0
    # its import ran confined, and result.json says under what, as for a candidate that imports
    isolation = _result(summary)["isolation"]
    assert isolation["mode"] == "sandbox" and isolation["seccomp"] is True and isolation["landlock_abi"] >= 1, isolation


def test_exception_inside_the_agent_fails_that_simulation_only(repo):
    _inject_into_turn(repo, "if 'delete' in str(message.content).lower():\n    raise ValueError('candidate bug')")
    summary = eval_json(repo, "--task-ids", "create_task_1,impossible_task_1")
    sims = {s["task_id"]: s for s in _result(summary)["simulations"]}
    assert sims["impossible_task_1"]["outcome"] == "failed" and sims["impossible_task_1"]["reward"] == 0.0
    assert "candidate bug" in sims["impossible_task_1"]["error"]
    assert sims["create_task_1"]["reward"] == 1.0
    assert summary["avg_reward"] == 0.5


def test_hanging_candidate_fails_its_simulation_and_the_controller_survives(repo):
    # A hang is the candidate's failure (score 0), never an infrastructure error it could hide behind.
    _inject_into_turn(repo, "import time\nif 'delete' in str(message.content).lower():\n    time.sleep(3600)")
    proc = run_cli(["eval", str(repo), "--json", *SCRIPTED_MODELS, "--task-ids", "create_task_1,impossible_task_1", "--agent-timeout", "3"])
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["infra_errors"] == 0 and summary["failed"] == 1 and summary["avg_reward"] == 0.5
    sims = {s["task_id"]: s for s in _result(summary)["simulations"]}
    assert "did not answer within 3 s" in sims["impossible_task_1"]["error"]


def test_candidate_hanging_at_import_is_a_candidate_error(repo):
    # The evaluation's wall-clock limit ends the hang (the agent's own limit, --agent-timeout, is tests/test_sandbox.py's
    # hang_at_import): this test waits for all of it, so it is short, yet long enough for a warm worker to reach the import.
    _write_agent(repo, "import time\ntime.sleep(3600)\n")
    proc = run_cli(["eval", str(repo), "--json", *SCRIPTED_MODELS, "--task-ids", "create_task_1", "--worker-timeout", "8"])
    assert proc.returncode == 1
    assert "did not finish importing within 8 s" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--domain", "nosuch"], "unknown domain 'nosuch'"),
        (["--split", "train"], "domain 'mock' has no split 'train'; its splits: base"),
        (["--task-ids", "create_task_1,no_such_task"], "unknown task id(s) in mock: no_such_task"),
        (["--trials", "0"], "--trials 0 must be between 1 and 1000"),
        (["--user-api-base", "localhost:8000"], "the user model's API base 'localhost:8000' is not an http(s) URL; fix --user-api-base"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(repo, args, message):
    proc = run_cli(["eval", str(repo), *SCRIPTED_MODELS, *args])
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any((repo / "runs").iterdir())  # nothing that could pass for a result


@pytest.mark.parametrize(
    "command, flags, said",
    [
        (["eval"], ["--api-base", CLOSED], f"the agent and user models' API base {CLOSED} does not answer"),
        (["eval"], ["--user-api-base", CLOSED], f"the user model's API base {CLOSED} does not answer"),
        (["run"], ["--meta-api-base", CLOSED], f"the meta model's API base {CLOSED} does not answer"),
    ],
    ids=["eval-every-role", "eval-user", "run-meta"],
)
def test_an_api_base_nothing_answers_at_names_its_roles_and_flag_and_exits_3(repo, command, flags, said):
    """A closed port is a provider that did not answer the command's first request, as the preflight says of a hosted one
    (exit 3, nothing spent: start it and run the command again), not bad input; the line names the roles the server
    was for and the flag that set it."""
    proc = run_cli([*command, str(repo), *SCRIPTED_MODELS, *flags])
    assert proc.returncode == 3, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    flag = flags[0]
    assert line.startswith(f"evolver: error: {said} (") and line.endswith(
        f"nothing was spent: start its server and try again, or fix {flag}"
    ), line
    assert not any((repo / "runs").iterdir())


def test_missing_api_key_is_bad_input(repo):
    proc = run_cli(["eval", str(repo), "--agent-model", "gpt-4.1-mini", "--user-model", "scripted/user"])
    assert proc.returncode == 2
    assert "needs OPENAI_API_KEY" in proc.stderr and "Traceback" not in proc.stderr
    assert not any((repo / "runs").iterdir())


def test_path_without_agent_suggests_init(tmp_path):
    proc = run_cli(["eval", str(tmp_path), *SCRIPTED_MODELS])
    assert proc.returncode == 2
    assert "no agent/agent.py" in proc.stderr and "evolver init" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_init_refuses_to_overwrite_without_force(repo):
    (repo / "agent" / "agent.py").write_text("# my edits\n")
    proc = run_cli(["init", str(repo)])
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert (repo / "agent" / "agent.py").read_text() == "# my edits\n"
    assert run_cli(["init", str(repo), "--force"]).returncode == 0
    assert "class HarnessAgent" in (repo / "agent" / "agent.py").read_text()
