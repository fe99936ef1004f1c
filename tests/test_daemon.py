"""The warm worker daemon (evolver.evaluation.zygote): reused across commands, private, and never left
holding a dead controller's workers. Real processes and sockets; each test that starts, stops, kills or
idles out a daemon has one of its own; the tests that only need a warm one share one (`warm_daemon`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evolver.evaluation import zygote_client
from tests.conftest import LINEAGE, SCRIPTED_MODELS, eval_json, run_cli

ONE_TASK = ("--task-ids", "create_task_1")


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """A runtime directory of this test's own (short: socket paths are limited to ~100 bytes)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="evrt-"))
    monkeypatch.setenv("EVOLVER_RUNTIME_DIR", str(path))
    yield path
    path.chmod(0o700)
    zygote_client.stop_all()


@pytest.fixture(scope="module")
def shared_runtime():
    """The runtime directory of the daemon the `warm_daemon` tests share (short, as `runtime`'s)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="evrt-"))
    yield path
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EVOLVER_RUNTIME_DIR", str(path))
        zygote_client.stop_all()


@pytest.fixture
def shared(shared_runtime, monkeypatch) -> Path:
    """The shared daemon's directory for this test; the daemon may be warm."""
    monkeypatch.setenv("EVOLVER_RUNTIME_DIR", str(shared_runtime))
    monkeypatch.setenv("EVOLVER_ZYGOTE_IDLE", "900")  # warm from the first such test to the last, however long the tests between take
    return shared_runtime


@pytest.fixture
def warm_daemon(shared, repo) -> Path:
    """The shared daemon, warm: a test's commands are handed to it (evolver.cli.launch). A test that starts from
    a cold one, kills, stops or idles out its daemon takes `runtime` instead."""
    if not _daemons():  # the first such test, or the daemon idled out in between
        eval_json(repo, *ONE_TASK)
    return shared


def _daemons() -> list[dict]:
    return [info for _, info in zygote_client.running()]


def _state_and_parent(pid: int) -> tuple[str, int]:
    try:
        state, parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
    except OSError:
        return "gone", 0
    return state, int(parent)


