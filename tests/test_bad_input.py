"""Every bad input gets one line: a table across every command, and every checked setting from each source.

Each case runs the real CLI in a subprocess and must end with exit code 2,
exactly one line on stderr, no traceback, and the run directories and git
unchanged (nothing written that could pass for a result, nothing lost).
Files that must be unwritable are made immutable (chattr +i): the tests run as
root, for whom permission bits mean nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from evolver.config import SPECS, Config, flag_of
from evolver.config_load import load_config
from evolver.errors import UsageError
from tests.conftest import ROOT, SCRIPTED_MODELS, git, init_repo, run_cli

TOTALS = {"cases": 0, "clean": 0}  # shown in pytest's summary (tests/conftest.py)
MODELS = SCRIPTED_MODELS[:6]  # agent, user, judge: what eval needs
RUN_MODELS = [*MODELS, "--meta-model", "scripted/meta"]
SCRIPT = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:script"}
NO_MLFLOW = ROOT / "tests" / "scripts" / "no_mlflow"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A committed repository with one finished scripted run to damage copies of."""
    base = tmp_path_factory.mktemp("bad")
    repo = init_repo(base / "repo")
    proc = run_cli(
        ["run", str(repo), "--iterations", "1", "--gate-stages", "1", *RUN_MODELS, "--agent-model", "scripted/wrong"],
        env=SCRIPT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    [run] = [p.name for p in (repo / "runs").glob("run-*")]
    plain = base / "plain"  # a folder with an agent but no git
    assert run_cli(["init", str(plain)]).returncode == 0
    empty = base / "empty"  # a git repository without an agent
    empty.mkdir()
    git(empty, "init", "-q")
    totals = TOTALS
    yield {"repo": repo, "run": run, "base": base, "plain": plain, "empty": empty, "totals": totals}


def _snapshot(repo: Path) -> tuple:
    files = sorted(
        (p.relative_to(repo).as_posix(), hashlib.sha1(p.read_bytes()).hexdigest())
        for p in (repo / "runs").rglob("*")
        if p.is_file() and p.name != "lock"
    )
    refs = git(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    return files, refs, git(repo, "status", "--porcelain"), git(repo, "rev-parse", "HEAD")


def _damaged_copy(world, name: str, rel: str, content: str) -> str:
    """A copy of the finished run with one file replaced; returns its id."""
    src = world["repo"] / "runs" / world["run"]
    run_id = f"run-damaged-{name}"
    dst = world["repo"] / "runs" / run_id
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("worktrees", "lock"))
    (dst / rel).write_text(content)
    return run_id


def _immutable(path: Path):
    subprocess.run(["chattr", "+i", str(path)], check=True)
    return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)


