"""Configuration precedence and result metrics (pure, fast)."""

from __future__ import annotations

import pytest

from evolver.config import load_config
from evolver.data import RoleUsage, SimRecord
from evolver.errors import UsageError
from evolver.metrics import pass_hat_k, rewards_by_task, summarize


def test_file_then_environment_then_flags(tmp_path):
    (tmp_path / "evolver.toml").write_text('agent_model = "file-model"\nuser_model = "file-user"\ntrials = 3\napi_base = "http://file/v1"\n')
    env = {"EVOLVER_AGENT_MODEL": "env-model", "EVOLVER_TRIALS": "5"}
    cfg = load_config(tmp_path, {"agent_model": "flag-model", "trials": None}, environ=env)
    assert cfg.agent_model == "flag-model"  # flag beats env and file
    assert cfg.trials == 5  # env beats file; an unset flag changes nothing
    assert cfg.user_model == "file-user"
    assert cfg.role("agent").api_base == "http://file/v1"
    assert cfg.role("judge").model == "file-user"  # judge defaults to the user simulator's model


def test_per_role_api_base_wins(tmp_path):
    cfg = load_config(tmp_path, {"api_base": "http://shared/v1", "user_api_base": "http://user/v1"}, environ={})
    assert cfg.role("agent").litellm_args()["api_base"] == "http://shared/v1"
    assert cfg.role("user").litellm_args()["api_base"] == "http://user/v1"


@pytest.mark.parametrize("text, fragment", [("trials = 'many'", "is not a whole number"), ("colour = 1", "unknown key 'colour'"), ("trials = ", "not valid TOML")])
def test_bad_config_file_is_a_usage_error(tmp_path, text, fragment):
    (tmp_path / "evolver.toml").write_text(text)
    with pytest.raises(UsageError, match=fragment):
        load_config(tmp_path, environ={})


def _rec(task, trial, reward, outcome="ok"):
    return SimRecord(task_id=task, trial=trial, outcome=outcome, reward=reward, usage={"agent": RoleUsage(prompt_tokens=10, completion_tokens=2, cost=0.5)})


def test_pass_hat_k_follows_tau2():
    # task a: 2 of 3 trials pass; task b: 3 of 3.
    table = {"a": [1.0, 0.0, 1.0], "b": [1.0, 1.0, 1.0]}
    got = pass_hat_k(table, 3)
    assert got["1"] == pytest.approx((2 / 3 + 1) / 2)
    assert got["2"] == pytest.approx((1 / 3 + 1) / 2)  # C(2,2)/C(3,2) = 1/3
    assert got["3"] == pytest.approx((0 + 1) / 2)


def test_infra_errors_are_missing_not_zero():
    records = [_rec("a", 0, 1.0), _rec("a", 1, None, "infra_error"), _rec("b", 0, 0.0, "failed"), _rec("b", 1, 1.0)]
    assert rewards_by_task(records) == {"a": [1.0, None], "b": [0.0, 1.0]}
    s = summarize(records, num_tasks=2, num_trials=2, duration=1.0)
    assert s.avg_reward == pytest.approx(2 / 3)
    assert (s.scored, s.failed, s.infra_errors) == (3, 1, 1)
    assert s.pass_hat_k["2"] == 0.0  # only task b has two valid trials, and it failed one
    assert s.usage["agent"].prompt_tokens == 40 and s.usage["agent"].cost == pytest.approx(2.0)
