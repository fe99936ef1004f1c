"""Who answers for a provider's error: the classification table (evolver.llm.error_table), row by row,
and `evolver eval` through the command line against a fake OpenAI-compatible provider that fails
the customer's side in every way a provider can.

A trusted role failing (the user simulator, the judge) is the trusted side failing: an infrastructure
error, never a 0 against the candidate. What the conversation itself causes there (an overflowing
context, a content filter) is the candidate's doing: a failure, named by its side.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from evolver import llm, models
from tests.conftest import git, run_cli
from tests.scripts.fake_openai import FakeOpenAI, Fault
from tests.scripts.hostile import FLOOD

ATTEMPTS = 3
# (litellm error class, expected meaning for agent, user, judge, meta): written out here, not read
# from the code, so that a changed row in evolver.llm fails its test. "config": evolver's settings are
# wrong (no retry can fix it); "probe": the agent's 400, the candidate's unless evolver's own request with
# the same settings is refused too (tested both ways below).
EXPECTED = [
    ("RateLimitError", "retry", "retry", "retry", "retry"),
    ("Timeout", "retry", "retry", "retry", "retry"),
    ("APIConnectionError", "retry", "retry", "retry", "retry"),
    ("ServiceUnavailableError", "retry", "retry", "retry", "retry"),
    ("InternalServerError", "retry", "retry", "retry", "retry"),
    ("BadGatewayError", "retry", "retry", "retry", "retry"),
    ("APIError", "retry", "retry", "retry", "retry"),  # a server error litellm names no class for (here 503)
    ("AuthenticationError", "config", "config", "config", "config"),
    ("PermissionDeniedError", "config", "config", "config", "config"),
    ("NotFoundError", "config", "config", "config", "config"),
    ("UnsupportedParamsError", "config", "config", "config", "config"),
    ("ContextWindowExceededError", "candidate", "context_overflow", "context_overflow", "config"),
    ("ContentPolicyViolationError", "candidate", "content_policy", "content_policy", "config"),
    ("BadRequestError", "probe", "config", "config", "config"),
    ("UnprocessableEntityError", "probe", "config", "config", "config"),
]
ROWS = [(name, role, meaning) for name, *meanings in EXPECTED for role, meaning in zip(llm.ROLES, meanings)]


def _error(name: str):
    import httpx
    import litellm

    cls = getattr(litellm, name)
    if name in ("UnprocessableEntityError", "PermissionDeniedError"):  # these insist on the HTTP response
        status = {"UnprocessableEntityError": 422, "PermissionDeniedError": 403}[name]
        response = httpx.Response(status, request=httpx.Request("POST", "http://127.0.0.1/v1/chat/completions"))
        return cls(message=f"fake {name}", model="m", llm_provider="openai", response=response)
    if name == "APIError":
        return cls(status_code=503, message=f"fake {name}", model="m", llm_provider="openai")
    return cls(message=f"fake {name}", model="m", llm_provider="openai")


def _failing(exc):
    calls = []

    def completion(**kwargs):
        calls.append(kwargs)
        raise exc

    return completion, calls


@pytest.fixture(autouse=True)
def own_limiter():
    """Each test's calls in this process wait in a rate limiter of their own (what a 429 taught one test's
    lane stays with that test)."""
    from evolver import ratelimit
    from evolver.ratelimit.lanes import Limiter

    ratelimit.install(Limiter())
    yield
    ratelimit.install(None)


@pytest.mark.parametrize("name, role, meaning", ROWS, ids=[f"{n}-{r}" for n, r, _ in ROWS])
def test_each_row_of_the_error_table(name, role, meaning, monkeypatch):
    monkeypatch.setenv("EVOLVER_RATE_LIMITER", "off")  # each call on its own, as before the rate limiter: the table alone decides
    llm.prepare_environment()
    exc = _error(name)
    completion, calls = _failing(exc)
    with pytest.raises(Exception) as raised:
        llm.retrying(completion, ATTEMPTS, role)(model="openai/m", messages=[{"role": "user", "content": "hi"}], seed=7)
    got = raised.value
    if meaning == "retry":
        assert len(calls) == ATTEMPTS and isinstance(got, llm.ProviderError) and got.role == role
        assert f"after {ATTEMPTS} attempt(s)" in str(got)
    elif meaning == "config":  # at once, in one line naming the role, the model and where to fix it
        assert len(calls) == 1 and isinstance(got, llm.ConfigurationError) and got.role == role
        assert str(got).startswith(f"{role} model openai/m refused the request ({name}") and f"fake {name}" in str(got)
        assert f"fix --{role}-model" in str(got) or "fix the provider's API key" in str(got) or "fix the key's access" in str(got)
        assert "\n" not in str(got)
    elif meaning == "candidate":  # handed back as it came, for the candidate's code to handle
        assert len(calls) == 1 and got is exc
    elif meaning == "probe":  # evolver's own request with the same settings is refused too: the settings
        assert len(calls) == 2 and isinstance(got, llm.ConfigurationError) and got.role == role
        assert calls[1]["messages"] == models.preflight_messages() and calls[1]["seed"] == calls[0]["seed"]
    else:
        assert len(calls) == 1 and isinstance(got, llm.ConversationError)
        assert got.termination_reason == f"{role}_{meaning}" and got.__cause__ is exc


def test_an_agent_request_refused_for_its_messages_is_the_candidates_and_the_settings_are_probed_once():
    """A 400 on the agent's request: evolver's own short request with the same settings is answered, so the
    refusal was the candidate's messages: handed back as it came. The probe is made once per settings."""
    import litellm

    llm.prepare_environment()
    exc = litellm.BadRequestError(message="messages[3]: a tool message must follow a tool call", model="m", llm_provider="openai")
    calls = []

    def completion(**kwargs):
        calls.append(kwargs)
        if not models.is_preflight(kwargs["messages"]):
            raise exc
        return litellm.ModelResponse(choices=[{"index": 0, "message": {"role": "assistant", "content": "ok"}}])

    call = llm.retrying(completion, ATTEMPTS, "agent")
    for _ in range(2):
        with pytest.raises(litellm.BadRequestError) as raised:
            call(model="openai/probe-m", messages=[{"role": "tool", "content": "x"}], tools=[models.PREFLIGHT_TOOL], top_p=0.5)
        assert raised.value is exc
    assert len(calls) == 3 and models.is_preflight(calls[1]["messages"]) and calls[1]["tools"] == [models.PREFLIGHT_TOOL]
    assert calls[1]["top_p"] == 0.5