# (id, argv with {repo} {run} {plain} {base} placeholders, fragment of the expected message, setup or None)
CASES = [
    # eval: values out of range or of the wrong type, from flags
    ("eval-trials-0", ["eval", "{repo}", "--trials", "0"], "--trials 0 must be between 1 and 1000", None),
    ("eval-trials-neg", ["eval", "{repo}", "--trials", "-3"], "between 1 and 1000", None),
    ("eval-trials-float", ["eval", "{repo}", "--trials", "1.7"], "not a whole number", None),
    ("eval-trials-word", ["eval", "{repo}", "--trials", "abc"], "not a whole number", None),
    ("eval-trials-huge", ["eval", "{repo}", "--trials", "1000000000"], "between 1 and 1000", None),
    ("eval-concurrency-0", ["eval", "{repo}", "--concurrency", "0"], "between 1 and 256", None),
    ("eval-backend-unknown", ["eval", "{repo}", "--backend", "slurm"], "--backend slurm is not one of: local, ray", None),
    ("run-candidates-0", ["run", "{repo}", "--candidates", "0"], "--candidates 0 must be between 1 and 8", None),
    ("run-candidates-huge", ["run", "{repo}", "--candidates", "40"], "--candidates 40 must be between 1 and 8", None),
    ("eval-max-steps-neg", ["eval", "{repo}", "--max-steps", "-1"], "between 1 and 1000", None),
    ("eval-timeout-nan", ["eval", "{repo}", "--worker-timeout", "nan"], "not a finite number", None),
    ("eval-timeout-inf", ["eval", "{repo}", "--worker-timeout", "inf"], "not a finite number", None),
    ("eval-timeout-neg", ["eval", "{repo}", "--worker-timeout", "-5"], "more than 0", None),
    ("eval-agent-timeout-0", ["eval", "{repo}", "--agent-timeout", "0"], "more than 0", None),
    ("eval-agent-memory-1", ["eval", "{repo}", "--agent-memory-mb", "1"], "between 64 and 65536", None),
    ("eval-seed-word", ["eval", "{repo}", "--seed", "x"], "not a whole number", None),
    ("eval-num-tasks-0", ["eval", "{repo}", "--num-tasks", "0"], "must be at least 1", None),
    ("eval-local-size", ["eval", "{repo}", "--local-size", "huge"], "--local-size huge is not one of: default, small", None),
    ("eval-unknown-flag", ["eval", "{repo}", "--bogus"], "unrecognized arguments", None),
    ("eval-task-ids-empty", ["eval", "{repo}", "--task-ids"], "expected at least one argument", None),
    ("eval-unsafe-value", ["eval", "{repo}", "--unsafe-no-sandbox=1"], "ignored explicit argument", None),
    # eval: things only tau2 or the network can tell
    ("eval-domain", ["eval", "{repo}", "--domain", "nosuch"], "unknown domain 'nosuch'", None),
    ("eval-split", ["eval", "{repo}", "--split", "trian"], "has no split 'trian'", None),
    ("eval-task-id", ["eval", "{repo}", "--task-ids", "create_task_1", "no_such_task"], "unknown task id(s) in mock: no_such_task", None),
    (
        "eval-api-base",
        ["eval", "{repo}", "--api-base", "127.0.0.1:8000/v1"],
        "the agent and user models' API base '127.0.0.1:8000/v1' is not an http(s) URL; fix --api-base",
        None,
    ),
    ("eval-missing-key", ["eval", "{repo}", "--agent-model", "gpt-4.1-mini"], "needs OPENAI_API_KEY", None),
    ("eval-plugin", ["eval", "{repo}"], "cannot import plugin 'no_such_plugin_module'", 'toml:plugins = ["no_such_plugin_module"]'),
    # eval: paths and refs
    ("eval-no-agent", ["eval", "{base}"], "no agent/agent.py", None),
    ("eval-path-is-file", ["eval", "{repo}/evolver.toml"], "no agent/agent.py", None),
    ("eval-bad-ref", ["eval", "{repo}", "--ref", "no-such-ref"], "unknown git ref 'no-such-ref'", None),
    # eval: evolver.toml
    ("toml-directory", ["eval", "{repo}"], "cannot read", "toml-dir"),
    ("toml-invalid", ["eval", "{repo}"], "is not valid TOML", "toml:trials = "),
    ("toml-unknown-key", ["eval", "{repo}"], "unknown key 'colour'", "toml:colour = 1"),
    ("toml-trials-0", ["eval", "{repo}"], "between 1 and 1000", "toml:trials = 0"),
    ("toml-trials-float", ["eval", "{repo}"], "not a whole number", "toml:trials = 1.7"),
    ("toml-concurrency-0", ["eval", "{repo}"], "between 1 and 256", "toml:concurrency = 0"),
    ("toml-max-steps", ["eval", "{repo}"], "between 1 and 1000", "toml:max_steps = -1"),
    ("toml-worker-timeout", ["eval", "{repo}"], "more than 0", "toml:worker_timeout = -5"),
    ("toml-holdout", ["eval", "{repo}"], "not one of: auto, on, off", 'toml:holdout = "maybe"'),
    ("toml-unsafe", ["eval", "{repo}"], "may only be given as the --unsafe-no-sandbox flag", "toml:unsafe_no_sandbox = true"),
    ("toml-bool-type", ["eval", "{repo}"], "not a whole number", "toml:trials = true"),
    ("toml-gate-alpha", ["eval", "{repo}"], "between 0 and 0.5", "toml:gate_alpha = 0.9"),
    ("toml-iterations-0", ["eval", "{repo}"], "between 1 and 10000", "toml:iterations = 0"),
    # eval and run: model arguments per role (evolver.toml tables, EVOLVER_<ROLE>_ARGS, --<role>-arg KEY=VALUE)
    ("toml-agent-args-key", ["eval", "{repo}"], "'api_key' is not taken here", 'toml:agent_args = {api_key = "sk-x"}'),
    ("toml-user-args-unknown", ["eval", "{repo}"], "unknown model argument 'colour'", "toml:user_args = {colour = 1}"),
    ("toml-judge-args-type", ["eval", "{repo}"], "is not a table of model arguments", "toml:judge_args = 5"),
    ("toml-reasoning-effort", ["eval", "{repo}"], "is not one of: none, minimal", 'toml:agent_reasoning_effort = "extreme"'),
    ("env-agent-args", ["eval", "{repo}"], "EVOLVER_AGENT_ARGS", "env:EVOLVER_AGENT_ARGS=max_tokens=5"),
    ("env-user-args-base", ["eval", "{repo}"], "'api_base' is not taken here", 'env:EVOLVER_USER_ARGS={{api_base = "http://127.0.0.1:9"}}'),
    ("flag-agent-arg-value", ["eval", "{repo}", "--agent-arg", "max_tokens=0"], "--agent-arg: max_tokens = 0 must be at least 1", None),
    ("flag-agent-arg-form", ["eval", "{repo}", "--agent-arg", "max_tokens"], "is not KEY=VALUE", None),
    ("flag-agent-arg-temperature", ["eval", "{repo}", "--agent-arg", "temperature=1"], "set agent_temperature instead", None),
    ("flag-meta-arg-model", ["run", "{repo}", "--meta-arg", "model=gpt-4o"], "'model' is not taken here: the model is meta_model", None),
    ("flag-extra-body-messages", ["eval", "{repo}", "--user-arg", 'extra_body={{"messages": []}}'], "may not set messages", None),
    ("flag-reasoning-effort", ["eval", "{repo}", "--agent-reasoning-effort", "extreme"], "is not one of: none", None),
    # eval and run: rate limits per model (evolver.toml's [rate_limits], EVOLVER_RATE_LIMITS, --rate-limit MODEL=RPM/TPM)
    (
        "toml-rate-limit-zero",
        ["eval", "{repo}"],
        "'openai/m' rpm = 0 is not a number more than 0",
        'toml:rate_limits = {"openai/m" = {rpm = 0}}',
    ),
    ("toml-rate-limit-key", ["eval", "{repo}"], "a limit takes rpm (requests per minute) and tpm", "toml:rate_limits = {m = {rps = 5}}"),
    ("toml-rate-limits-type", ["eval", "{repo}"], "is not a table of limits", "toml:rate_limits = 5"),
    ("env-rate-limits", ["eval", "{repo}"], "EVOLVER_RATE_LIMITS", "env:EVOLVER_RATE_LIMITS=500"),
    ("flag-rate-limit-form", ["eval", "{repo}", "--rate-limit", "openai/m"], "is not MODEL=RPM/TPM", None),
    ("flag-rate-limit-words", ["run", "{repo}", "--rate-limit", "openai/m=many"], "the limit is not RPM/TPM in numbers", None),
    ("flag-rate-limit-negative", ["eval", "{repo}", "--rate-limit", "openai/m=-5/100"], "rpm = -5 is not a number more than 0", None),
    ("run-learnings-file-missing", ["run", "{repo}", "--learnings-file", "no-such-learnings.md"], "learnings_file", None),
    (
        "run-proposer-command-not-installed",
        ["run", "{repo}", "--proposer", "command", "--proposer-command", "no-such-coder --fix"],
        "--proposer-command: no-such-coder is not installed",
        None,
    ),
    (
        "run-proposer-read-home",
        ["run", "{repo}", "--proposer", "command", "--proposer-command", "true", "--proposer-read", str(Path.home())],
        f"--proposer-read {Path.home()}: it is your home folder",
        None,
    ),
    ("resume-with-agent-arg", ["run", "{repo}", "--resume", "{run}", "--agent-arg", "seed=1"], "drop --agent-arg", None),
    ("init-from-nothing", ["init", "{base}/new", "--from", "make eval"], "nor a Life-Harness command line", None),
    ("init-from-no-checkout", ["init", "{base}/new", "--from", "{base}"], "no agent/agent.py in", None),
    # eval: EVOLVER_* variables
    ("env-trials-0", ["eval", "{repo}"], "EVOLVER_TRIALS", "env:EVOLVER_TRIALS=0"),
    ("env-concurrency", ["eval", "{repo}"], "EVOLVER_CONCURRENCY", "env:EVOLVER_CONCURRENCY=-1"),
    ("env-timeout-nan", ["eval", "{repo}"], "not a finite number", "env:EVOLVER_WORKER_TIMEOUT=nan"),
    ("env-unsafe", ["eval", "{repo}"], "may only be given as the --unsafe-no-sandbox flag", "env:EVOLVER_UNSAFE_NO_SANDBOX=1"),
    ("env-holdout", ["eval", "{repo}"], "not one of: auto, on, off", "env:EVOLVER_HOLDOUT=maybe"),
    ("env-agent-timeout", ["eval", "{repo}"], "not a finite number", "env:EVOLVER_AGENT_TIMEOUT=abc"),
    ("env-agent-memory", ["eval", "{repo}"], "not a whole number", "env:EVOLVER_AGENT_MEMORY_MB=1.5"),
    ("env-budget", ["eval", "{repo}"], "at least 0", "env:EVOLVER_BUDGET_USD=-1"),
    ("env-zygote-idle", ["eval", "{repo}"], "EVOLVER_ZYGOTE_IDLE", "env:EVOLVER_ZYGOTE_IDLE=-1"),
    ("env-runtime-file", ["eval", "{repo}"], "cannot use", "env:EVOLVER_RUNTIME_DIR={repo}/evolver.toml"),
    ("env-runtime-shared", ["eval", "{repo}"], "must be a private directory", "runtime-shared"),
    ("eval-runs-immutable", ["eval", "{repo}"], "cannot use", "immutable-runs"),
    # run
    ("run-iterations-0", ["run", "{repo}", "--iterations", "0"], "--iterations 0 must be between 1 and 10000", None),
    ("run-iterations-word", ["run", "{repo}", "--iterations", "x"], "not a whole number", None),
    ("run-stall", ["run", "{repo}", "--stall", "-1"], "at least 0", None),
    ("run-budget-usd", ["run", "{repo}", "--budget-usd", "-5"], "at least 0", None),
    ("run-max-hours", ["run", "{repo}", "--max-hours", "-1"], "at least 0", None),
    ("run-budget-tokens", ["run", "{repo}", "--budget-tokens", "-1"], "at least 0", None),
    ("run-gate-alpha", ["run", "{repo}", "--gate-alpha", "0.7"], "between 0 and 0.5", None),
    ("run-gate-min-effect", ["run", "{repo}", "--gate-min-effect", "-1"], "between 0 and 0.99", None),
    ("run-gate-stages-word", ["run", "{repo}", "--gate-stages", "1,x"], "gate_stages", None),
    ("run-gate-stages-order", ["run", "{repo}", "--gate-stages", "3,2"], "gate settings", None),
    ("run-domain", ["run", "{repo}", "--domain", "nosuch"], "unknown domain 'nosuch'", None),
    (
        "run-analysis-split",
        ["run", "{repo}", "--analysis-split", "nosuch", "--gate-split", "base"],
        "set both analysis_split and gate_split",
        None,
    ),
    ("run-not-git", ["run", "{plain}"], "is not a git repository", None),
    ("run-no-agent", ["run", "{empty}"], "no agent/agent.py", None),
    ("run-dirty", ["run", "{repo}"], "agent/ has uncommitted changes", "dirty"),
    ("run-toml-iterations", ["run", "{repo}"], "between 1 and 10000", "toml:iterations = 0"),
    ("run-toml-max-hours", ["run", "{repo}"], "at least 0", "toml:max_hours = -1"),
    ("run-toml-gate-stages", ["run", "{repo}"], "gate_stages", 'toml:gate_stages = ["x"]'),
    ("run-env-iterations", ["run", "{repo}"], "EVOLVER_ITERATIONS", "env:EVOLVER_ITERATIONS=0"),
    ("run-env-stall", ["run", "{repo}"], "EVOLVER_STALL", "env:EVOLVER_STALL=-2"),
    ("run-track-unknown", ["run", "{repo}", "--track", "wandb"], "--track wandb is not one of: off, mlflow", None),
    ("run-track-not-installed", ["run", "{repo}", "--track", "mlflow"], "pip install 'evolver[mlflow]'", "no-mlflow"),
    ("run-toml-track", ["run", "{repo}"], "track = 'yes' is not one of: off, mlflow", 'toml:track = "yes"'),
    ("run-env-track", ["run", "{repo}"], "EVOLVER_TRACK", "env:EVOLVER_TRACK=on"),
    ("run-resume-with-track", ["run", "{repo}", "--resume", "{run}", "--track", "mlflow"], "--resume keeps the settings", None),
    ("run-resume-unknown", ["run", "{repo}", "--resume", "run-nope"], "unknown run id 'run-nope'", None),
    ("run-resume-a-path", ["run", "{repo}", "--resume", "../elsewhere"], "'../elsewhere' is not a run id", None),
    ("run-resume-a-path-to-a-run", ["run", "{repo}", "--resume", "../runs/{run}"], "is not a run id", None),
    ("run-resume-with-flags", ["run", "{repo}", "--resume", "{run}", "--concurrency", "2"], "--resume keeps the settings", None),
    (
        "run-resume-budget-negative",
        ["run", "{repo}", "--resume", "{run}", "--budget-usd", "-1"],
        "--budget-usd -1 must be at least 0",
        None,
    ),
    ("run-resume-finished-new-budget", ["run", "{repo}", "--resume", "{run}", "--budget-usd", "5"], "is finished", None),
    ("run-resume-iterations-0", ["run", "{repo}", "--resume", "{run}", "--iterations", "0"], "between 1 and 10000", None),
    ("run-resume-finished", ["run", "{repo}", "--resume", "{run}"], "is finished", None),
    ("run-immutable-refs", ["run", "{repo}"], "git failed", "immutable-refs"),
    ("run-resume-corrupt-state", ["run", "{repo}", "--resume", "@state.json:{{"], "corrupt", None),
    ("run-resume-corrupt-run", ["run", "{repo}", "--resume", "@run.json:not json"], "corrupt", None),
    # history, show, rollback, status on missing or damaged runs
    ("history-unknown", ["history", "run-nope", "--repo", "{repo}"], "unknown run id 'run-nope'", None),
    ("history-corrupt-state", ["history", "@state.json:{{", "--repo", "{repo}"], "state.json is unreadable or corrupt", None),
    ("history-empty-state", ["history", "@state.json:", "--repo", "{repo}"], "state.json is unreadable or corrupt", None),
    ("history-typed-state", ["history", "@state.json:[]", "--repo", "{repo}"], "state.json is unreadable or corrupt", None),
    ("history-corrupt-run", ["history", "@run.json:{{", "--repo", "{repo}"], "run.json is unreadable or corrupt (Invalid JSON", None),
    ("history-newer-run", ["history", '@run.json:{"schema": 99}', "--repo", "{repo}"], "newer than this evolver knows", None),
    (
        "status-newer-state",
        ["status", '@state.json:{"schema": 99}', "--repo", "{repo}"],
        "state.json has schema 99, newer than this evolver knows (4)",
        None,
    ),
    (
        "show-newer-iteration",
        ["show", '@iterations/001.json:{"schema": 4}', "1", "--repo", "{repo}"],
        "the iteration record has schema 4, newer than this evolver knows (3)",
        None,
    ),
    (
        "history-corrupt-iteration",
        ["history", '@iterations/001.json:{"iteration": "x"}', "--repo", "{repo}"],
        "001.json is unreadable or corrupt",
        None,
    ),
    ("history-no-repo", ["history", "--repo", "{base}/nowhere"], "no runs in", None),
    ("show-unknown-run", ["show", "run-nope", "1", "--repo", "{repo}"], "unknown run id", None),
    ("show-bad-iteration", ["show", "{run}", "x", "--repo", "{repo}"], "neither an iteration (e.g. 3) nor a candidate", None),
    ("show-missing-iteration", ["show", "{run}", "99", "--repo", "{repo}"], "99", None),
    ("show-missing-candidate", ["show", "{run}", "1z", "--repo", "{repo}"], "iteration 1 has no candidate 1z", None),
    ("show-corrupt-iteration", ["show", "@iterations/001.json:nope", "1", "--repo", "{repo}"], "001.json is unreadable or corrupt", None),
    (
        "show-turns-unknown-task",
        ["show", "{run}", "1", "--turns", "no_such_task", "--repo", "{repo}"],
        "or holdout tasks (a task id, not a label such as T4); its analysis tasks: ",
        None,
    ),
    ("show-turns-missing-iteration", ["show", "{run}", "9", "--turns", "create_task_1", "--repo", "{repo}"], "has no iteration '9'", None),
    (
        "show-turns-missing-trial",
        ["show", "{run}", "base", "--turns", "create_task_1", "--trial", "4", "--repo", "{repo}"],
        "no trial 4",
        None,
    ),
    (
        "show-turns-trial-word",
        ["show", "{run}", "1", "--turns", "create_task_1", "--trial", "x", "--repo", "{repo}"],
        "invalid int value",
        None,
    ),
    ("rollback-unknown-run", ["rollback", "run-nope", "--to", "base", "--reason", "x", "--repo", "{repo}"], "unknown run id", None),
    ("rollback-bad-to", ["rollback", "{run}", "--to", "x", "--reason", "y", "--repo", "{repo}"], "x", None),
    ("rollback-missing-iteration", ["rollback", "{run}", "--to", "99", "--reason", "y", "--repo", "{repo}"], "99", None),
    ("rollback-no-to", ["rollback", "{run}", "--reason", "y", "--repo", "{repo}"], "the following arguments are required: --to", None),
    ("rollback-corrupt-state", ["rollback", "@state.json:{{", "--to", "base", "--reason", "y", "--repo", "{repo}"], "corrupt", None),
    ("report-unknown-run", ["report", "run-nope", "--repo", "{repo}"], "unknown run id 'run-nope'", None),
    ("report-not-a-repo", ["report", "--repo", "{plain}"], "is not a git repository", None),
    ("report-no-runs", ["report", "--repo", "{empty}"], "no runs in", None),
    ("report-corrupt-state", ["report", "@state.json:{{", "--repo", "{repo}"], "state.json is unreadable or corrupt", None),
    ("report-corrupt-run", ["report", "@run.json:[]", "--repo", "{repo}"], "run.json is unreadable or corrupt", None),
    (
        "report-corrupt-iteration",
        ["report", "@iterations/001.json:nope", "--repo", "{repo}", "--markdown"],
        "001.json is unreadable or corrupt",
        None,
    ),
    ("report-unknown-flag", ["report", "{run}", "--repo", "{repo}", "--pdf"], "unrecognized arguments: --pdf", None),
    ("report-immutable-run", ["report", "{run}", "--repo", "{repo}"], "cannot use", "immutable-run"),
    ("status-unknown", ["status", "run-nope", "--repo", "{repo}"], "unknown run id", None),
    ("status-corrupt-state", ["status", "@state.json:{{", "--repo", "{repo}"], "state.json is unreadable or corrupt", None),
    ("status-corrupt-run", ["status", "@run.json:{{", "--repo", "{repo}"], "run.json is unreadable or corrupt", None),
    (
        "status-json-corrupt",
        ["status", '@state.json:{"status": 5}', "--repo", "{repo}", "--json"],
        "state.json is unreadable or corrupt",
        None,
    ),
    # tasks, init, daemon, the top level
    ("tasks-unknown-domain", ["tasks", "nosuch"], "invalid choice", None),
    ("tasks-bad-split", ["tasks", "mock", "--split", "trian"], "has no split 'trian'", None),
    ("tasks-no-domain", ["tasks"], "name a domain (airline, retail, telecom, mock), or --triage RUN", None),
    ("init-on-a-file", ["init", "{repo}/evolver.toml"], "is a file, not a directory", None),
    ("init-exists", ["init", "{repo}"], "pass --force", None),
    (
        "compare-unknown-ref",
        ["compare", "HEAD", "no-such-ref", "--repo", "{repo}"],
        "'no-such-ref' is neither a folder nor a git ref",
        None,
    ),
    ("transfer-unknown-run", ["transfer", "run-nope", "--repo", "{repo}"], "unknown run id 'run-nope'", None),
    ("runs-no-folder", ["runs", "--repo", "{base}/nowhere"], "is not a folder", None),
    ("daemon-bogus", ["daemon", "bogus"], "invalid choice", None),
    ("daemon-missing", ["daemon"], "the following arguments are required: action", None),
    ("unknown-command", ["bogus"], "invalid choice", None),
    ("no-command", [], "a command is needed", None),
]


