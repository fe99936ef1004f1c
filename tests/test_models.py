"""What a request to a model may carry (evolver.models), offline and in milliseconds: litellm's own refusals
before a request leaves (it refuses what evolver used to send gpt-5, o3 and Claude), Anthropic's wire format
as litellm builds it (thinking, its budget, cache marks, thinking blocks handed back), cached tokens priced as
litellm's price map says, and the investigating proposer's conversation (the provider's message kept, the
note varied where no temperature can be). The same rules against provider-faithful servers, through the
command line: tests/test_hosted_models.py.
"""

from __future__ import annotations

import json

import pytest

from evolver import llm, models
from evolver.data import RoleModel, RoleUsage

MESSAGES = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Create a task called 'Milk'."}]
TOOL = models.PREFLIGHT_TOOL


@pytest.fixture(scope="module")
def litellm():
    llm.prepare_environment()
    import litellm

    # tau2 turns drop_params on when imported, maybe earlier in this process: litellm's own refusals need it off
    dropped, litellm.drop_params = litellm.drop_params, False
    yield litellm
    litellm.drop_params = dropped


# (model, what a role's request asks, what is sent instead of it (None: left out), what the preflight says)
CASES = [
    (
        "openai/gpt-5",
        {"temperature": 0.4, "seed": 1, "max_tokens": 1500},
        {"temperature": None, "seed": 1, "max_tokens": None, "max_completion_tokens": 1500},
        ["temperature (gpt-5 takes only 1 while it reasons)"],
    ),
    (
        "openai/o3",
        {"temperature": 0.0, "stop": ["END"], "reasoning_effort": "high"},
        {"temperature": None, "stop": ["END"], "reasoning_effort": "high"},
        ["temperature (o3 takes only 1 while it reasons)"],
    ),
    (
        "openai/gpt-5-mini",
        {"temperature": 0.0, "top_p": 0.5, "stop": ["END"]},
        {"temperature": None, "top_p": None, "stop": None},
        [
            "stop (openai's gpt-5-mini does not take it)",
            "top_p (openai's gpt-5-mini does not take it)",
            "temperature (gpt-5-mini takes only 1 while it reasons)",
        ],
    ),
    (
        "openai/gpt-4.1",
        {"temperature": 0.0, "seed": 3, "reasoning_effort": "high"},
        {"temperature": 0.0, "seed": 3, "reasoning_effort": None},
        ["reasoning_effort (openai's gpt-4.1 does not take it)"],
    ),
    (
        "anthropic/claude-sonnet-4-5",
        {"temperature": 0.4, "seed": 1, "max_tokens": 1500},
        {"temperature": 0.4, "seed": None, "max_tokens": 1500},
        ["seed (anthropic's claude-sonnet-4-5 does not take it)"],
    ),
    (
        "anthropic/claude-sonnet-4-5",
        {"temperature": 0.4, "seed": 1, "max_tokens": 1500, "reasoning_effort": "high", "tool_choice": "required"},
        {"temperature": None, "seed": None, "max_tokens": 1500 + 4096, "tool_choice": "auto"},
        [
            "seed (anthropic's claude-sonnet-4-5 does not take it)",
            "temperature (thinking takes only 1)",
            'tool_choice "required" -> auto (thinking forces no tool)',
            "max_tokens 1500 -> 5596 (above the thinking budget of 4096)",
        ],
    ),
    (
        "anthropic/claude-sonnet-4-5",
        {"temperature": 0.0, "top_p": 0.5, "thinking": {"type": "enabled", "budget_tokens": 2000}},
        {"temperature": None, "top_p": None},
        ["temperature (thinking takes only 1)", "top_p (thinking takes 0.95 to 1)"],
    ),
    # an OpenAI-compatible server's model and evolver's own providers have no model information: as they are
    (
        "openai/qwen2.5-7b",
        {"temperature": 0.0, "seed": 11, "top_p": 0.5, "reasoning_effort": "high", "max_tokens": 321},
        {"temperature": 0.0, "seed": 11, "top_p": 0.5, "reasoning_effort": "high", "max_tokens": 321},
        [],
    ),
    ("scripted/meta", {"temperature": 0.4, "seed": 2}, {"temperature": 0.4, "seed": 2}, []),
]