def test_a_configuration_error_wrapped_by_litellm_is_infrastructure_and_not_retried():
    """litellm turns an error raised inside a custom provider into an APIConnectionError (retried):
    the embedded provider's missing address must still fail at once, as the trusted side's."""
    import litellm

    llm.prepare_environment()
    wrapped = litellm.APIConnectionError(message="wrapped", model="m", llm_provider="local")
    wrapped.__context__ = llm.ConfigurationError("local/user needs api_base")
    completion, calls = _failing(wrapped)
    with pytest.raises(llm.ProviderError) as raised:
        llm.retrying(completion, ATTEMPTS, "user")(model="local/user", messages=[])
    assert len(calls) == 1 and raised.value.role == "user"


def test_an_error_that_is_no_providers_passes_through_unchanged():
    completion, calls = _failing(KeyError("a bug"))
    with pytest.raises(KeyError):
        llm.retrying(completion, ATTEMPTS, "user")(model="openai/m", messages=[])
    assert len(calls) == 1


def test_a_keyless_openai_compatible_server_gets_a_placeholder_key_never_a_real_one(monkeypatch):
    seen = []
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    call = llm.retrying(lambda **kw: seen.append(kw), 1, "agent")
    call(model="openai/qwen", api_base="http://127.0.0.1:1/v1", messages=[])
    call(model="openai/qwen", messages=[])  # OpenAI itself: its key is the user's business
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real")
    call(model="openai/qwen", api_base="http://127.0.0.1:1/v1", messages=[])
    assert seen[0]["api_key"] == "no-key" and "api_key" not in seen[1] and "api_key" not in seen[2]


def test_a_request_for_the_embedded_model_cannot_be_built_before_its_server_is_up(tmp_path):
    from pydantic import ValidationError

    from evolver.config_load import load_config
    from evolver.config_requests import eval_request, listing_request

    cfg = load_config(tmp_path, {"agent_model": "local", "user_model": "local"}, environ={})
    with pytest.raises(ValidationError, match="the agent model local/agent has no api_base"):
        eval_request(cfg, tmp_path, tmp_path / "out", local_api_base=None)
    listing_request(cfg, tmp_path, tmp_path / "out")  # listing tasks calls no model
    req = eval_request(cfg, tmp_path, tmp_path / "out", local_api_base="http://127.0.0.1:5/v1")
    assert {req.agent.api_base, req.user.api_base, req.judge.api_base} == {"http://127.0.0.1:5/v1"}