@pytest.mark.slow
@pytest.mark.parametrize("case_id, argv, fragment, setup", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_line_and_exit_2(world, case_id, argv, fragment, setup):
    repo, env, undo = world["repo"], dict(SCRIPT), []
    args = []
    for a in argv:
        if a.startswith("@"):  # "@file:content": a damaged copy of the finished run
            rel, _, content = a[1:].partition(":")
            a = _damaged_copy(world, case_id, rel, content.replace("{{", "{"))
        args.append(a.format(repo=repo, run=world["run"], plain=world["plain"], base=world["base"], empty=world["empty"]))
    if argv[:1] == ["eval"]:
        args += MODELS if "--agent-model" not in argv else ["--user-model", "scripted/user"]
    if argv[:1] == ["run"] and "--resume" not in argv:
        args += RUN_MODELS
    toml = repo / "evolver.toml"
    original = toml.read_text()
    if setup and setup.startswith("toml:"):
        key = setup[5:].split("=")[0].strip()
        kept = [line for line in original.splitlines() if not line.startswith(f"{key} = ")]
        toml.write_text("\n".join(kept + [setup[5:]]) + "\n")
        undo.append(lambda: toml.write_text(original))
    elif setup and setup.startswith("env:"):
        key, _, value = setup[4:].partition("=")
        env[key] = value.format(repo=repo)
    elif setup == "toml-dir":
        toml.unlink()
        toml.mkdir()
        undo.append(lambda: (toml.rmdir(), toml.write_text(original)))
    elif setup == "runtime-shared":
        shared = world["base"] / "shared-rt"
        shared.mkdir(exist_ok=True)
        shared.chmod(0o777)
        env["EVOLVER_RUNTIME_DIR"] = str(shared)
    elif setup == "immutable-runs":
        undo.append(_immutable(repo / "runs"))
    elif setup == "immutable-run":
        undo.append(_immutable(repo / "runs" / world["run"]))
    elif setup == "no-mlflow":  # a stand-in that fails to import, as an uninstalled package does
        env["PYTHONPATH"] = os.pathsep.join([str(NO_MLFLOW), os.environ["PYTHONPATH"]])
    elif setup == "immutable-refs":
        refs = repo / ".git" / "refs" / "heads" / "evolver"
        refs.mkdir(exist_ok=True)
        undo.append(_immutable(refs))
    elif setup == "dirty":
        agent = repo / "agent" / "agent.py"
        text = agent.read_text()
        agent.write_text(text + "\n# uncommitted\n")
        undo.append(lambda: agent.write_text(text))
    before = _snapshot(repo)
    try:
        proc = run_cli(args, env=env, timeout=300)
        after = _snapshot(repo)
    finally:
        for fn in reversed(undo):
            fn()
    world["totals"]["cases"] += 1
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-1500:]}"
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1, proc.stderr
    assert fragment in lines[0], lines[0]
    assert after == before  # no result written, nothing lost, git untouched
    world["totals"]["clean"] += 1


