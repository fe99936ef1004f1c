"""Configuration precedence and result metrics (pure, fast)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from evolver.config_load import load_config
from evolver.data import RoleUsage, SimRecord
from evolver.errors import UsageError
from evolver.evaluation.metrics import pass_hat_k, rewards_by_task, summarize


def test_file_then_environment_then_flags(tmp_path):
    (tmp_path / "evolver.toml").write_text(
        'agent_model = "file-model"\nuser_model = "file-user"\ntrials = 3\napi_base = "http://file/v1"\n'
    )
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


@pytest.mark.parametrize(
    "text, fragment",
    [("trials = 'many'", "is not a whole number"), ("colour = 1", "unknown key 'colour'"), ("trials = ", "not valid TOML")],
)
def test_bad_config_file_is_a_usage_error(tmp_path, text, fragment):
    (tmp_path / "evolver.toml").write_text(text)
    with pytest.raises(UsageError, match=fragment):
        load_config(tmp_path, environ={})


def _rec(task, trial, reward, outcome="ok"):
    return SimRecord(
        task_id=task,
        trial=trial,
        outcome=outcome,
        reward=reward,
        usage={"agent": RoleUsage(prompt_tokens=10, completion_tokens=2, cost=0.5)},
    )


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


def test_every_setting_is_documented_in_evolver_toml_and_the_configuration_page():
    """One declaration per setting: evolver.toml's template and the docs' tables are rendered from it,
    and the page on disk is what it renders now (run `python -m evolver.cli.settings_text docs/configuration.md`)."""
    import tomllib
    from dataclasses import fields
    from pathlib import Path

    from evolver.cli.settings_text import BEGIN, END, markdown_tables, toml_template
    from evolver.config import SPECS, Config

    keys = [f.name for f in fields(Config)]
    assert sorted(SPECS) == sorted(keys) and all(SPECS[k].help for k in keys)
    template = toml_template()
    assert tomllib.loads(template)  # valid TOML
    for key in keys:
        assert (f"{key} = " in template) is not SPECS[key].flag_only, key
    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "configuration.md").read_text()
    assert page.split(BEGIN + "\n", 1)[1].split(END, 1)[0] == markdown_tables(), "docs/configuration.md's tables are stale"
    assert all(f"| `{k}` |" in page for k in keys)
    assert "(docs/configuration.md)" in (root / "README.md").read_text(), "the README does not link to docs/configuration.md"


def test_every_flag_comes_from_a_setting_and_sets_it():
    """The parser's setting flags are the declarations': each one given on the command line reaches the
    configuration, checked; a command only has the flags its settings declare."""
    from evolver.cli.commands.parser import _overrides, build_parser
    from evolver.config import SPECS, Config, flag_of
    from evolver.config_load import load_config

    parser = build_parser()
    for command in ("eval", "run"):
        for name, spec in SPECS.items():
            flag = flag_of(name)
            if command not in spec.flags:
                with pytest.raises(SystemExit):
                    parser.parse_args([command, flag, "1"])
                continue
            default = getattr(Config(), name)
            low = spec.bounds[0]
            high = spec.bounds[1]
            number = (low + high) / 2 if low is not None and high is not None and high - low < 2 else (low or 0) + 2
            raw = spec.choices[-1] if spec.choices else {str: "x", list: "a,b", dict: "seed=7"}.get(type(default), f"{number:g}")
            if spec.style == "switch" and default is True:
                flag = "--no-" + flag[2:]
            argv = [command, flag] if spec.style in ("switch", "flag", "on_off") else [command, flag, raw]
            given = {k: v for k, v in _overrides(parser.parse_args(argv)).items() if v is not None}
            assert list(given) == [name], (command, name, given)
            cfg = load_config(Path("/nonexistent"), given, environ={})
            assert getattr(cfg, name) != default, (command, name)


@pytest.mark.parametrize("source", ["file", "env", "flag"])
@pytest.mark.parametrize(
    "key, raw, fragment",
    [
        ("trials", "0", "between 1 and 1000"),
        ("trials", "-3", "between 1 and 1000"),
        ("trials", "1.7", "not a whole number"),
        ("trials", "1000000000", "between 1 and 1000"),
        ("concurrency", "0", "between 1 and 256"),
        ("max_steps", "-1", "between 1 and 1000"),
        ("worker_timeout", "-5", "more than 0"),
        ("worker_timeout", "nan", "not a finite number"),
        ("worker_timeout", "inf", "not a finite number"),
        ("iterations", "0", "between 1 and 10000"),
        ("holdout", "maybe", "not one of: auto, on, off"),
        ("gate_min_effect", "-1", "between 0 and 0.99"),
        ("stall", "-1", "at least 0"),
        ("budget_usd", "-5", "at least 0"),
        ("max_hours", "-1", "at least 0"),
        ("budget_tokens", "-1", "at least 0"),
        ("gate_alpha", "0.7", "between 0 and 0.5"),
        ("agent_timeout", "0", "more than 0"),
        ("agent_memory_mb", "1", "between 64 and 65536"),
        ("local_size", "huge", "not one of: default, small"),
        ("track", "wandb", "not one of: off, mlflow"),
        ("local_user_adapter", "maybe", "is not true or false"),
    ],
)
def test_one_validation_for_file_environment_and_flags(tmp_path, source, key, raw, fragment):
    if source == "file":
        (tmp_path / "evolver.toml").write_text(f"{key} = {raw if raw.lstrip('-').replace('.', '').isdigit() else repr(raw)}\n")
    env = {f"EVOLVER_{key.upper()}": raw} if source == "env" else {}
    args = {key: raw} if source == "flag" else {}
    with pytest.raises(UsageError, match=fragment) as info:
        load_config(tmp_path, args, environ=env)
    assert {"file": "evolver.toml", "env": f"EVOLVER_{key.upper()}", "flag": f"--{key.replace('_', '-')}"}[source] in str(info.value)


def test_the_user_role_adapter_switch_from_file_environment_and_flag(tmp_path):
    from evolver.cli.commands.parser import _overrides, build_parser

    def adapter(overrides=None, environ=None):
        cfg = load_config(tmp_path, {**(overrides or {}), "user_model": "local"}, environ=environ or {})
        return cfg.role("user").llm_args.get("user_adapter")

    assert adapter() is True  # on by default for a local user
    assert adapter(environ={"EVOLVER_LOCAL_USER_ADAPTER": "false"}) is False
    flags = _overrides(build_parser().parse_args(["eval", "--no-local-user-adapter"]))
    assert adapter(flags) is False
    assert _overrides(build_parser().parse_args(["eval"]))["local_user_adapter"] is None  # unset flag: the file or default wins
    (tmp_path / "evolver.toml").write_text("local_user_adapter = false\n")
    assert adapter() is False
    # Only a local user carries it: API models and the other local roles get no such option.
    cfg = load_config(tmp_path, {"user_model": "gpt-4.1-mini", "agent_model": "local", "judge_model": "local"}, environ={})
    assert [cfg.role(r).llm_args for r in ("user", "agent", "judge")] == [{"temperature": 0.0}] * 3


# ---- model arguments per role -------------------------------------------------------------------


def test_model_arguments_per_role_from_file_environment_and_flags_merge_key_by_key(tmp_path):
    from evolver.cli.commands.parser import _overrides, build_parser

    (tmp_path / "evolver.toml").write_text(
        'agent_reasoning_effort = "medium"\nmeta_reasoning_effort = "high"\n\n'
        "[agent_args]\nmax_tokens = 1024\ndrop_params = true\n\n"
        "[user_args]\nextra_body = {enable_thinking = false}\n"
    )
    flags = _overrides(
        build_parser().parse_args(
            [
                "run",
                "--agent-arg",
                "max_tokens=4096",
                "--agent-arg",
                'stop=["END"]',
                "--judge-arg",
                'extra_body={"reasoning": {"enabled": false}}',
            ]
        )
    )
    cfg = load_config(tmp_path, flags, environ={"EVOLVER_AGENT_ARGS": "{seed = 7, top_p = 0.5}", "EVOLVER_USER_REASONING_EFFORT": "low"})
    assert cfg.role("agent").llm_args == {
        "temperature": 0.0,
        "reasoning_effort": "medium",
        "max_tokens": 4096,
        "drop_params": True,
        "seed": 7,
        "top_p": 0.5,
        "stop": ["END"],
    }
    assert cfg.role("user").llm_args == {"temperature": 0.0, "reasoning_effort": "low", "extra_body": {"enable_thinking": False}}
    assert cfg.role("meta").llm_args == {"temperature": 0.0, "reasoning_effort": "high"}
    # No judge model: the judge is the user's model and takes the user's arguments first, then its own.
    assert cfg.role("judge").llm_args == {"temperature": 0.0, "reasoning_effort": "low", "extra_body": {"reasoning": {"enabled": False}}}
    cfg = dataclasses.replace(cfg, judge_model="openai/judge")
    assert cfg.role("judge").llm_args == {"temperature": 0.0, "extra_body": {"reasoning": {"enabled": False}}}
    # A local role carries them too, beside the user's adapter switch.
    cfg = dataclasses.replace(cfg, user_model="local")
    assert cfg.role("user", "http://127.0.0.1:1/v1").llm_args["extra_body"] == {"enable_thinking": False}
    # Nothing set: exactly what every role sent before these settings existed.
    assert [load_config(tmp_path / "none", {}, environ={}).role(r).llm_args for r in ("agent", "user", "meta", "judge")] == [
        {"temperature": 0.0}
    ] * 4


@pytest.mark.parametrize("source", ["file", "env", "flag"])
@pytest.mark.parametrize(
    "key, item, fragment",
    [
        ("agent_args", ("api_key", '"sk-x"'), "'api_key' is not taken here: keys stay in the provider's environment variable"),
        ("user_args", ("api_base", '"http://127.0.0.1:9/v1"'), "'api_base' is not taken here: the server is api_base or user_api_base"),
        ("meta_args", ("model", '"gpt-4o"'), "'model' is not taken here: the model is meta_model"),
        ("judge_args", ("extra_headers", '{Authorization = "Bearer x"}'), "headers can carry credentials"),
        ("agent_args", ("temperature", "0.5"), "'temperature' has a setting of its own: set agent_temperature instead"),
        ("meta_args", ("reasoning_effort", '"low"'), "set meta_reasoning_effort instead"),
        ("agent_args", ("num_retries", "3"), "retries are llm_retries"),
        ("agent_args", ("colour", '"red"'), "unknown model argument 'colour'; known: drop_params, extra_body"),
        ("agent_args", ("max_tokens", "0"), "max_tokens = 0 must be at least 1"),
        ("agent_args", ("max_tokens", '"many"'), 'max_tokens = "many" is not a whole number'),
        ("user_args", ("top_p", "1.5"), "top_p = 1.5 must be between 0 and 1"),
        ("judge_args", ("reasoning_effort", '"huge"'), "is not one of: none, minimal"),
        ("agent_args", ("stop", "[]"), "is not a text or a list of 1 to 4 texts"),
        ("agent_args", ("extra_body", '{model = "gpt-4o"}'), "may not set model"),
        ("agent_args", ("extra_body", "5"), "extra_body = 5 is not a table"),
    ],
)
def test_every_bad_model_argument_is_one_line_naming_where_it_came_from(tmp_path, source, key, item, fragment):
    name, value = item
    if source == "file":
        (tmp_path / "evolver.toml").write_text(f"[{key}]\n{name} = {value}\n")
    env = {f"EVOLVER_{key.upper()}": f"{{{name} = {value}}}"} if source == "env" else {}
    flags = {key: [f"{name}={value}"]} if source == "flag" else {}
    with pytest.raises(UsageError, match=re.escape(fragment)) as info:
        load_config(tmp_path, flags, environ=env)
    message = str(info.value)
    assert "\n" not in message
    assert {"file": "evolver.toml", "env": f"EVOLVER_{key.upper()}", "flag": "--" + key.removesuffix("_args") + "-arg"}[source] in message
    if name == "api_key":
        assert "sk-x" not in message.replace("'sk-x'", "")  # a key is never echoed back but as the value refused


def test_rate_limits_from_file_environment_and_flags_merge_model_by_model(tmp_path):
    from evolver.cli.commands.parser import _overrides, build_parser

    (tmp_path / "evolver.toml").write_text(
        '[rate_limits]\n"openai/gpt-4.1-mini" = {rpm = 500, tpm = 200000}\n"openai/gpt-4.1" = {rpm = 100}\n'
    )
    flags = _overrides(build_parser().parse_args(["run", "--rate-limit", "openai/gpt-4.1=60/30000", "--rate-limit", "local/agent=/1000"]))
    cfg = load_config(tmp_path, flags, environ={"EVOLVER_RATE_LIMITS": '{"openai/o3" = {tpm = 5e4}}'})
    assert cfg.rate_limits == {
        "openai/gpt-4.1-mini": {"rpm": 500, "tpm": 200000},
        "openai/gpt-4.1": {"rpm": 60, "tpm": 30000},
        "openai/o3": {"tpm": 50000.0},
        "local/agent": {"tpm": 1000},
    }


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ("max_tokens", "is not KEY=VALUE"),
        ("=4", "is not KEY=VALUE"),
    ],
)
def test_a_malformed_model_argument_flag(tmp_path, raw, fragment):
    with pytest.raises(UsageError, match=fragment):
        load_config(tmp_path, {"agent_args": [raw]}, environ={})


def test_a_table_header_that_swallows_later_keys_is_explained(tmp_path):
    (tmp_path / "evolver.toml").write_text('[agent_args]\nmax_tokens = 5\ndomain = "retail"\n')
    with pytest.raises(UsageError, match=re.escape("unknown model argument 'domain' (a [agent_args] table holds every key below it")):
        load_config(tmp_path, {}, environ={})
    with pytest.raises(UsageError, match="is not a table"):
        load_config(tmp_path / "elsewhere", {}, environ={"EVOLVER_AGENT_ARGS": "max_tokens=5"})


def test_a_run_recorded_before_model_arguments_resumes_without_them():
    """run.json of schema 2 has none of the new keys: it opens as schema 5 with every role sending what it sent, no limit configured,
    gated per decision."""
    import dataclasses

    from evolver.config import Config
    from evolver.store.runstate import MANIFEST_SCHEMA, Manifest

    config = {
        k: v
        for k, v in dataclasses.asdict(Config()).items()
        if not k.endswith(("_args", "_reasoning_effort")) and k not in ("learnings_file", "rate_limits", "gate_policy")
    }
    config.update(agent_model="openai/a", user_model="openai/u", meta_model="openai/m")
    old = {
        "schema": 2,
        "run_id": "run-x",
        "created": 0.0,
        "repo": "/r",
        "base_commit": "c",
        "base_branch": "main",
        "config": config,
        "versions": {},
        "models": {},
        "analysis_tasks": [],
        "gate_tasks": [],
        "holdout_tasks": [],
        "split_note": "",
        "gate": {},
    }
    manifest = Manifest.model_validate(old)
    assert MANIFEST_SCHEMA == 5 and manifest.schema_version == 5
    cfg = Config(**manifest.config)
    assert [cfg.role(r).llm_args for r in ("agent", "user", "meta", "judge")] == [{"temperature": 0.0}] * 4
    assert cfg.learnings_file == "" and cfg.rate_limits == {} and json.loads(manifest.model_dump_json())["schema"] == 5
    assert cfg.gate_policy == "per-decision" and manifest.policy == {}


def test_a_built_configuration_is_final(tmp_path):
    """A value cannot change under a reader: a change is a new configuration."""
    (tmp_path / "evolver.toml").write_text("iterations = 3\n[agent_args]\nmax_tokens = 64\n")
    cfg = load_config(tmp_path, {"concurrency": 2})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.iterations = 4
    more = dataclasses.replace(cfg, iterations=4)
    assert (cfg.iterations, more.iterations, more.concurrency, more.agent_args) == (3, 4, 2, {"max_tokens": 64})
