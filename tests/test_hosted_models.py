"""The models people bring, in every role, through the command line, against local servers that speak OpenAI's
and Anthropic's wire formats and refuse what those providers refuse (tests/scripts/fake_openai.py,
fake_anthropic.py): nothing here is told to drop a parameter.

- `evolver run` with the investigating proposer keeps the fix of a planted fault (tests/scripts/planted.py: the
  scripted meta-agent reads the failing trajectory behind each server) with GPT-5, o3 and Claude, thinking off and
  on, as the meta model (thinking off: the resumed run below); with the one-shot proposer, o3 at high effort. A small
  gate: 4 analysis and 5 gate tasks, every one of which the fault fails and the fix passes.
- a wrong setting stops the command within 30 seconds in one line, exit 2, before the first simulation and
  leaving nothing behind; a provider that does not answer stops it with exit 3; mid-run (no preflight), a refused
  setting stops the run (exit 2, resumable once fixed), an outage pauses it (exit 3) and it resumes to the fix.
- every role with a plain and a reasoning model through `eval` and `compare`: the thinking blocks of the agent's
  tool-using turns go back to Anthropic through the trusted proxy, whose candidate never sees them.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.conftest import git, init_repo, run_cli
from tests.scripts.fake_anthropic import FakeAnthropic
from tests.scripts.fake_openai import FakeOpenAI
from tests.scripts.fake_server import Fault
from tests.scripts.planted import FAULTS, plant

KEYS = {"OPENAI_API_KEY": "sk-test-not-a-real-key", "ANTHROPIC_API_KEY": "sk-ant-test-not-a-real-key"}
FAULT = next(f for f in FAULTS if f.name == "early_stop")
# evolver_gen's first 4 train tasks analyse, its first 5 test tasks gate: the fault fails each, the fix passes each (p < 0.05)
SMALL_GATE = ["--exclude-tasks", ",".join(f"gen_{n:02d}" for n in [*range(4, 8), *range(13, 48)])]
SCRIPTED = ["--agent-model", "scripted/bench", "--user-model", "scripted/user", "--judge-model", "scripted/judge"]
# the per-decision gate: no screen and no end-of-run audit, which the meta model, what these runs are about, never reaches
RUN = [
    "--iterations",
    "1",
    "--candidates",
    "1",
    "--gate-stages",
    "1",
    "--gate-policy",
    "per-decision",
    "--no-holdout",
    "--concurrency",
    "8",
    *SMALL_GATE,
    *SCRIPTED,
]
META_ROLES = {"gpt-5": "meta", "o3": "meta", "claude-sonnet-4-5": "meta"}


@pytest.fixture(scope="module")
def planted(tmp_path_factory, monkeypatch_module):
    """A repository whose agent has a planted early-stop fault; the servers answer from the planted-fault script."""
    monkeypatch_module.setenv("EVOLVER_SCRIPT", "tests.scripts.planted:script")  # the servers read it in this process
    repo = init_repo(tmp_path_factory.mktemp("hosted") / "target")
    toml = repo / "evolver.toml"
    toml.write_text(toml.read_text().replace('domain = "mock"', 'domain = "evolver_gen"\nplugins = ["tests.scripts.gen_domain"]'))
    agent = repo / "agent" / "agent.py"
    agent.write_text(plant(agent.read_text(), FAULT))
    switches = repo / "agent" / "harness.toml"
    for layer in FAULT.switches:
        switches.write_text(switches.read_text().replace(f"{layer} = false", f"{layer} = true"))
    git(repo, "commit", "-qam", "planted: early stop")
    # A dry run lists the tasks: the warm worker daemon is up, as after a user's first command (its start is no preflight's)
    assert run_cli(["run", str(repo), "--dry-run", *SMALL_GATE, *SCRIPTED, "--meta-model", "scripted/meta"]).returncode == 0
    return repo


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def servers():
    with FakeOpenAI(roles=META_ROLES) as openai, FakeAnthropic(roles=META_ROLES) as anthropic:
        yield {"openai": openai, "anthropic": anthropic}


def run_of(proc) -> str:
    return re.search(r"^run (run-\S+):", proc.stderr, re.M).group(1)


def preflight_line(proc, role: str) -> str:
    return next(line for line in proc.stderr.splitlines() if line.startswith(f"preflight {role}"))


META = [  # (meta model, its flags, what its preflight line says the requests leave out)
    ("openai/gpt-5", [], "temperature (gpt-5 takes only 1 while it reasons)"),
    ("openai/o3", ["--meta-reasoning-effort", "high"], "temperature (o3 takes only 1 while it reasons)"),
    ("anthropic/claude-sonnet-4-5", [], "seed (anthropic's claude-sonnet-4-5 does not take it)"),
    ("anthropic/claude-sonnet-4-5", ["--meta-reasoning-effort", "high"], "temperature (thinking takes only 1)"),
    ("openai/o3", ["--meta-reasoning-effort", "high", "--proposer", "oneshot"], "temperature (o3 takes only 1 while it reasons)"),
]


@pytest.mark.slow
@pytest.mark.parametrize("meta, flags, said", META, ids=["gpt-5", "o3", "claude", "claude-thinking", "o3-oneshot"])
def test_run_keeps_the_planted_fix_with_each_hosted_meta_model(planted, servers, meta, flags, said):
    provider = meta.split("/")[0]
    fake = servers[provider]
    name = meta.split("/")[1]
    before = fake.requests[name]
    proc = run_cli(["run", str(planted), *RUN, "--meta-model", meta, "--meta-api-base", fake.api_base, *flags], env=KEYS, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = preflight_line(proc, "meta")
    assert line.startswith(f"preflight meta: {meta} ok") and said in line, line
    run_id = run_of(proc)
    history = json.loads(run_cli(["history", run_id, "--repo", str(planted), "--json"]).stdout)["candidates"]
    assert [(c["title"], c["verdict"]) for c in history] == [("Undo the early stop", "accepted")]
    bodies = fake.bodies_of(name)[
        before:
    ]  # (what each may carry: test_the_requests_evolver_builds_are_taken_with_litellms_drop_params_off)
    if "--meta-reasoning-effort" in flags and provider == "anthropic":  # every turn thought; each tool turn came back with its block
        assert all(b["thinking"]["type"] == "enabled" and "temperature" not in b for b in bodies)
        assert all(m["content"][0]["type"] == "thinking" for b in bodies for m in b["messages"] if m["role"] == "assistant")
    if "oneshot" in flags:
        return
    assert len(bodies) >= 7  # the preflight, then one request a turn (list, read, read, edit, try, submit)
    assert_cached(planted, run_id, written=provider == "anthropic")


def assert_cached(repo: Path, run_id: str, written: bool) -> None:
    """The proposer's growing conversation was read from the provider's prompt cache (OpenAI: by itself; Anthropic: up to
    the marks evolver placed, written once), counted in the run and shown by status, history and the report."""
    usage = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"]).stdout)["usage"]["meta"]
    assert 0 < usage["cached_tokens"] < usage["prompt_tokens"] and (usage["cache_write_tokens"] > 0) == written, usage
    status = run_cli(["status", run_id, "--repo", str(repo)]).stdout
    # the scripted agent's and customer's provider never says what it cached: said so, not left blank
    assert re.search(r"meta .*\d+% of the prompt cached", status) and re.search(r"agent .*prompt cache not reported", status), status
    cached = json.loads(run_cli(["history", run_id, "--repo", str(repo), "--json"]).stdout)["candidates"][0]["cached"]
    assert re.fullmatch(r"\d+% of the prompt cached", cached["meta"]) and cached["user"] == "prompt cache not reported", cached
    markdown = run_cli(["report", run_id, "--repo", str(repo), "--markdown"]).stdout
    assert re.search(r"meta \$[\d.]+ \([\d,]+ tokens, \d+% of the prompt cached\)", markdown)
    assert re.search(r"user \S+ \([\d,]+ tokens, prompt cache not reported\)", markdown), markdown


CLAUDE, HAIKU = "anthropic/claude-sonnet-4-5", "anthropic/claude-haiku-4-5"
SEED_LEFT_OUT = "seed (anthropic's claude-haiku-4-5 does not take it)"
SHAPED = [  # (server, settings, each role's preflight line: the model as litellm places it, what its requests leave out)
    ("openai", {}, ["agent: openai/gpt-4.1-mini", "user: openai/gpt-4.1-mini", "judge: openai/gpt-4.1-mini", "meta: openai/gpt-4.1"]),
    (
        "openai",
        {
            "agent_model": "openai/gpt-5-mini",
            "agent_reasoning_effort": "low",
            "user_model": "gpt-4.1-mini",
            "judge_model": "openai/o3",
            "meta_model": "openai/gpt-5",
        },
        [
            "agent: openai/gpt-5-mini; left out: temperature (gpt-5-mini takes only 1 while it reasons)",
            "user: openai/gpt-4.1-mini",
            "judge: openai/o3; left out: temperature (o3 takes only 1 while it reasons)",
            "meta: openai/gpt-5; left out: temperature (gpt-5 takes only 1 while it reasons)",
        ],
    ),
    (
        "openai",
        {
            "agent_model": "openai/gpt-4.1-mini",
            "user_model": "openai/gpt-4.1-mini",
            "meta_model": "openai/o3",
            "meta_reasoning_effort": "high",
            "proposer": "oneshot",
        },
        [
            "agent: openai/gpt-4.1-mini",
            "user: openai/gpt-4.1-mini",
            "judge: openai/gpt-4.1-mini",
            "meta: openai/o3; left out: temperature (o3 takes only 1 while it reasons)",
        ],
    ),
    (
        "anthropic",
        {"agent_model": CLAUDE, "agent_reasoning_effort": "low", "agent_args": {"top_p": 0.5}, "user_model": HAIKU, "meta_model": CLAUDE},
        [
            "agent: anthropic/claude-sonnet-4-5; left out: temperature (thinking takes only 1); top_p (thinking takes 0.95 to 1)",
            f"user: {HAIKU}; left out: {SEED_LEFT_OUT}",
            f"judge: {HAIKU}",
            "meta: anthropic/claude-sonnet-4-5; left out: seed (anthropic's claude-sonnet-4-5 does not take it)",
        ],
    ),
    (
        "anthropic",
        {
            "agent_model": HAIKU,
            "user_model": CLAUDE,
            "user_reasoning_effort": "low",
            "judge_model": HAIKU,
            "meta_model": CLAUDE,
            "meta_reasoning_effort": "high",
        },
        [
            f"agent: {HAIKU}",
            "user: anthropic/claude-sonnet-4-5; left out: seed (anthropic's claude-sonnet-4-5 does not take it); temperature "
            "(thinking takes only 1)",
            f"judge: {HAIKU}",
            "meta: anthropic/claude-sonnet-4-5; left out: seed (anthropic's claude-sonnet-4-5 does "
            "not take it); temperature (thinking takes only 1)",
        ],
    ),
]


@pytest.mark.parametrize(
    "server, settings, said",
    SHAPED,
    ids=["openai-defaults", "openai-reasoning", "o3-oneshot", "claude-thinking-agent", "claude-thinking-user-and-meta"],
)
def test_the_requests_evolver_builds_are_taken_with_litellms_drop_params_off(server, settings, said, monkeypatch):
    """What the hosted runs above are about, without litellm's drop_params (tau2 turns it on in every evolver process, so
    there litellm could hide what evolver sends): each role's request as evolver builds it (the preflight's, shaped like
    the real ones) is taken by a server that refuses what its provider refuses. Each preflight line names the model as
    litellm places it, default or configured, and what every role's requests leave out; and what was left out would
    have been refused: the same requests unshaped are."""
    import litellm

    from evolver.cli.preflight import RUN_ROLES, checks, preflight
    from evolver.config import Config, with_default_models

    monkeypatch.setattr(litellm, "drop_params", False)
    for name, key in KEYS.items():
        monkeypatch.setenv(name, key)
    models = {name.split("/")[-1]: "agent" for name in ("gpt-4.1-mini", "gpt-4.1", "gpt-5-mini", "gpt-5", "o3", CLAUDE, HAIKU)}
    with (FakeOpenAI if server == "openai" else FakeAnthropic)(roles=models) as fake:
        cfg, _ = with_default_models(Config(api_base=fake.api_base, **settings), environ=KEYS)
        lines = preflight(cfg, None, RUN_ROLES)
        assert [re.sub(r" ok \([\d.]+ s\)", "", line) for line in lines] == [f"preflight {line}" for line in said]
        refused = [c for c in checks(cfg, None, RUN_ROLES) if c.left_out]
        assert refused or server == "openai" and not settings
        for check in refused:
            with pytest.raises((litellm.BadRequestError, litellm.UnsupportedParamsError)):
                litellm.completion(**check.kwargs)


WRONG = [  # (command, flags, environment, exit code, the error's start): nothing is simulated, nothing is left behind
    (
        "run",
        ["--meta-model", "anthropic/claude-sonnet-4-5", "--meta-arg", 'thinking={type = "enabled", budget_tokens = 500}'],
        {},
        2,
        "meta model anthropic/claude-sonnet-4-5 refused the request (BadRequestError, 400: ",
    ),
    (
        "eval",
        ["--agent-model", "anthropic/claude-opus-4-1"],
        {},
        2,
        "agent model anthropic/claude-opus-4-1 refused the request (NotFoundError, 404: ",
    ),
    (
        "run",
        ["--meta-model", "openai/o3"],
        {"EVOLVER_LLM_RETRIES": "1"},
        3,
        "the meta model openai/o3 did not answer evolver's first request",
    ),
]


@pytest.mark.parametrize("command, flags, env, code, error", WRONG, ids=["thinking-budget", "agent-model", "down"])
def test_a_wrong_model_setting_stops_the_command_at_once_in_one_line(planted, command, flags, env, code, error):
    role = "agent" if command == "eval" else "meta"
    left = sorted(p.name for p in (planted / "runs").glob("*")), git(planted, "branch", "--list", "evolver/*")
    with FakeOpenAI(roles=META_ROLES, faults={"o3": Fault(status=503)}) as openai, FakeAnthropic(roles=META_ROLES) as anthropic:
        base = anthropic.api_base if flags[1].startswith("anthropic/") else openai.api_base
        started = time.monotonic()
        proc = run_cli(
            [command, str(planted), *SCRIPTED, *(SMALL_GATE if command == "run" else []), *flags, f"--{role}-api-base", base],
            env={**KEYS, **env},
        )
        seconds = time.monotonic() - started
    assert proc.returncode == code, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"evolver: error: {error}"), proc.stderr[-2000:]
    assert ("; fix --" in last or "; fix the" in last) if code == 2 else "try again once it answers" in last
    assert "Traceback" not in proc.stderr and "resume" not in last
    assert seconds < 30, f"{seconds:.1f} s"  # the target
    assert (
        sorted(p.name for p in (planted / "runs").glob("*")),
        git(planted, "branch", "--list", "evolver/*"),
    ) == left  # nothing left behind
    assert not re.search(r"^(run run-|measuring|evolver eval eval-)", proc.stderr, re.M)  # and nothing simulated


@pytest.mark.slow
def test_mid_run_a_refused_setting_stops_and_an_outage_pauses_then_the_run_resumes_to_the_fix(planted):
    """With the preflight off, the meta model's key refused at the first proposal stops the run at once (exit 2: no
    retry or wait can fix it; resumable once the setting is fixed); then the provider down through the retries
    pauses it (exit 3, resume once it is back); then it resumes and keeps the fix, with Claude (thinking off) as the
    meta model: no seed sent, its growing conversation marked for the cache, read on every later turn."""
    with FakeAnthropic(roles=META_ROLES, faults={"claude-sonnet-4-5": Fault(status=401)}) as fake:
        env = {**KEYS, "EVOLVER_LLM_RETRIES": "2"}
        proc = run_cli(
            ["run", str(planted), *RUN, "--no-preflight", "--meta-model", "anthropic/claude-sonnet-4-5", "--meta-api-base", fake.api_base],
            env=env,
            timeout=600,
        )
        assert proc.returncode == 2 and fake.requests["claude-sonnet-4-5"] == 1, proc.stderr[-2000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("evolver: error: meta model anthropic/claude-sonnet-4-5 refused the request (AuthenticationError, 401")
        assert "fix the provider's API key" in last and "paused" not in proc.stderr
        run_id = run_of(proc)
        status = json.loads(run_cli(["status", run_id, "--repo", str(planted), "--json"]).stdout)
        assert status["status"] == "interrupted" and "AuthenticationError" in status["stop_reason"]
        fake.faults["claude-sonnet-4-5"] = Fault(failing=1000)
        proc = run_cli(["run", str(planted), "--resume", run_id], env=env, timeout=600)
        assert proc.returncode == 3 and fake.requests["claude-sonnet-4-5"] == 3, proc.stderr[-2000:]  # two attempts, then paused
        assert "paused" in proc.stderr and f"evolver run --resume {run_id}" in proc.stderr
        fake.faults.clear()
        proc = run_cli(["run", str(planted), "--resume", run_id], env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert not any("seed" in b or "thinking" in b for b in fake.bodies_of("claude-sonnet-4-5"))
    history = json.loads(run_cli(["history", run_id, "--repo", str(planted), "--json"]).stdout)["candidates"]
    assert [(c["title"], c["verdict"]) for c in history] == [("Undo the early stop", "accepted")]
    assert_cached(planted, run_id, written=True)


def test_every_role_with_a_plain_and_a_reasoning_model_through_eval_and_compare(tmp_path):
    """eval: the agent on gpt-5-mini (reasoning), the customer on gpt-4.1-mini, the judge on o3; then the agent on Claude
    thinking (its tool turns' signed thinking blocks must come back unchanged, or the server refuses), the customer on
    Claude Haiku. compare: the customer on Claude thinking. Every simulation scored, each role's requests reached its server."""
    repo = init_repo(tmp_path / "target")
    tasks = ["--task-ids", "create_task_1,update_task_1"]
    with (
        FakeOpenAI(roles={"gpt-5-mini": "agent", "gpt-4.1-mini": "user", "o3": "judge"}) as openai,
        FakeAnthropic(roles={"claude-sonnet-4-5": "agent", "claude-haiku-4-5": "user"}) as anthropic,
        FakeAnthropic(roles={"claude-haiku-4-5": "agent", "claude-sonnet-4-5": "user"}) as customer,
    ):
        runs = [  # (server, models, what the preflight checked)
            (
                openai,
                [
                    "--agent-model",
                    "openai/gpt-5-mini",
                    "--agent-reasoning-effort",
                    "low",
                    "--user-model",
                    "openai/gpt-4.1-mini",
                    "--judge-model",
                    "openai/o3",
                ],
                ["preflight agent: openai/gpt-5-mini", "preflight user: openai/gpt-4.1-mini", "preflight judge: openai/o3"],
            ),
            (
                anthropic,
                [
                    "--agent-model",
                    "anthropic/claude-sonnet-4-5",
                    "--agent-reasoning-effort",
                    "low",
                    "--user-model",
                    "anthropic/claude-haiku-4-5",
                    "--judge-model",
                    "anthropic/claude-haiku-4-5",
                ],
                [
                    "preflight agent: anthropic/claude-sonnet-4-5",
                    "preflight user: anthropic/claude-haiku-4-5",
                    "preflight judge: anthropic/claude-haiku-4-5",
                ],
            ),
        ]
        for fake, models, checked in runs:
            proc = run_cli(["eval", str(repo), "--json", *tasks, *models, "--api-base", fake.api_base], env=KEYS)
            assert proc.returncode == 0, proc.stderr[-3000:]
            summary = json.loads(proc.stdout)
            assert summary["scored"] == 2 and summary["failed"] == summary["infra_errors"] == 0 and summary["avg_reward"] == 1.0, summary
            assert [line.split(" ok (")[0] for line in proc.stderr.splitlines() if line.startswith("preflight")] == checked, proc.stderr
        assert openai.requests["gpt-5-mini"] > 3 and openai.requests["gpt-4.1-mini"] > 3
        assert openai.requests["o3"] == 1  # the judge: its preflight (no mock task is judged in words)
        thought = [b for b in anthropic.bodies_of("claude-sonnet-4-5") if len(b["messages"]) > 2]
        assert thought and all(b["thinking"]["type"] == "enabled" for b in thought)
        assert any(m["role"] == "assistant" and m["content"][0]["type"] == "thinking" for b in thought for m in b["messages"])
        proc = run_cli(
            [
                "compare",
                "HEAD",
                str(repo),
                "--repo",
                str(repo),
                "--json",
                *tasks,
                "--agent-model",
                "anthropic/claude-haiku-4-5",
                "--user-model",
                "anthropic/claude-sonnet-4-5",
                "--user-reasoning-effort",
                "low",
                "--judge-model",
                "anthropic/claude-haiku-4-5",
                "--api-base",
                customer.api_base,
            ],
            env=KEYS,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout)["decision"] == "no evidence"
        assert all(b["thinking"]["type"] == "enabled" for b in customer.bodies_of("claude-sonnet-4-5"))
        assert customer.requests["claude-haiku-4-5"] > 4