@pytest.mark.parametrize("model, asked, sent, said", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_request_carries_what_its_model_takes_and_says_what_it_left_out(litellm, model, asked, sent, said):
    from evolver.scripted import register

    register()
    shaped = models.shape({"model": model, "messages": MESSAGES, "api_base": "http://127.0.0.1:9/v1" if "qwen" in model else None, **asked})
    for key, value in sent.items():
        assert shaped.kwargs.get(key) == value, (key, shaped.kwargs)
    assert shaped.rules.notes() == said
    assert shaped.kwargs["messages"] is MESSAGES


@pytest.mark.parametrize(
    "model, asked",
    [
        ("openai/gpt-5", {"temperature": 0.4, "seed": 1, "max_tokens": 1500}),
        ("openai/o3", {"temperature": 0.0, "reasoning_effort": "low"}),
        ("anthropic/claude-sonnet-4-5", {"temperature": 0.0, "seed": 300}),
    ],
)
def test_litellm_refuses_what_evolver_sent_these_models_and_takes_the_shaped_request(litellm, model, asked):
    """The refusals the issue met (temperature 0.4 and a seed for gpt-5, o3's temperature 0, Claude's seed) are
    litellm's, made before the request leaves; the same request through evolver.llm.retrying is sent."""
    with pytest.raises(litellm.UnsupportedParamsError):
        litellm.completion(model=model, messages=MESSAGES, mock_response="ok", **asked)
    answer = llm.retrying(litellm.completion, 1, "meta")(model=model, messages=MESSAGES, mock_response="ok", **asked)
    assert answer.choices[0].message.content == "ok"


def test_anthropic_thinking_on_the_wire_as_litellm_builds_it(litellm):
    """What litellm posts to /v1/messages for a shaped request with thinking: the budget litellm maps the effort to,
    max_tokens above it, temperature 1 (none sent), tool choice not forced; the turn's thinking block first, unchanged,
    before its tool_use; the system prompt and the latest turns marked for the prompt cache."""
    from litellm.utils import get_optional_params

    conversation = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "thinking_blocks": [{"type": "thinking", "thinking": "why", "signature": "sig"}],
            "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": TOOL["function"]["name"], "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "done"},
    ]
    kwargs = models.shape(
        {
            "model": "anthropic/claude-sonnet-4-5",
            "messages": models.cache_marked(conversation, "anthropic/claude-sonnet-4-5", None),
            "tools": [TOOL],
            "tool_choice": "required",
            "reasoning_effort": "high",
            "temperature": 0.4,
            "max_tokens": 1500,
        }
    ).kwargs
    options = {k: v for k, v in kwargs.items() if k in ("tools", "tool_choice", "reasoning_effort", "max_tokens", "temperature")}
    body = litellm.AnthropicConfig().transform_request(
        model="claude-sonnet-4-5",
        messages=kwargs["messages"],
        headers={},
        litellm_params={},
        optional_params=get_optional_params(model="claude-sonnet-4-5", custom_llm_provider="anthropic", **options),
    )
    from litellm import constants

    assert body["thinking"] == {"type": "enabled", "budget_tokens": constants.DEFAULT_REASONING_EFFORT_HIGH_THINKING_BUDGET}
    assert body["max_tokens"] > body["thinking"]["budget_tokens"] and "temperature" not in body and body["tool_choice"]["type"] == "auto"
    assistant = body["messages"][1]["content"]
    assert assistant[0] == {"type": "thinking", "thinking": "why", "signature": "sig"} and assistant[-1]["type"] == "tool_use"
    marked = [block for block in body["system"] + [b for m in body["messages"] for b in m["content"]] if "cache_control" in block]
    assert [b["type"] for b in marked] == ["text", "text", "tool_result"]  # the system prompt, then the two latest turns
    assert "cache_control" not in conversation[0]  # the caller's conversation is not changed


def test_cache_marks_only_where_the_provider_needs_them_and_never_more_than_four():
    turns = [MESSAGES[0]] + [m for n in range(6) for m in ({"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"})]
    marked = models.cache_marked(turns, "anthropic/claude-sonnet-4-5", None)
    assert sum("cache_control" in json.dumps(m) for m in marked) == 3 <= models.MAX_CACHE_MARKS
    assert (
        "cache_control" in json.dumps(marked[0]) and "cache_control" in json.dumps(marked[-2]) and "cache_control" in json.dumps(marked[-4])
    )
    for model in ("openai/gpt-5", "gemini/gemini-2.5-pro", "scripted/meta"):  # these cache a long prefix by themselves
        assert models.cache_marked(turns, model, None) is turns