# ---- through the command line, against a fake OpenAI-compatible provider ------------------------

MODELS = ["--agent-model", "openai/agent", "--user-model", "openai/user", "--judge-model", "openai/judge"]
TASKS = ["--task-ids", "create_task_1,update_task_1"]


def fake_eval(
    repo: Path, fake: FakeOpenAI, *extra: str, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, dict | None, dict | None]:
    proc = run_cli(["eval", str(repo), "--json", *MODELS, "--api-base", fake.api_base, *TASKS, *extra], env=env)
    summary = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    result = json.loads(Path(summary["result_file"]).read_text()) if summary else None
    return proc, summary, result


def assert_real_simulations(summary: dict, result: dict) -> None:
    """The summary printed agrees with result.json, and every simulation was a real conversation:
    no provider error, the customer spoke and the agent answered."""
    assert {k: summary[k] for k in ("num_simulations", "scored", "failed", "infra_errors", "avg_reward")} == {
        k: result["summary"][k] for k in ("num_simulations", "scored", "failed", "infra_errors", "avg_reward")
    }
    assert summary["infra_errors"] == 0 and summary["num_simulations"] >= 1
    for sim in result["simulations"]:
        assert sim["outcome"] == "ok" and not sim["error"], sim
        messages = json.loads((Path(summary["result_file"]).parent / sim["trajectory_file"]).read_text())["messages"]
        assert any(m["role"] == "user" and m.get("content") for m in messages), messages
        assert any(m["role"] == "assistant" for m in messages), messages


def test_eval_and_eval_ref_through_an_openai_compatible_server(repo):
    with FakeOpenAI() as fake:
        proc, summary, result = fake_eval(repo, fake)
        assert proc.returncode == 0, proc.stderr
        assert_real_simulations(summary, result)
        assert summary["avg_reward"] == 1.0
        assert fake.requests["agent"] >= 2 and fake.requests["user"] >= 2
        (repo / "agent" / "agent.py").write_text("this is not python\n")  # the working tree is broken, the commit is not
        proc, summary, result = fake_eval(repo, fake, "--ref", "HEAD")
        assert proc.returncode == 0, proc.stderr
        assert_real_simulations(summary, result)
    assert git(repo, "status", "--porcelain").strip() == "M agent/agent.py"


@pytest.mark.parametrize(
    "fault", [Fault(status=400), Fault(status=401), Fault(status=500), Fault(drop=True)], ids=["400", "401", "500", "no-answer"]
)
def test_a_failing_customer_provider_is_an_infrastructure_error_never_the_agents(repo, fault):
    """Mid-evaluation (the preflight would have stopped the command before any simulation: tests/test_hosted_models.py)."""
    with FakeOpenAI({"user": fault}) as fake:
        proc, summary, result = fake_eval(repo, fake, "--no-preflight")
    assert proc.returncode == 4, (proc.returncode, proc.stderr)  # nothing was measured
    assert summary["infra_errors"] == summary["num_simulations"] == 2 and summary["failed"] == 0 and summary["avg_reward"] is None
    assert summary["infra_by_role"]["user"]["count"] == 2 and set(summary["infra_by_role"]) == {"user"}
    assert all(s["outcome"] == "infra_error" and s["reward"] is None and s["error_role"] == "user" for s in result["simulations"])
    assert "user: 2, first:" in proc.stderr and "nothing was measured" in proc.stderr


