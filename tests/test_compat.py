"""Coming from auto-harness or Life-Harness: an agent in auto-harness's tau-bench template shape evaluates and
evolves unchanged, moved tau2 module names resolve in the agent process only, and `evolver init --from`
converts an auto-harness checkout and a Life-Harness command line, saying what it mapped and what it left out."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evolver.config_load import load_config
from tests.conftest import LINEAGE, ROOT, git, run_cli

FIXTURE = ROOT / "tests" / "fixtures" / "auto_harness"  # an auto-harness checkout: agent/, experiment_config.yaml, workspace/
SCRIPTED = ["--agent-model", "scripted/agent", "--user-model", "scripted/user", "--judge-model", "scripted/judge"]
TASKS = ["--task-ids", "create_task_1,update_task_1,impossible_task_1"]


def converted(tmp_path: Path, name: str = "target") -> tuple[Path, subprocess.CompletedProcess]:
    """`evolver init --from` the fixture checkout into a fresh git repository, committed."""
    repo = tmp_path / name
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "test@example.invalid")
    git(repo, "config", "user.name", "test")
    proc = run_cli(["init", str(repo), "--from", str(FIXTURE)])
    assert proc.returncode == 0, proc.stderr
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "from auto-harness")
    return repo, proc


def test_init_from_an_auto_harness_checkout(tmp_path):
    repo, proc = converted(tmp_path)
    out = proc.stdout
    # Its agent as it is, its template as the pristine baseline; none of evolver's layers or skills.
    assert (repo / "agent" / "agent.py").read_bytes() == (FIXTURE / "agent" / "agent.py").read_bytes()
    assert (repo / "agent" / "templates" / "tau_bench.py").is_file()
    assert not (repo / "agent" / "harness.toml").exists() and not (repo / "agent" / "skills").exists()
    assert (repo / "learnings.md").read_text() == (FIXTURE / "workspace" / "learnings.md").read_text()
    cfg = load_config(repo, environ={})
    assert (cfg.domain, cfg.analysis_split, cfg.gate_split, cfg.concurrency) == ("retail", "train", "test", 3)
    assert (cfg.agent_model, cfg.user_model) == ("gpt-5.4", "gpt-5.4")  # auto-harness simulates the user with the agent's model
    assert cfg.agent_reasoning_effort == "medium" and cfg.user_reasoning_effort == ""
    assert cfg.role("agent").llm_args == {"temperature": 0.0, "reasoning_effort": "medium"}  # what gpt-5.4 does not take is left out
    assert cfg.learnings_file == "learnings.md"
    mapped, _, left = out.partition("left out")
    for line in (
        'domain: retail -> domain = "retail"',
        'split: train -> analysis_split = "train"',
        'gate_split: test -> gate_split = "test"',
        'agent_model: gpt-5.4 -> agent_model = "gpt-5.4"',
        "max_concurrency: 3 -> concurrency = 3",
        'reasoning_effort: medium -> agent_reasoning_effort = "medium"',
        "workspace/learnings.md -> learnings_file",
    ):
        assert line in mapped, out
    assert "threshold: 0.8:" in left and "meta model: auto-harness has none" in left, out


def test_the_auto_harness_shaped_agent_evaluates_unchanged(tmp_path):
    """The fixture scores like evolver's own template with the competent scripted agent: 3/3."""
    repo, _ = converted(tmp_path)
    proc = run_cli(["eval", str(repo), "--json", "--domain", "mock", *SCRIPTED, *TASKS])
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["num_simulations"], summary["scored"], summary["failed"], summary["infra_errors"], summary["avg_reward"]) == (
        3,
        3,
        0,
        0,
        1.0,
    )
    result = json.loads(Path(summary["result_file"]).read_text())
    assert result["models"]["agent"]["llm_args"] == {"temperature": 0.0, "reasoning_effort": "medium"}
    assert result["harness"] == {} and result["isolation"]["mode"] == "sandbox"