@pytest.mark.parametrize(
    "model, args, room",
    [
        ("openai/gpt-5", {}, 1500 + 2048),
        ("openai/o3", {"reasoning_effort": "high"}, 1500 + 4096),
        ("anthropic/claude-sonnet-4-5", {"reasoning_effort": "low"}, 1500 + 1024),
        ("anthropic/claude-sonnet-4-5", {}, 1500),
        ("openai/gpt-4.1", {}, 1500),
        ("openai/gpt-5.1", {"reasoning_effort": "none"}, 1500),
    ],
)
def test_a_model_that_reasons_gets_its_thinking_budget_on_top_of_the_answers_room(litellm, model, args, room):
    assert models.answer_limit(model, None, {"temperature": 0.0, **args}, 1500) == room


def test_the_thinking_blocks_of_a_tool_turn_go_back_with_it_and_nothing_else_changes(litellm):
    """A conversation rebuilt from plain data (the candidate's, tau2's) gets each remembered turn's blocks back, as they came."""
    blocks = [{"type": "thinking", "thinking": "the title must be exact", "signature": "c2lnbmVk"}]
    response = litellm.ModelResponse(
        choices=[
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "thinking_blocks": blocks,
                    "tool_calls": [
                        {"id": f"toolu_{n}", "type": "function", "function": {"name": "create_task", "arguments": "{}"}} for n in (1, 2)
                    ],
                },
            }
        ]
    )
    memory = models.ThinkingMemory()
    memory.remember(response)
    rebuilt = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "create_task", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "ok"},
        {
            "role": "assistant",
            "content": "x",
            "tool_calls": [{"id": "toolu_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
    ]
    restored = memory.restore(rebuilt)
    assert restored[2]["thinking_blocks"] == blocks and "thinking_blocks" not in rebuilt[2]
    assert restored[4] is rebuilt[4] and restored[:2] == rebuilt[:2]  # a call it never answered: unchanged
    assert models.ThinkingMemory().restore(rebuilt) is rebuilt


def test_cached_tokens_are_counted_and_priced_at_the_price_maps_cache_prices(litellm):
    """As litellm reports Anthropic's usage (prompt tokens include the cache's reads and writes) and OpenAI's (cached
    tokens among the prompt's): the counts land in RoleUsage, the dollars are litellm's, at the price map's cache prices."""
    claude = litellm.model_cost["claude-sonnet-4-5"]
    response = litellm.ModelResponse(
        model="claude-sonnet-4-5",
        choices=[{"index": 0, "message": {"role": "assistant", "content": "x"}}],
        usage={
            "prompt_tokens": 10_000,
            "completion_tokens": 100,
            "total_tokens": 10_100,
            "cache_read_input_tokens": 8_000,
            "cache_creation_input_tokens": 1_000,
            "prompt_tokens_details": {"cached_tokens": 8_000, "cache_creation_tokens": 1_000},
        },
    )
    usage = llm.usage_of(response, "anthropic/claude-sonnet-4-5")
    assert (usage.prompt_tokens, usage.cached_tokens, usage.cache_write_tokens, usage.completion_tokens) == (10_000, 8_000, 1_000, 100)
    assert usage.cost == pytest.approx(
        1_000 * claude["input_cost_per_token"]
        + 8_000 * claude["cache_read_input_token_cost"]
        + 1_000 * claude["cache_creation_input_token_cost"]
        + 100 * claude["output_cost_per_token"]
    )
    assert usage.cached_text() == "80% of the prompt cached"
    gpt = litellm.model_cost["gpt-5"]
    response = litellm.ModelResponse(
        model="gpt-5",
        choices=[{"index": 0, "message": {"role": "assistant", "content": "x"}}],
        usage={"prompt_tokens": 4_000, "completion_tokens": 10, "total_tokens": 4_010, "prompt_tokens_details": {"cached_tokens": 3_072}},
    )
    usage = llm.usage_of(response, "openai/gpt-5")
    assert usage.cached_tokens == 3_072 and usage.cache_write_tokens == 0
    assert usage.cost == pytest.approx(
        928 * gpt["input_cost_per_token"] + 3_072 * gpt["cache_read_input_token_cost"] + 10 * gpt["output_cost_per_token"]
    )
    old = RoleUsage.model_validate({"prompt_tokens": 5, "completion_tokens": 1, "cost": 0.1})  # a record made before they were counted
    assert (old.cached_tokens, old.cache_write_tokens, old.cached_text()) == (0, 0, "prompt cache not reported")
    assert old.add(usage).cached_tokens == 3_072


@pytest.mark.parametrize(
    "usage, said",
    [
        ({"prompt_tokens_details": {"cached_tokens": 0}}, "0% of the prompt cached"),  # OpenAI: it read none, and says so
        ({"cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}, "0% of the prompt cached"),  # Anthropic: the same
        ({"prompt_tokens_details": {"cached_tokens": 1_000}}, "25% of the prompt cached"),
        ({}, "prompt cache not reported"),  # a provider that never says (a local server, the scripted models)
    ],
    ids=["openai-none-read", "anthropic-none-read", "openai-some-read", "not-reported"],
)
def test_the_cached_share_says_none_read_apart_from_not_reported(litellm, usage, said):
    response = litellm.ModelResponse(
        model="gpt-5",
        choices=[{"index": 0, "message": {"role": "assistant", "content": "x"}}],
        usage={"prompt_tokens": 4_000, "completion_tokens": 10, "total_tokens": 4_010, **usage},
    )
    counted = llm.usage_of(response, "openai/gpt-5")
    assert counted.cached_text() == said and counted.add(counted).cached_text() == said
    assert RoleUsage().cached_text() == ""  # no prompt: nothing to say


# ---- the investigating proposer's conversation --------------------------------------------------------


def _turn(calls: list[tuple[str, str]], blocks=None):
    import litellm

    message = {
        "role": "assistant",
        "content": None,
        "thinking_blocks": blocks,
        "tool_calls": [{"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}} for i, n in calls],
    }
    return litellm.ModelResponse(choices=[{"index": 0, "finish_reason": "tool_calls", "message": message}])


def test_the_proposer_hands_the_providers_turn_back_as_it_came_and_answers_every_call(analysis_session, litellm, monkeypatch):
    from evolver.evolution.proposers import agent
    from evolver.evolution.proposers.prompts import Prompts
    from tests.conftest import ROOT

    blocks = [{"type": "thinking", "thinking": "read the files first", "signature": "c2ln"}]
    turns = [_turn([("toolu_a", "list_files"), ("toolu_b", "list_candidates")], blocks), _turn([("toolu_c", "list_files")])]
    seen = []

    def fake_call(role, messages, retries, **extra):
        seen.append(list(messages))
        return turns[min(len(seen), len(turns)) - 1], RoleUsage()

    monkeypatch.setattr(agent, "meta_call", fake_call)
    analysis_session(turns=2).run()
    second = seen[1]
    kept = next(m for m in second if getattr(m, "role", None) == "assistant")
    assert kept is turns[0].choices[0].message and kept.thinking_blocks == blocks  # the provider's message object itself
    answers = {m["tool_call_id"]: m["content"] for m in second if isinstance(m, dict) and m.get("role") == "tool"}
    assert set(answers) == {"toolu_a", "toolu_b"} and answers["toolu_b"] == Prompts("agent", ROOT / "prompts").short("one_at_a_time")


def test_a_model_that_takes_no_temperature_is_told_something_different_each_time_it_repeats(analysis_session, monkeypatch):
    from evolver.evolution.proposers import agent
    from evolver.evolution.proposers.prompts import Prompts
    from tests.conftest import ROOT

    asked = []

    def fake_call(role, messages, retries, **extra):
        asked.append({k: v for k, v in extra.items() if k in ("temperature", "seed")})
        return _turn([(f"toolu_{len(asked)}", "list_files")]), RoleUsage()

    monkeypatch.setattr(agent, "meta_call", fake_call)
    session = analysis_session(turns=4, meta=RoleModel(model="openai/gpt-5"))
    session.run()
    assert asked == [{"seed": n} for n in range(1, 5)]  # gpt-5 takes a seed, no temperature but 1
    answers = [
        m["content"] for m in json.loads((session.request.workdir / "transcript.json").read_text())["messages"] if m["role"] == "tool"
    ]
    again = Prompts("agent", ROOT / "prompts").shorts("again")
    told = [next(words for words in again if f"exactly this call before: {words}" in answer) for answer in answers[1:]]
    assert told == list(again[1:4])  # each repeat is told something new
    session = analysis_session(turns=3, meta=RoleModel(model="scripted/meta"))
    asked.clear()
    session.run()
    assert asked == [{"temperature": 0.4, "seed": 1}, {"temperature": 0.4, "seed": 2}, {"temperature": pytest.approx(0.6), "seed": 3}]
    answers = [
        m["content"] for m in json.loads((session.request.workdir / "transcript.json").read_text())["messages"] if m["role"] == "tool"
    ]
    assert f"exactly this call before: {again[0]}" in answers[1]


@pytest.fixture
def analysis_session(tmp_path):
    """A proposal session over a hand-made analysis evaluation (no simulation: the tools read its records)."""
    from evolver.data import SimRecord
    from evolver.evolution.evidence import Evidence
    from evolver.evolution.proposers import Budget, Request
    from evolver.evolution.proposers.agent import Session
    from tests.conftest import ROOT, failed_evaluation, init_repo

    repo = init_repo(tmp_path / "target")
    folder = tmp_path / "analysis"
    folder.mkdir()
    sim = SimRecord(task_id="create_task_1", trial=0, outcome="ok", reward=0.0, termination_reason="user_stop")
    result = failed_evaluation([sim], run_id="a", checkout=str(repo), seed=300, max_steps=30)

    def make(turns: int, meta: RoleModel = RoleModel(model="scripted/meta")) -> Session:
        request = Request(
            label="1",
            focus=(0, 1),
            parent=repo,
            evidence=Evidence(result, folder),
            learnings=[],
            guide="# Guide\n",
            identifiers=frozenset(),
            meta=meta,
            llm_retries=1,
            context_tokens=32000,
            budget=Budget(turns=turns, tokens=10**6, tries=0, seconds=120),
            workdir=tmp_path / f"proposal-{meta.model.replace('/', '-')}",
            prompts_dir=ROOT / "prompts",
        )
        return Session(request)

    return make


def test_an_anthropic_turn_kept_as_it_came_needs_no_reduction(litellm):
    """The provider's Message, put back in a conversation, is what litellm sends Anthropic: its thinking block first."""
    from litellm.utils import get_optional_params

    message = _turn([("toolu_1", "list_files")], [{"type": "thinking", "thinking": "t", "signature": "s"}]).choices[0].message
    conversation = [*MESSAGES, message, {"role": "tool", "tool_call_id": "toolu_1", "content": "agent/agent.py"}]
    body = litellm.AnthropicConfig().transform_request(
        model="claude-sonnet-4-5",
        messages=conversation,
        headers={},
        litellm_params={},
        optional_params=get_optional_params(
            model="claude-sonnet-4-5", custom_llm_provider="anthropic", tools=[TOOL], reasoning_effort="low"
        ),
    )
    assert [b["type"] for b in body["messages"][1]["content"]][0] == "thinking"


def test_the_user_simulators_cached_tokens_reach_its_usage_through_tau2s_messages(litellm):
    """tau2 keeps a completion's usage on the user's message; the worker hands it evolver's token counts (cached included)."""
    from tau2.data_model.message import UserMessage

    from evolver.evaluation.worker.recorder import _usage

    response = litellm.ModelResponse(
        choices=[{"index": 0, "message": {"role": "assistant", "content": "x"}}],
        usage={"prompt_tokens": 3_000, "completion_tokens": 20, "total_tokens": 3_020, "prompt_tokens_details": {"cached_tokens": 2_048}},
    )
    said = [UserMessage(role="user", content="hi", usage=llm.token_counts(response), cost=0.001)] * 2
    assert _usage(said, UserMessage) == RoleUsage(
        prompt_tokens=6_000, completion_tokens=40, cached_tokens=4_096, cache_reported_tokens=6_000, cost=0.002
    )