def _wait_for(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_commands_share_one_warm_daemon(repo, shared):
    first = eval_json(repo, *ONE_TASK)
    [daemon] = _daemons()
    second = eval_json(repo, *ONE_TASK)
    [again] = _daemons()
    assert again["pid"] == daemon["pid"]  # the second command forked from the same warm process
    assert again["served"] > daemon["served"] and again["workers"] == 0
    assert first["avg_reward"] == second["avg_reward"] == 1.0
    proc = run_cli(["daemon", "status"])
    assert proc.returncode == 0 and f"pid {daemon['pid']}" in proc.stdout and "current code" in proc.stdout


@pytest.mark.parametrize("warm", [False, True], ids=["command-run-locally", "command-run-in-the-daemon"])
def test_killed_controller_takes_its_workers_not_the_daemon(repo, request, warm):
    # warm: the command itself is handed to the daemon (evolver.cli.launch); else a cold daemon of its own starts with it
    request.getfixturevalue("warm_daemon" if warm else "runtime")
    assert bool(_daemons()) is warm
    env = {**os.environ, "EVOLVER_SCRIPTED_LATENCY": "1"}  # slow enough to be caught mid-run
    controller = subprocess.Popen(
        [sys.executable, "-m", "evolver", "eval", str(repo), *SCRIPTED_MODELS, "--trials", "3", "--concurrency", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # two workers share the grid; a command handed to the daemon is one more of its children
        assert _wait_for(lambda: any(d["workers"] >= 2 + warm for d in _daemons()), 60), "no worker started"
        [daemon] = _daemons()
    finally:
        controller.send_signal(signal.SIGKILL)
        controller.wait()
    assert _wait_for(lambda: _daemons() and _daemons()[0]["workers"] == 0), "the dead controller's workers kept running"
    assert _daemons()[0]["pid"] == daemon["pid"]
    assert eval_json(repo, *ONE_TASK)["avg_reward"] == 1.0


def test_idle_daemon_exits_and_removes_its_socket(repo, runtime):
    eval_json(repo, *ONE_TASK, env={"EVOLVER_ZYGOTE_IDLE": "0"})
    assert _wait_for(lambda: not list(runtime.glob("*.sock")))
    assert _daemons() == []


def test_killed_daemon_is_replaced_by_the_next_command(repo, runtime):
    eval_json(repo, *ONE_TASK)
    [daemon] = _daemons()
    os.kill(daemon["pid"], signal.SIGKILL)
    assert _wait_for(lambda: not _daemons())
    assert list(runtime.glob("*.sock")), "the killed daemon's socket should be left behind for this test to mean anything"
    assert eval_json(repo, *ONE_TASK)["avg_reward"] == 1.0
    [replacement] = _daemons()
    assert replacement["pid"] != daemon["pid"]


def test_the_first_start_for_an_install_says_it_is_slow_and_outlives_the_command_once(repo, runtime):
    """The first command after an install waits for the daemon to import tau2 and litellm (about 20 s where a later one
    takes 2.5 s) and leaves it running: said on that start, and on no later one, warm or after the daemon stopped."""
    said = "evolver: starting the worker daemon for this install: the first start imports tau2 and litellm"
    first = run_cli(["eval", str(repo), *SCRIPTED_MODELS, *ONE_TASK])
    assert first.returncode == 0 and first.stderr.count(said) == 1, first.stderr
    assert "it stays up after this command and exits after 120 s without use (`evolver daemon stop` ends it sooner)" in first.stderr
    warm = run_cli(["eval", str(repo), *SCRIPTED_MODELS, *ONE_TASK])
    assert run_cli(["daemon", "stop"]).returncode == 0 and _wait_for(lambda: not _daemons())
    again = run_cli(["eval", str(repo), *SCRIPTED_MODELS, *ONE_TASK])  # a new daemon of the same code: nothing to say
    assert warm.returncode == again.returncode == 0 and said not in warm.stderr + again.stderr, again.stderr


def test_stop_lets_the_daemon_exit(repo, runtime):
    eval_json(repo, *ONE_TASK)
    proc = run_cli(["daemon", "stop"])
    assert proc.returncode == 0 and "asked 1 daemon" in proc.stdout
    assert _wait_for(lambda: not _daemons() and not list(runtime.glob("*.sock")))
    assert "no daemon running" in run_cli(["daemon", "status"]).stdout


def test_shared_runtime_dir_is_refused(repo, runtime):
    runtime.chmod(0o755)  # others could plant a socket that answers as the daemon
    proc = run_cli(["eval", str(repo), *SCRIPTED_MODELS, *ONE_TASK])
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "private directory" in proc.stderr
    assert not any((repo / "runs").iterdir())  # runs/ exists (init made it): this checks something


def test_bad_idle_setting_is_refused_before_anything_runs(repo, runtime):
    proc = run_cli(["eval", str(repo), *SCRIPTED_MODELS, *ONE_TASK], env={"EVOLVER_ZYGOTE_IDLE": "soon"})
    assert proc.returncode == 2 and "EVOLVER_ZYGOTE_IDLE" in proc.stderr and proc.stderr.count("\n") == 1
    assert _daemons() == []


def test_changed_code_gets_its_own_daemon(tmp_path, monkeypatch):
    """The socket name follows what forked workers would run: PYTHONPATH here, like an edit or upgrade."""
    before = zygote_client.fingerprint()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert zygote_client.fingerprint() != before


def test_eval_without_a_meta_model_does_not_start_the_embedded_model(repo, runtime):
    """An evaluation has no meta-LLM: an unset meta model must not start (or cap concurrency for) llama.cpp."""
    models = SCRIPTED_MODELS[: SCRIPTED_MODELS.index("--meta-model")]
    proc = run_cli(["eval", str(repo), "--json", *models, *ONE_TASK, "--concurrency", "4"])
    assert proc.returncode == 0, proc.stderr
    assert "embedded" not in proc.stderr and "concurrency 4 -> " not in proc.stderr
    assert json.loads(proc.stdout)["avg_reward"] == 1.0


def test_command_in_the_daemon_runs_where_and_as_it_was_called(repo, warm_daemon):
    [daemon] = _daemons()
    proc = run_cli(
        ["eval", ".", "--json", *SCRIPTED_MODELS, "--task-ids", "create_task_1,impossible_task_1"],
        cwd=repo,
        env={"EVOLVER_SCRIPT": "tests.scripts.eval_cases:flaky_provider"},
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)  # stdout is the caller's own pipe
    assert Path(summary["result_file"]).parent.parent == repo / "runs"  # the caller's directory
    assert summary["infra_errors"] == 1  # the caller's environment: its script's provider fails on impossible_task_1
    assert _daemons()[0]["served"] > daemon["served"]
    bad = run_cli(["eval", str(repo), *SCRIPTED_MODELS, "--domain", "nowhere"])
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown domain" in bad.stderr


def test_ctrl_c_reaches_a_command_run_in_the_daemon(repo, warm_daemon):
    env = {**os.environ, "EVOLVER_SCRIPTED_LATENCY": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolver", "eval", str(repo), *SCRIPTED_MODELS, "--trials", "3", "--concurrency", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert _wait_for(lambda: any(d["workers"] >= 3 for d in _daemons()), 60)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    assert _wait_for(lambda: _daemons()[0]["workers"] == 0)


@pytest.mark.slow
def test_a_run_is_handed_to_the_warm_daemon_and_a_kill_of_its_command_ends_it_resumably(tmp_path, warm_daemon):
    from tests.test_loop import tiny_target

    [daemon] = _daemons()
    assert run_cli(["tasks", "mock", "--split", "base"]).returncode == 0  # tasks imports tau2: handed over too, and no worker forked
    assert _daemons()[0]["served"] == daemon["served"] + 1
    repo = tiny_target(tmp_path / "tiny")
    args = [
        "run",
        str(repo),
        "--iterations",
        "1",
        "--gate-stages",
        "1",
        "--no-holdout",
        "--proposer",
        "oneshot",
        *LINEAGE,
        *SCRIPTED_MODELS,
    ]
    env = {**os.environ, "EVOLVER_SCRIPT": "tests.scripts.loop_cases:script", "EVOLVER_SCRIPTED_LATENCY": "0.5"}
    command = subprocess.Popen([sys.executable, "-m", "evolver", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(lambda: list((repo / "runs").glob("run-*/evals/*/sims.jsonl")), 60), "the run did not start evaluating"
        [lock] = (repo / "runs").glob("run-*/lock")
        driver = int(lock.read_text().split()[1])
        assert driver != command.pid and _state_and_parent(driver)[1] == daemon["pid"]  # the run is driven by the daemon's fork
    finally:
        command.send_signal(signal.SIGKILL)
        command.wait()
    assert _wait_for(lambda: _state_and_parent(driver)[0] in ("gone", "Z"))  # the daemon ended it with its command
    resumed = run_cli(["run", str(repo), "--resume", lock.parent.name], env={"EVOLVER_SCRIPT": "tests.scripts.loop_cases:script"})
    assert resumed.returncode == 0 and "completed 1 iteration(s)" in resumed.stderr, resumed.stderr[-2000:]


def test_a_stopping_daemon_still_serves_the_clients_it_has(repo, runtime):
    """`evolver daemon stop` during a run: the run's later evaluations still get workers."""
    from evolver.config_load import load_config
    from evolver.config_requests import eval_request, listing_request
    from evolver.evaluation.backends.local import LocalBackend

    cfg = load_config(repo, {"agent_model": "scripted/agent", "user_model": "scripted/user", "judge_model": "scripted/judge"}, environ={})
    with LocalBackend() as backend:
        backend.list_tasks(listing_request(cfg, repo, repo / "runs" / "first"))  # a controller's connection, held across evaluations
        [daemon] = _daemons()
        assert zygote_client.stop_all() == 1
        assert not list(runtime.glob("*.sock"))  # no new clients
        listing = backend.list_tasks(listing_request(cfg, repo, repo / "runs" / "listing"))
        assert "create_task_1" in listing.tasks
        # and its workers still get sandboxed agent processes from it
        result = backend.evaluate(
            eval_request(cfg, repo, repo / "runs" / "after-stop", local_api_base=None, task_ids=["create_task_1"]),
            "after-stop",
            timeout=300,
        )
        assert result.summary.avg_reward == 1.0 and result.isolation["mode"] == "sandbox"
    assert _wait_for(lambda: _gone(daemon["pid"])), "the stopped daemon outlived its last client"


def _gone(pid: int) -> bool:
    """Exited (a zombie counts: this process started it and has not reaped it)."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def test_a_child_that_exits_in_the_same_read_as_its_pid_is_not_lost():
    """The zygote's {"pid"} and {"exit"} for a child that ends at once can arrive in one read."""
    import socket

    from evolver.evaluation.backends.local import Zygote

    ours, theirs = socket.socketpair()
    theirs.sendall(b'{"pid": 4242}\n{"exit": 4242, "code": 3}\n')
    zygote = Zygote.__new__(Zygote)
    zygote.conn, zygote.exits = zygote_client.Connection(ours), {}
    assert zygote_client.await_pid(zygote.conn, zygote._note, 5) == 4242
    assert zygote.exit_code(4242) == 3  # without the fix: None until the wall-clock limit
    theirs.close()
    ours.close()


WARM_PROBE = r"""
import os, sys, threading
os.environ["EVOLVER_SCRIPT"] = "evolver.scripted:mock_script"
from evolver.evaluation.worker.warmup import preload
preload()
threads = threading.active_count()
from evolver.local.providers import register_providers
register_providers(["scripted/agent"])
import tau2.utils.llm_utils as llm_utils
from tau2.data_model.message import UserMessage
from tau2.domains.mock.environment import get_environment
before = set(sys.modules)
reply = llm_utils.generate(model="scripted/agent", tools=get_environment().get_tools(),
                           messages=[UserMessage(role="user", content="Hi, please mark task_1 as completed.")])
print(threads, len(set(sys.modules) - before), reply.tool_calls[0].name)
"""


def test_the_daemon_preloads_the_completion_path_without_starting_a_thread():
    # What a forked worker would otherwise import at its first LLM call (~280 modules, 0.6 s of
    # CPU each time); and the zygote forks, so its preload must leave it single-threaded.
    proc = subprocess.run([sys.executable, "-c", WARM_PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    threads, imported, tool = proc.stdout.split()
    assert (int(threads), int(imported), tool) == (1, 0, "update_task_status")