def test_the_agent_process_reads_the_names_and_no_key(tmp_path):
    """A probe in the fixture's turn: the environment holds the configured model's name and effort, and nothing else."""
    repo, _ = converted(tmp_path)
    agent = repo / "agent" / "agent.py"
    probe = textwrap.indent(
        textwrap.dedent("""\
        expected = {"HOME", "TMPDIR", "PATH", "LANG", "AGENT_MODEL", "AGENT_REASONING_EFFORT"}
        if set(os.environ) != expected or (AGENT_MODEL, os.environ["AGENT_REASONING_EFFORT"]) != ("scripted/agent", "low"):
            raise RuntimeError(f"environment: {sorted(os.environ)} {AGENT_MODEL}")
    """),
        " " * 8,
    )
    anchor = '        effort = os.environ.get("AGENT_REASONING_EFFORT", "")\n'
    assert anchor in agent.read_text()
    agent.write_text(agent.read_text().replace(anchor, probe + anchor))
    git(repo, "commit", "-qam", "probe")
    proc = run_cli(
        ["eval", str(repo), "--json", "--domain", "mock", *SCRIPTED, *TASKS, "--agent-reasoning-effort", "low"],
        env={"OPENAI_API_KEY": "sk-compat-canary"},
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    result = json.loads(Path(summary["result_file"]).read_text())
    assert summary["avg_reward"] == 1.0 and summary["failed"] == 0, [s["error"] for s in result["simulations"]]


def test_moved_tau2_names_resolve_in_the_agent_process_only():
    """tau2.agent.base_agent is the installed tau2's tau2.agent.base once an agent process installs the finder;
    the trusted side (this process, like the worker) never has it, and a name tau2 never had stays unknown."""
    import importlib.util

    assert importlib.util.find_spec("tau2.agent.base_agent") is None
    code = textwrap.dedent("""\
        import importlib.util
        from evolver.evaluation import tau2_compat
        tau2_compat.install(); tau2_compat.install()
        import tau2.agent.base as installed
        from tau2.agent.base_agent import HalfDuplexAgent, ValidAgentInputMessage, is_valid_agent_history_message, AgentError
        assert HalfDuplexAgent is installed.LocalAgent and ValidAgentInputMessage is installed.ValidAgentInputMessage
        assert is_valid_agent_history_message is installed.is_valid_agent_history_message and AgentError is installed.AgentError
        import tau2.agent.llm_agent  # a real module is found as always, first
        assert tau2.agent.llm_agent.__spec__.origin.endswith("llm_agent.py")
        assert importlib.util.find_spec("tau2.agent.no_such_module") is None
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.slow
def test_a_short_run_evolves_the_auto_harness_agent(tmp_path):
    """`evolver run` on the converted checkout: the baseline, a candidate that passes the scan with the fixture's
    environment reads and model fallback in it, and the gate; the learnings brought along reach the proposer."""
    repo, _ = converted(tmp_path)
    proc = run_cli(
        [
            "run",
            str(repo),
            "--iterations",
            "1",
            *LINEAGE,
            "--gate-stages",
            "1",
            "--no-holdout",
            "--domain",
            "mock",
            "--analysis-split",
            "",
            "--gate-split",
            "",
            *SCRIPTED,
            "--agent-model",
            "scripted/wrong",
            "--meta-model",
            "scripted/meta",
            "--proposer",
            "oneshot",
        ],
        env={"EVOLVER_SCRIPT": "tests.scripts.loop_cases:learned_fix_script"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run_dir] = (repo / "runs").glob("run-*")
    history = json.loads(run_cli(["history", run_dir.name, "--repo", str(repo), "--json"]).stdout)
    [candidate] = history["candidates"]
    assert candidate["verdict"] in ("accepted", "rejected"), candidate  # it reached the gate: the scan did not refuse it
    branch = json.loads((run_dir / "iterations" / "001.json").read_text())["candidates"][0]["branch"]
    evolved = git(repo, "show", f"{branch}:agent/agent.py")
    assert "Use the exact title the user gives." in evolved
    for kept in ('os.environ.get("AGENT_MODEL", "")', "from tau2.agent.base_agent import", "model=self.llm or AGENT_MODEL"):
        assert kept in evolved
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["models"]["agent"]["llm_args"]["reasoning_effort"] == "medium"
    # The scripted meta-LLM proposes only when the learnings brought along are in its prompt: they reached it.
    assert (run_dir / "prior-learnings.md").read_text().strip() == (FIXTURE / "workspace" / "learnings.md").read_text().strip()


LIFE_HARNESS = (
    "uv run python scripts/eval_harness.py --domain retail --split test --num-trials 3 --nl --agent-llm openai/qwen3-4b "
    "--agent-api-base http://127.0.0.1:30001/v1 --user-llm openai/qwen-plus --user-api-base "
    "https://dashscope.aliyuncs.com/compatible-mode/v1 --user-disable-thinking --enabled --h2 --h3 --h5 --h5-top-k 1 "
    "--concurrency 6 --agent-max-tokens 1024 --output retail/harness --task-ids 3 4"
)


def test_init_from_a_life_harness_command_line(tmp_path):
    target = tmp_path / "lh"
    proc = run_cli(["init", str(target), "--from", LIFE_HARNESS])
    assert proc.returncode == 0, proc.stderr
    switches = (target / "agent" / "harness.toml").read_text()
    for layer, on in (
        ("h2_action_realization", "true"),
        ("h3_environment_contract", "true"),
        ("h4_trajectory_regulation", "false"),
        ("h5_procedural_skills", "true"),
    ):
        assert f"{layer} = {on}" in switches.replace("  ", " ").replace("  ", " "), switches
    agent = (target / "agent" / "agent.py").read_text()
    assert "\nH5_TOP_K = 1\n" in agent and "\nH5_TOP_K = 2\n" in (target / "agent" / "templates" / "tau_bench.py").read_text()
    cfg = load_config(target, environ={})
    assert (cfg.domain, cfg.split, cfg.trials, cfg.concurrency, cfg.max_steps) == ("retail", "test", 3, 6, 200)
    assert (cfg.agent_model, cfg.agent_api_base, cfg.user_model) == ("openai/qwen3-4b", "http://127.0.0.1:30001/v1", "openai/qwen-plus")
    assert cfg.role("agent").llm_args == {"temperature": 0.0, "max_tokens": 1024}
    assert cfg.role("user").llm_args == {"temperature": 0.0, "extra_body": {"enable_thinking": False}}
    mapped, _, left = proc.stdout.partition("left out")
    for line in (
        "--h2 -> agent/harness.toml h2_action_realization = true",
        "--h5-top-k 1 -> H5_TOP_K = 1 in agent/agent.py",
        "--trials 3 -> trials = 3",
        "--concurrency 6 -> concurrency = 6",
        "--max-steps 200 -> max_steps = 200 (Life-Harness's default)",
        "--agent-max-tokens 1024 -> [agent_args] max_tokens = 1024",
        "[user_args] extra_body = {enable_thinking = false}",
    ):
        assert line in mapped, proc.stdout
    for line in ("--nl: no equivalent", "--output:", "--task-ids: a flag of `evolver eval`", "domain rule sets"):
        assert line in left, proc.stdout


def test_life_harness_layers_need_its_master_switch_and_a_script_file_works(tmp_path):
    script = tmp_path / "run_bench.sh"
    script.write_text(
        "#!/usr/bin/env bash\n# telecom\nuv run python scripts/eval_harness.py \\\n  --domain telecom --split train \\\n"
        "  --h2 --h3 --h4 --h5 --h5-top-k 1 \\\n  --concurrency 10\n"
    )
    proc = run_cli(["init", str(tmp_path / "t"), "--from", str(script)])
    assert proc.returncode == 0, proc.stderr
    assert "true" not in (tmp_path / "t" / "agent" / "harness.toml").read_text().replace("# ", "")  # no --enabled: all off
    assert "(without --enabled Life-Harness leaves it off)" in proc.stdout and "--h5-top-k 1: H5 is off" in proc.stdout
    assert load_config(tmp_path / "t", environ={}).domain == "telecom"
    script.write_text(script.read_text() + "python scripts/eval_harness.py --domain airline\n")
    proc = run_cli(["init", str(tmp_path / "u"), "--from", str(script)])
    assert proc.returncode == 2 and "holds 2 eval_harness.py command lines" in proc.stderr and not (tmp_path / "u").exists()


def test_files_of_agent_beside_agent_py_are_said_to_stay_behind(tmp_path):
    source = tmp_path / "auto-harness"
    shutil.copytree(FIXTURE, source)
    (source / "agent" / "helpers").mkdir()
    (source / "agent" / "helpers" / "__init__.py").write_text("import subprocess\n")  # BIRD-Interact's helpers start processes
    proc = run_cli(["init", str(tmp_path / "target"), "--from", str(source)])
    assert proc.returncode == 0 and "agent/helpers: not brought, only agent/agent.py is" in proc.stdout, proc.stdout + proc.stderr
    assert not (tmp_path / "target" / "agent" / "helpers").exists()


@pytest.mark.parametrize(
    "change, fragment",
    [
        (("experiment_config.yaml", 'benchmark: "terminal-bench"\nagent_model: "gpt-5.4"\n'), "set up for benchmark 'terminal-bench'"),
        (("experiment_config.yaml", "benchmark: tau-bench\ndomain: banking\n"), "domain 'banking' is not a tau2 domain"),
        (
            ("experiment_config.yaml", "domain: retail\nmax_concurrency: 0\n"),
            "(max_concurrency: 0): concurrency = 0 must be between 1 and 256",
        ),
        (("experiment_config.yaml", "domain: retail\nreasoning_effort: extreme\n"), "agent_reasoning_effort = 'extreme' is not one of"),
        (("experiment_config.yaml", "domain: [retail\n"), "is not readable YAML"),
        (("experiment_config.yaml", None), "no experiment_config.yaml in"),
        (("agent/agent.py", None), "no agent/agent.py in"),
    ],
)
def test_a_bad_auto_harness_checkout_is_one_line_and_writes_nothing(tmp_path, change, fragment):
    source = tmp_path / "auto-harness"
    shutil.copytree(FIXTURE, source)
    rel, text = change
    if text is None:
        (source / rel).unlink()
    else:
        (source / rel).write_text(text)
    proc = run_cli(["init", str(tmp_path / "target"), "--from", str(source)])
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and fragment in proc.stderr, proc.stderr
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize(
    "command, fragment",
    [
        ("python scripts/eval_harness.py --trials many", "--from: argument --trials"),
        ("python scripts/eval_harness.py --concurrency 0", "concurrency = 0 must be between 1 and 256"),
        ("python scripts/eval_harness.py --enabled --h5 --h5-top-k 0", "--h5-top-k 0 must be at least 1"),
        ("python scripts/eval_harness.py --agent-max-tokens -5", "max_tokens = -5 must be at least 1"),
        ("python scripts/eval_harness.py --domain 'retail", "does not parse"),
        ("make eval", "not a directory (an auto-harness checkout) nor a Life-Harness command line"),
    ],
)
def test_a_bad_life_harness_command_line_is_one_line(tmp_path, command, fragment):
    proc = run_cli(["init", str(tmp_path / "target"), "--from", command])
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and fragment in proc.stderr, proc.stderr
    assert not (tmp_path / "target").exists()