def test_every_command_meets_bad_input_in_the_table():
    """A new command joins the table, or this fails."""
    from evolver.cli.commands.parser import build_parser

    commands = set(next(a for a in build_parser()._actions if a.dest == "command").choices)
    assert commands <= {argv[0] for _, argv, _, _ in CASES if argv}


def _outside(name: str):
    """A value the setting's declaration refuses: not a choice, not positive, or past a bound."""
    spec, default = SPECS[name], getattr(Config(), name)
    if spec.choices:
        return "no-such-choice"
    low, high = spec.bounds
    step = 1 if isinstance(default, int) else 0.5
    return 0 if spec.positive else (low - step if low is not None else high + step)


CHECKED = [n for n, s in SPECS.items() if (s.choices or s.positive or s.bounds != (None, None)) and not s.flag_only]


@pytest.mark.parametrize("name", CHECKED)
def test_every_checked_setting_refuses_a_value_outside_it_from_each_source(tmp_path, name):
    """The file, the environment and the flag share one check; each names where the value came from."""
    bad = _outside(name)
    (tmp_path / "evolver.toml").write_text(f"{name} = {bad!r}\n".replace("'", '"'))
    with pytest.raises(UsageError, match=f"evolver.toml: {name} = .*; fix it"):
        load_config(tmp_path, environ={})
    (tmp_path / "evolver.toml").unlink()
    variable = "EVOLVER_" + name.upper()
    with pytest.raises(UsageError, match=f"environment variable {variable}: {name} = .*; fix it"):
        load_config(tmp_path, environ={variable: str(bad)})
    with pytest.raises(UsageError, match=f"{flag_of(name)} .*; fix it"):
        load_config(tmp_path, overrides={name: str(bad)}, environ={})
