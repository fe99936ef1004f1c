"""Shared fixtures: scripted LLMs, fresh target repositories, running the CLI.

LLMs are scripted (evolver.scripted); tau2, git and subprocesses are real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from evolver.evaluation import zygote_client
from evolver.llm import prepare_environment

# Test modules import tau2 and litellm at collection, before any evolver command runs: without
# this, a worker waits on litellm's network fetch of its price list, which CI cannot reach.
prepare_environment()

# A shell that starts the tests as a background job without job control (`cmd &` in a script)
# makes them ignore SIGINT, and every process they start inherits that: the Ctrl-C tests would
# then interrupt nothing. A handler (unlike an ignore) is reset by exec, so children hear SIGINT.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
SCRIPTED_MODELS = [
    "--agent-model",
    "scripted/agent",
    "--user-model",
    "scripted/user",
    "--judge-model",
    "scripted/judge",
    "--meta-model",
    "scripted/meta",
]
# The one-lineage story most run tests tell: the audited policy, one candidate an iteration. The default search, the
# population, has tests of its own (tests/test_population.py).
LINEAGE = ["--gate-policy", "audited", "--candidates", "1"]


@pytest.fixture(autouse=True, scope="session")
def offline_env():
    """No test may reach a provider: drop real keys, make retries fast, find test scripts.
    Session-wide, so module-scoped fixtures that run whole loops see it too."""
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.endswith("_API_KEY") or key.startswith("EVOLVER_"):
                mp.delenv(key, raising=False)
        mp.setenv("EVOLVER_RETRY_WAIT", "0.01")
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        # The tests' own worker daemon: shared by the whole session, gone after it.
        mp.setenv("EVOLVER_RUNTIME_DIR", tempfile.mkdtemp(prefix="evolver-rt-"))
        mp.setenv("EVOLVER_ZYGOTE_IDLE", "120")
        # ... and no user's first: its one-time note on stderr (zygote_client._start) would otherwise fall to whichever
        # test starts it (tests/test_daemon.py checks the note in runtime folders of its own)
        zygote_client.socket_path().with_suffix(".log").touch()
        try:
            yield
        finally:
            zygote_client.stop_all()


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def init_repo(path: Path) -> Path:
    """A git repository set up by `evolver init` at ``path``, with one commit."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "test@example.invalid")
    git(path, "config", "user.name", "test")
    assert run_cli(["init", str(path)]).returncode == 0
    git(path, "add", "-A")
    git(path, "commit", "-qm", "init")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository set up by `evolver init`, with one commit."""
    return init_repo(tmp_path / "target")


def run_cli(
    args: list[str], cwd: Path | None = None, env: dict | None = None, timeout: float = 600, python: Path | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m evolver ...` as a user would, in a subprocess (with ``python``: from that environment)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [str(python or sys.executable), "-m", "evolver", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    return proc


def failed_evaluation(simulations: list, **fields):
    """An evaluation of one trial per task in which every simulation failed (reward 0), for tests that read its
    records without simulating; ``fields`` set EvalResult's own (checkout, seed, max_steps...)."""
    from evolver.data import EvalResult, EvalSummary

    n, task_ids = len(simulations), list(dict.fromkeys(s.task_id for s in simulations))
    summary = EvalSummary(
        num_tasks=len(task_ids),
        num_trials=1,
        num_simulations=n,
        scored=n,
        failed=0,
        infra_errors=0,
        avg_reward=0.0,
        pass_hat_k={},
        usage={},
        duration=1.0,
    )
    defaults = dict(run_id="r", checkout="c", domain="mock", split=None, task_ids=task_ids, trials=1, seed=1, max_steps=5, models={})
    return EvalResult(**{**defaults, **fields, "summary": summary, "simulations": list(simulations)})


def eval_json(repo: Path, *extra: str, env: dict | None = None) -> dict:
    proc = run_cli(["eval", str(repo), "--json", *SCRIPTED_MODELS, *extra], env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# The files that take longest (`pytest --durations=0`, docs/performance.md) start first: pytest-xdist hands out
# one file at a time, so a long file taken last would leave the other worker idle until it ends.
LONGEST_FIRST = (
    "test_stops.py",
    "test_gate_replay.py",
    "test_loop.py",
    "test_loop_policy.py",
    "test_ray.py",
    "test_report.py",
    "test_compare.py",
    "test_candidates.py",
    "test_hosted_models.py",
    "test_daemon.py",
    "test_local_model.py",
    "test_compat.py",
    "test_proposer.py",
    "test_bad_input.py",
    "test_kill_anywhere.py",
    "test_turns.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order is kept


# The bad-input table's totals: counted by test_bad_input in whichever process runs it (a pytest-xdist worker
# hands its counts to the controller, which prints the summary).
_BAD_INPUTS = {"cases": 0, "clean": 0}


def _bad_input_totals() -> dict:
    module = sys.modules.get("tests.test_bad_input")
    return dict(module.TOTALS) if module is not None else {"cases": 0, "clean": 0}


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker
        session.config.workeroutput["bad_inputs"] = _bad_input_totals()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    for key, value in getattr(node, "workeroutput", {}).get("bad_inputs", {}).items():
        _BAD_INPUTS[key] += value


def pytest_terminal_summary(terminalreporter):
    """The bad-input table's totals, in every run's output."""
    t = {key: _BAD_INPUTS[key] + value for key, value in _bad_input_totals().items()}
    if t["cases"]:
        terminalreporter.write_line(
            f"bad inputs: {t['clean']} of {t['cases']} answered with exit 2, one line on stderr, no traceback, nothing changed"
        )