def test_each_roles_model_arguments_reach_its_provider_and_are_recorded(repo):
    """Per-role reasoning effort and litellm arguments, from evolver.toml and flags, reach the provider in
    the request body of that role only; result.json records them; no key reaches a body."""
    toml = repo / "evolver.toml"
    toml.write_text(
        toml.read_text() + '\nuser_reasoning_effort = "low"\n\n[agent_args]\nmax_tokens = 321\nseed = 11\n'
        "extra_body = {enable_thinking = false, chat_template_kwargs = {thinking = false}}\n"
    )
    with FakeOpenAI(
        extra_parameters={"enable_thinking", "chat_template_kwargs"}
    ) as fake:  # a Qwen server's own arguments (vLLM, DashScope)
        proc, summary, result = fake_eval(
            repo,
            fake,
            "--agent-reasoning-effort",
            "high",
            "--agent-arg",
            "top_p=0.5",
            "--user-arg",
            "max_tokens=123",
            "--user-arg",
            'stop=["###NEVER###"]',
            "--judge-arg",
            "max_tokens=77",
        )
        agent, user = fake.bodies_of("agent"), fake.bodies_of("user")
        bodies = list(fake.bodies)
    assert proc.returncode == 0, proc.stderr
    assert_real_simulations(summary, result)
    assert agent and user
    for body in agent:  # extra_body's options are merged into the body, as OpenAI's client sends them
        assert {k: body.get(k) for k in ("reasoning_effort", "max_tokens", "seed", "top_p", "temperature", "enable_thinking")} == {
            "reasoning_effort": "high",
            "max_tokens": 321,
            "seed": 11,
            "top_p": 0.5,
            "temperature": 0.0,
            "enable_thinking": False,
        }, body
        assert body["chat_template_kwargs"] == {"thinking": False} and "stop" not in body
    for body in user:
        assert {k: body.get(k) for k in ("reasoning_effort", "max_tokens", "stop")} == {
            "reasoning_effort": "low",
            "max_tokens": 123,
            "stop": ["###NEVER###"],
        }, body
        assert "top_p" not in body and "enable_thinking" not in body  # (tau2 seeds the user simulator itself)
    assert not any("api_key" in body for body in bodies)
    models = result["models"]
    assert models["agent"]["llm_args"] == {
        "temperature": 0.0,
        "reasoning_effort": "high",
        "max_tokens": 321,
        "seed": 11,
        "extra_body": {"enable_thinking": False, "chat_template_kwargs": {"thinking": False}},
        "top_p": 0.5,
    }
    assert models["user"]["llm_args"] == {"temperature": 0.0, "reasoning_effort": "low", "max_tokens": 123, "stop": ["###NEVER###"]}
    assert models["judge"]["llm_args"] == {"temperature": 0.0, "max_tokens": 77}  # a judge model of its own: none of the user's
    request = json.loads((Path(summary["result_file"]).parent / "request.json").read_text())
    assert request["agent"]["llm_args"] == models["agent"]["llm_args"]


def test_a_rate_limited_customer_is_waited_for_and_nothing_is_lost(repo):
    with FakeOpenAI({"user": Fault(rate_limited=3)}) as fake:
        proc, summary, result = fake_eval(repo, fake)
        assert fake.requests["user"] > 3
    assert proc.returncode == 0, proc.stderr
    assert_real_simulations(summary, result)
    assert summary["scored"] == 2 and summary["avg_reward"] == 1.0


def test_a_simulation_that_still_fails_after_its_retries_gets_a_second_chance_at_the_end(repo):
    """The customer's provider is down for its first call and every call gets one attempt: that simulation is an
    infrastructure error in the first pass, runs again once the grid has run, and is scored; its first line stays."""
    with FakeOpenAI({"user": Fault(failing=1)}) as fake:  # (no preflight: it would take the one failure)
        proc, summary, result = fake_eval(repo, fake, "--concurrency", "1", "--no-preflight", env={"EVOLVER_LLM_RETRIES": "1"})
    assert proc.returncode == 0, proc.stderr
    assert_real_simulations(summary, result)
    assert summary["scored"] == 2 and summary["infra_errors"] == 0
    lines = [json.loads(line) for line in (Path(summary["result_file"]).parent / "sims.jsonl").read_text().splitlines()]
    assert [line["outcome"] for line in lines] == ["infra_error", "ok", "ok"], lines
    assert lines[0]["error_role"] == "user" and (lines[0]["task_id"], lines[0]["trial"]) == (lines[2]["task_id"], lines[2]["trial"])


def test_a_conversation_that_overflows_the_customers_context_is_the_candidates_failure(repo):
    agent = repo / "agent" / "agent.py"
    agent.write_text(agent.read_text() + FLOOD)
    git(repo, "commit", "-qam", "an agent that floods the customer")
    with FakeOpenAI({"user": Fault(context_chars=40_000)}) as fake:
        proc, summary, result = fake_eval(repo, fake, "--task-ids", "update_task_1")
    assert proc.returncode == 0, proc.stderr
    [sim] = result["simulations"]
    assert sim["outcome"] == "failed" and sim["reward"] == 0.0 and sim["termination_reason"] == "user_context_overflow", sim
    assert summary["infra_errors"] == 0 and summary["failed"] == 1


@pytest.mark.slow
def test_run_through_an_openai_compatible_server(repo, monkeypatch):
    """`evolver run` as a user types it against a server: the baseline, the candidate's smoke test and
    the gate all reach it, and every simulation is a real, scored conversation."""
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:fix_first_script")  # the fake server reads it here
    with FakeOpenAI() as fake:
        # The careless agent fails some tasks, so there is something to improve (a perfect baseline ends the run at once).
        # (per-decision: the audited default's screen and end-of-run audit would only reach the same server with more of the same)
        proc = run_cli(
            [
                "run",
                str(repo),
                "--iterations",
                "1",
                "--candidates",
                "1",
                "--gate-stages",
                "1",
                "--no-holdout",
                "--gate-policy",
                "per-decision",
                *MODELS,
                "--agent-model",
                "openai/wrong",
                "--meta-model",
                "openai/meta",
                "--api-base",
                fake.api_base,
                "--meta-reasoning-effort",
                "low",
                "--meta-arg",
                "max_tokens=4321",
                "--agent-arg",
                "max_tokens=222",
            ],
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert fake.requests["meta"] >= 1 and fake.requests["wrong"] > 0 and fake.requests["user"] > 0, (
            fake.requests,
            proc.stdout + proc.stderr,
        )
        # The run's roles carry their arguments too: the meta model's win over the proposer's own max_tokens.
        assert all(b.get("reasoning_effort") == "low" and b.get("max_tokens") == 4321 for b in fake.bodies_of("meta")), fake.bodies_of(
            "meta"
        )
        assert all(b.get("max_tokens") == 222 and "reasoning_effort" not in b for b in fake.bodies_of("wrong"))
    [run_id] = [p.name for p in (repo / "runs").glob("run-*")]
    manifest = json.loads((repo / "runs" / run_id / "run.json").read_text())
    assert manifest["schema"] == 5 and manifest["config"]["meta_args"] == {"max_tokens": 4321}
    assert manifest["models"]["meta"]["llm_args"] == {"temperature": 0.0, "reasoning_effort": "low", "max_tokens": 4321}
    history = json.loads(run_cli(["history", run_id, "--repo", str(repo), "--json"]).stdout)
    assert history["candidates"][0]["verdict"] in ("accepted", "rejected"), history  # it reached the gate
    status = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"]).stdout)
    assert status["infra_errors"] == {} and status["simulations_done"] > 0
    # Every call waited for its turn in its model's rate limit, counted per lane: the meta-LLM's in the iteration's record.
    lanes = {lane.split(" @ ")[0]: tally for lane, tally in status["rate_limits"].items()}
    # mock calls no judge; the command's preflight (one request per role, before the run) is not the run's
    assert set(lanes) == {"openai/wrong", "openai/user", "openai/meta"} and all(t["calls"] > 0 for t in lanes.values()), lanes
    assert all(t["waited"] == 0 and t["limited"] == 0 for t in lanes.values()), lanes  # no limit known: nobody waited
    [iteration] = (repo / "runs" / run_id / "iterations").glob("*.json")
    # the iteration's meta calls: all the server had, but the preflight's one before the run
    assert json.loads(iteration.read_text())["rate_limits"][f"openai/meta @ {fake.api_base}"]["calls"] == fake.requests["meta"] - 1
    evals = sorted((repo / "runs" / run_id / "evals").glob("*/result-*.json"))
    assert {p.parent.name.split("-")[0] for p in evals} >= {"analysis", "reference", "iter"}
    for path in evals:
        result = json.loads(path.read_text())
        assert_real_simulations({**result["summary"], "result_file": str(path)}, result)


def test_compare_through_an_openai_compatible_server(repo):
    """`evolver compare` reaches the server for both arms, and each arm's simulations are real conversations."""
    with FakeOpenAI() as fake:
        proc = run_cli(["compare", "HEAD", str(repo), "--repo", str(repo), "--json", *MODELS, "--api-base", fake.api_base, *TASKS])
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert fake.requests["agent"] > 0 and fake.requests["user"] > 0
    record = json.loads(proc.stdout)
    assert record["decision"] == "no evidence" and record["effect"] == 0.0  # the same agent twice
    folder = Path(record["comparison_file"]).parent
    for arm in ("a", "b"):  # every simulation of both arms scored, each a real conversation
        sims = [json.loads(line) for line in (folder / arm / "sims.jsonl").read_text().splitlines()]
        assert len(sims) >= 4 and all(s["outcome"] == "ok" and s["error_role"] is None for s in sims), sims
        for sim in sims:
            messages = json.loads((folder / arm / "trajectories" / f"{sim['task_id']}__trial{sim['trial']}.json").read_text())["messages"]
            assert any(m["role"] == "user" and m.get("content") for m in messages)
            assert any(m["role"] == "assistant" for m in messages)
