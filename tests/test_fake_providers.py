"""The provider-faithful fake servers (tests/scripts/fake_openai.py, fake_anthropic.py, fake_gemini.py) refuse
what the real providers refuse and take what they take: the proof that a test run against them proves something.

Each rule is shown through litellm (the client evolver uses) pointed at the server; where litellm itself refuses
before sending, the server is also asked directly over HTTP. No tau2 simulation: one request is milliseconds.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from evolver.llm import prepare_environment
from tests.scripts import fake_openai, gemini_rules
from tests.scripts.fake_anthropic import FakeAnthropic
from tests.scripts.fake_gemini import FakeGemini
from tests.scripts.fake_openai import FakeOpenAI
from tests.scripts.fake_server import REDACTED, Fault
from tests.scripts.meta_agent import Fix, investigate

KEY = "sk-test-0123456789-not-a-real-key"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "create_task",
            "description": "Create a task for a user.",
            "parameters": {
                "type": "object",
                "properties": {"user_id": {"type": "string"}, "title": {"type": "string"}},
                "required": ["user_id", "title"],
            },
        },
    }
]
ASK = "Hi, please create a task called 'Buy milk' for user_1."
POLICY = "You are a task manager's agent. Follow the policy: create tasks with the exact title the user gives. " * 60  # > 1,024 tokens


@pytest.fixture(scope="module")
def litellm():
    prepare_environment()  # no price list from the network
    import litellm

    # tau2 sets drop_params on import (tau2.utils.llm_utils), and an earlier test in the same process may
    # have imported it: these tests are about litellm's own refusals, made with it off
    dropped, litellm.drop_params = litellm.drop_params, False
    yield litellm
    litellm.drop_params = dropped


def conversation(system: str = "You are an agent.") -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": ASK}]


def post(url: str, body: dict, headers: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


def no_key_kept(fake) -> None:
    """Every request carried the key; none was kept."""
    assert fake.received and KEY not in json.dumps([r.__dict__ for r in fake.received])
    assert all(REDACTED in r.headers.values() for r in fake.received)


# ---- OpenAI ---------------------------------------------------------------------------------

OPENAI_ROLES = {
    name: "agent" for name in ("gpt-5", "gpt-5-mini", "gpt-5.1", "gpt-5-chat-latest", "o3", "o4-mini", "gpt-4.1", "gpt-4.1-mini")
}


@pytest.fixture(scope="module")
def openai():
    with FakeOpenAI(roles=OPENAI_ROLES) as fake:
        yield fake


def openai_post(fake: FakeOpenAI, body: dict, key: str | None = KEY) -> tuple[int, dict]:
    return post(
        fake.api_base + "/chat/completions", {"messages": conversation(), **body}, {"Authorization": f"Bearer {key}"} if key else {}
    )


def test_openai_reasoning_model_answers_a_request_shaped_for_it(openai, litellm):
    reply = litellm.completion(
        model="openai/gpt-5",
        messages=conversation(),
        tools=TOOLS,
        reasoning_effort="low",
        max_tokens=3000,
        api_base=openai.api_base,
        api_key=KEY,
    )
    [call] = reply.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("create_task", {"user_id": "user_1", "title": "Buy milk"})
    assert reply.usage.completion_tokens_details.reasoning_tokens == 128 and reply.usage.completion_tokens > 128
    sent = openai.bodies_of("gpt-5")[-1]  # litellm renamed the token limit to the one reasoning models take
    assert sent["max_completion_tokens"] == 3000 and "max_tokens" not in sent and "temperature" not in sent
    assert openai.received[-1].path == "/v1/chat/completions"
    no_key_kept(openai)


@pytest.mark.parametrize("model", ["gpt-5", "gpt-5-mini", "o3", "o4-mini"])
def test_openai_reasoning_models_take_temperature_1_only(openai, litellm, model):
    before = openai.requests[model]
    with pytest.raises(litellm.UnsupportedParamsError):  # litellm refuses before sending, with drop_params off
        litellm.completion(model=f"openai/{model}", messages=conversation(), temperature=0.4, api_base=openai.api_base, api_key=KEY)
    assert openai.requests[model] == before
    status, answer = openai_post(openai, {"model": model, "temperature": 0.4})  # and so does the server
    assert status == 400 and answer["error"] == {
        "message": "Unsupported value: 'temperature' does not support 0.4 with this model. Only the default (1) value is supported.",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "unsupported_value",
    }
    assert openai_post(openai, {"model": model, "temperature": 0.0})[1]["error"]["message"].startswith(
        "Unsupported value: 'temperature' does not support 0.0 with"
    )  # quoted as sent
    assert openai_post(openai, {"model": model, "temperature": 1})[0] == 200


def test_openai_models_without_reasoning_take_any_temperature_and_gpt_5_1_while_it_does_not_reason(openai):
    for model in ("gpt-4.1", "gpt-5-chat-latest", "gpt-5.1"):
        assert openai_post(openai, {"model": model, "temperature": 0.4})[0] == 200, model
    assert openai_post(openai, {"model": "gpt-5.1", "temperature": 0.4, "reasoning_effort": "none"})[0] == 200
    status, answer = openai_post(openai, {"model": "gpt-5.1", "temperature": 0.4, "reasoning_effort": "low"})
    assert status == 400 and answer["error"]["param"] == "temperature"


def test_openai_refuses_max_tokens_top_p_and_efforts_a_model_lacks(openai, litellm):
    status, answer = openai_post(openai, {"model": "gpt-5", "max_tokens": 100})
    assert status == 400 and answer["error"] == {
        "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": "unsupported_parameter",
    }
    assert openai_post(openai, {"model": "gpt-4.1", "max_tokens": 100})[0] == 200
    status, answer = openai_post(openai, {"model": "o3", "top_p": 0.5})
    assert status == 400 and answer["error"]["message"] == "Unsupported parameter: 'top_p' is not supported with this model."
    status, answer = openai_post(openai, {"model": "gpt-4.1", "reasoning_effort": "low"})
    assert status == 400 and answer["error"] == {
        "message": "Unrecognized request argument supplied: reasoning_effort",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(
        litellm.BadRequestError, match="does not support 'minimal' with this model. Supported values are: 'low', 'medium', and 'high'."
    ):
        litellm.completion(model="openai/o3", messages=conversation(), reasoning_effort="minimal", api_base=openai.api_base, api_key=KEY)
    assert openai_post(openai, {"model": "gpt-5", "reasoning_effort": "minimal"})[0] == 200
    with FakeOpenAI() as compatible:  # a vLLM or llama.cpp model name: an OpenAI-compatible server takes what it is sent
        assert openai_post(compatible, {"model": "agent", "reasoning_effort": "low", "max_tokens": 50, "temperature": 0.3})[0] == 200


def test_openai_reasoning_spends_the_completion_budget_before_the_answer(openai, litellm):
    reply = litellm.completion(
        model="openai/gpt-5",
        messages=conversation(),
        tools=TOOLS,
        reasoning_effort="high",
        max_tokens=1500,
        api_base=openai.api_base,
        api_key=KEY,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and not choice.message.content and not choice.message.tool_calls
    assert reply.usage.completion_tokens == 1500 == reply.usage.completion_tokens_details.reasoning_tokens


def test_openai_caches_a_repeated_prefix_of_1024_tokens_or_more_per_key_and_model(openai, litellm):
    def cached(model="openai/gpt-4.1", key=KEY, system=POLICY):
        reply = litellm.completion(model=model, messages=conversation(system), api_base=openai.api_base, api_key=key)
        return reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens

    prompt, first = cached()
    assert prompt > 1024 and first == 0
    prompt, again = cached()
    assert again <= prompt < again + 128 and (again - 1024) % 128 == 0  # the longest 128-token step of the prefix
    assert cached(key="sk-another-organisation")[1] == 0 and cached(model="openai/gpt-4.1-mini")[1] == 0
    assert cached(system="Short.")[1] == cached(system="Short.")[1] == 0  # under 1,024 tokens: never cached
    clock = openai.cache.clock
    openai.cache.clock = lambda: clock() + 3600  # an hour later the prefix is gone
    try:
        assert cached()[1] == 0
    finally:
        openai.cache.clock = clock


CALLING = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "create_task", "arguments": "{}"}}],
}
TOOL_ANSWER = {"role": "tool", "tool_call_id": "call_1", "content": "created task_9"}


def tool(parameters: dict, name: str = "create_task") -> list[dict]:
    return [{"type": "function", "function": {"name": name, "parameters": parameters}}]


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"top_k": 5}, None, "Unrecognized request argument supplied: top_k"),
        ({"messages": []}, "messages", "Invalid 'messages': empty array."),
        (
            {"messages": [{"role": "wizard", "content": ASK}]},
            "messages[0].role",
            "Invalid value: 'wizard'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.",
        ),
        (
            {"messages": [{"role": "user", "content": None}]},
            "messages.[0].content",
            "Invalid value for 'content': expected a string, got null.",
        ),
        (
            {"messages": [{"role": "user", "content": ASK}, TOOL_ANSWER]},
            "messages.[1].role",
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
        ),
        (
            {"messages": [{"role": "user", "content": ASK}, CALLING, {**TOOL_ANSWER, "tool_call_id": "call_9"}]},
            "messages.[2].tool_call_id",
            "Invalid parameter: 'tool_call_id' of 'call_9' not found in 'tool_calls' of previous message.",
        ),
        (
            {"messages": [{"role": "user", "content": ASK}, CALLING, {"role": "user", "content": "well?"}]},
            "messages.[1].role",
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. "
            "The following tool_call_ids did not have response messages: call_1",
        ),
        (
            {"tools": tool({"type": "string"})},
            "tools[0].function.parameters",
            "Invalid schema for function 'create_task': schema must be a JSON Schema of 'type: \"object\"', got 'type: \"string\"'.",
        ),
        (
            {"tools": tool({"type": "object"})},
            "tools[0].function.parameters",
            "Invalid schema for function 'create_task': In context=(), object schema missing properties.",
        ),
        (
            {"tools": tool({"type": "object", "properties": {"tags": {"type": "array"}}})},
            "tools[0].function.parameters",
            "Invalid schema for function 'create_task': In context=('properties', 'tags'), array schema missing items.",
        ),
        (
            {"tools": tool({"type": "object", "properties": []})},
            "tools[0].function.parameters",
            "Invalid schema for function 'create_task': [] is not of type 'object'.",
        ),
        (
            {"tools": tool({"type": "object", "properties": {}}, name="create task")},
            "tools[0].function.name",
            "Invalid 'tools[0].function.name': string does not match pattern.",
        ),
        ({"tools": [{"type": "function"}]}, "tools[0].function", "Missing required parameter: 'tools[0].function'."),
        (
            {"tool_choice": "auto"},
            "tool_choice",
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
        ),
    ],
    ids=[
        "unknown-argument",
        "no-messages",
        "unknown-role",
        "null-content",
        "tool-without-call",
        "tool-answers-no-such-call",
        "call-left-unanswered",
        "schema-not-an-object",
        "schema-without-properties",
        "array-without-items",
        "malformed-schema",
        "tool-name",
        "tool-without-function",
        "tool-choice-without-tools",
    ],
)
@pytest.mark.parametrize("model", ["gpt-4.1", "gpt-5", "agent"])
def test_openai_refuses_for_every_model_what_the_api_refuses(body, param, message, model):
    """Not only OpenAI's reasoning models: the API checks every request, so the servers the tests run with
    ("agent", "user") refuse a request that api.openai.com would."""
    with FakeOpenAI(roles={model: "agent"}) as fake:
        status, answer = openai_post(fake, {"model": model, **body})
    assert status == 400 and answer["error"]["type"] == "invalid_request_error", answer
    assert answer["error"]["param"] == param and answer["error"]["message"].startswith(message), answer["error"]


def test_openai_takes_a_conversation_of_answered_calls_and_well_formed_tools(openai, litellm):
    """Calls answered in any order, then the conversation goes on; a schema with nested objects and arrays with items;
    and through litellm, a refused conversation is a BadRequestError with OpenAI's words."""
    calls = {**CALLING, "tool_calls": [*CALLING["tool_calls"], {**CALLING["tool_calls"][0], "id": "call_2"}]}
    messages = [*conversation(), calls, {**TOOL_ANSWER, "tool_call_id": "call_2"}, TOOL_ANSWER, {"role": "user", "content": "Thanks."}]
    nested = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "object", "additionalProperties": True}}}}
    status, answer = openai_post(
        openai,
        {
            "model": "gpt-4.1",
            "messages": messages,
            "tools": [*TOOLS, *tool(nested, "tag")],
            "tool_choice": "auto",
            "seed": 3,
            "temperature": 0.0,
        },
    )
    assert status == 200, answer
    with pytest.raises(litellm.BadRequestError, match="must be a response to a preceeding message with 'tool_calls'"):
        litellm.completion(model="openai/gpt-4.1", messages=[*conversation(), TOOL_ANSWER], api_base=openai.api_base, api_key=KEY)


def test_openai_refuses_no_key_an_unknown_model_and_a_wrong_path(openai, litellm):
    status, answer = openai_post(openai, {"model": "gpt-5"}, key=None)
    assert status == 401 and answer["error"]["message"] == fake_openai.NO_KEY
    with pytest.raises(litellm.NotFoundError, match="The model `gpt-9` does not exist"):
        litellm.completion(model="openai/gpt-9", messages=conversation(), api_base=openai.api_base, api_key=KEY)
    status, answer = post(
        openai.origin + "/v1/v1/chat/completions", {"model": "gpt-5", "messages": conversation()}, {"Authorization": f"Bearer {KEY}"}
    )
    assert status == 404 and answer["error"]["message"] == "Invalid URL (POST /v1/v1/chat/completions)"


# ---- Anthropic ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def anthropic():
    with FakeAnthropic(roles={"claude-sonnet-4-5": "agent", "claude-opus-4-1": "agent", "claude-haiku-4-5": "agent"}) as fake:
        yield fake


def claude(litellm, fake: FakeAnthropic, messages: list[dict], model: str = "claude-sonnet-4-5", **kw):
    return litellm.completion(model=f"anthropic/{model}", messages=messages, api_base=fake.api_base, api_key=KEY, **kw)


def anthropic_post(fake: FakeAnthropic, body: dict, headers: dict | None = None, path: str = "/v1/messages") -> tuple[int, dict]:
    sent = {"model": "claude-sonnet-4-5", "max_tokens": 1000, "messages": [{"role": "user", "content": ASK}], **body}
    return post(
        fake.origin + path,
        {k: v for k, v in sent.items() if v is not None},
        {"x-api-key": KEY, "anthropic-version": "2023-06-01", **(headers or {})},
    )


def tool_turn(litellm, fake: FakeAnthropic, **kw):
    """The agent's first turn (a create_task call) and the conversation that answers it."""
    message = claude(litellm, fake, conversation(), tools=TOOLS, **kw).choices[0].message
    [call] = message.tool_calls
    return message, lambda handed_back: [
        *conversation(),
        handed_back,
        {"role": "tool", "tool_call_id": call.id, "content": "created task_9"},
    ]


def test_anthropic_answers_litellms_requests_and_tool_calls_round_trip(anthropic, litellm):
    message, answering = tool_turn(litellm, anthropic)
    [call] = message.tool_calls
    assert call.id.startswith("toolu_") and json.loads(call.function.arguments) == {"user_id": "user_1", "title": "Buy milk"}
    reply = claude(litellm, anthropic, answering(message), tools=TOOLS)
    assert reply.choices[0].message.content == "Done: the change was made successfully." and reply.choices[0].finish_reason == "stop"
    sent = anthropic.received[-1]
    assert sent.path == "/v1/messages" and sent.headers["anthropic-version"] == "2023-06-01" and sent.headers["x-api-key"] == REDACTED
    [result] = sent.body["messages"][-1]["content"]  # the id the server issued came back in the tool_result
    assert result["type"] == "tool_result" and result["tool_use_id"] == call.id
    no_key_kept(anthropic)


@pytest.mark.parametrize(
    "body, headers, status, message",
    [
        ({}, {"x-api-key": ""}, 401, "x-api-key header is required"),
        ({}, {"anthropic-version": ""}, 400, 'anthropic-version: "" is not a valid version'),
        ({"seed": 7}, {}, 400, "seed: Extra inputs are not permitted"),
        ({"max_tokens": None}, {}, 400, "max_tokens: Field required"),
        ({"temperature": 1.5}, {}, 400, "temperature: Input should be less than or equal to 1"),
        (
            {"temperature": 0.5, "top_p": 0.9},
            {},
            400,
            "`temperature` and `top_p` cannot both be specified for this model. Please use only one.",
        ),
        ({"model": "claude-nine"}, {}, 404, "model: claude-nine"),
        (
            {"messages": [{"role": "system", "content": "notes"}, {"role": "user", "content": ASK}]},
            {},
            400,
            "messages.0.role: Input should be 'user' or 'assistant'",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]}]},
            {},
            400,
            "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x. Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": ASK},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_y", "name": "create_task", "input": {}}]},
                    {"role": "user", "content": "well?"},
                ]
            },
            {},
            400,
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_y. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
        ),
        (
            {"system": [{"type": "text", "text": f"part {n}", "cache_control": {"type": "ephemeral"}} for n in range(5)]},
            {},
            400,
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 512}},
            {},
            400,
            "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 1024},
            {},
            400,
            "`max_tokens` must be greater than `thinking.budget_tokens`.",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2000, "top_p": 0.9},
            {},
            400,
            "`top_p` must be greater than or equal to 0.95 or unset when thinking is enabled",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2000, "top_k": 40},
            {},
            400,
            "`top_k` must be unset when thinking is enabled.",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "Hi."},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "thinking", "thinking": "I made this up.", "signature": "c2ln"},
                            {"type": "text", "text": "Hello."},
                        ],
                    },
                    {"role": "user", "content": ASK},
                ]
            },
            {},
            400,
            "messages.1.content.0: Invalid `signature` in `thinking` block",
        ),
        ({}, {}, 404, "Not Found"),
    ],
    ids=[
        "no-key",
        "bad-version",
        "seed",
        "no-max-tokens",
        "temperature-1.5",
        "temperature-and-top-p",
        "unknown-model",
        "system-in-messages",
        "stray-tool-result",
        "unanswered-tool-use",
        "five-cache-marks",
        "small-budget",
        "budget-over-max-tokens",
        "thinking-top-p",
        "thinking-top-k",
        "invented-thinking",
        "v1-v1",
    ],
)
def test_anthropic_refuses_what_the_messages_api_refuses(anthropic, body, headers, status, message):
    got, answer = anthropic_post(anthropic, body, headers, path="/v1/v1/messages" if message == "Not Found" else "/v1/messages")
    assert got == status and answer["type"] == "error" and answer["error"]["message"].startswith(message), answer


def test_anthropic_takes_what_the_messages_api_takes(anthropic):
    """Consecutive user turns are combined, system may be blocks, temperature alone is fine, tools need only a name and a schema."""
    status, answer = anthropic_post(
        anthropic,
        {
            "system": [{"type": "text", "text": "Be brief."}],
            "temperature": 0.2,
            "stop_sequences": ["###"],
            "messages": [{"role": "user", "content": "Hello."}, {"role": "user", "content": [{"type": "text", "text": ASK}]}],
            "tools": [{"name": "create_task", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
        },
    )
    assert status == 200 and answer["stop_reason"] == "tool_use" and answer["content"][-1]["type"] == "tool_use"
    status, answer = anthropic_post(anthropic, {"max_tokens": 3, "messages": [{"role": "user", "content": "Thanks!"}]})
    assert status == 200 and answer["stop_reason"] == "max_tokens" and answer["usage"]["output_tokens"] == 3
    thinking = {"type": "enabled", "budget_tokens": 1024}
    assert anthropic_post(anthropic, {"thinking": thinking, "max_tokens": 2000, "top_p": 0.95})[0] == 200  # top_p from 0.95 while it thinks
    assert anthropic_post(anthropic, {"top_k": 40, "top_p": 0.5})[0] == 200  # and anything, top_k too, while it does not


def test_anthropic_refuses_through_litellm_what_it_passes_on(anthropic, litellm):
    with pytest.raises(litellm.UnsupportedParamsError):  # litellm's own refusal, with drop_params off
        claude(litellm, anthropic, conversation(), seed=7)
    cases = [
        ({"seed": 7, "allowed_openai_params": ["seed"]}, "seed: Extra inputs are not permitted"),
        ({"extra_body": {"seed": 7}}, "extra_body: Extra inputs are not permitted"),  # litellm sends extra_body as a key of the body
        (
            {"tools": TOOLS, "tool_choice": "required", "reasoning_effort": "low"},
            "Thinking may not be enabled when tool_choice forces tool use.",
        ),
        ({"reasoning_effort": "low", "temperature": 0.4}, "`temperature` may only be set to 1 when thinking is enabled."),
        ({"reasoning_effort": "low", "top_p": 0.5}, "`top_p` must be greater than or equal to 0.95 or unset when thinking is enabled"),
        ({"reasoning_effort": "low", "top_k": 40}, "`top_k` must be unset when thinking is enabled."),
        ({"reasoning_effort": "high", "max_tokens": 1500}, "`max_tokens` must be greater than `thinking.budget_tokens`."),
    ]  # high: a 4,096 budget
    for kw, message in cases:
        with pytest.raises(litellm.BadRequestError, match=re.escape(message)):
            claude(litellm, anthropic, conversation(), **kw)


def test_anthropic_thinking_blocks_of_a_tool_turn_must_come_back_unchanged(anthropic, litellm):
    message, answering = tool_turn(litellm, anthropic, reasoning_effort="low", max_tokens=3000)
    [block] = message.thinking_blocks
    assert block["type"] == "thinking" and block["signature"] and message.reasoning_content == block["thinking"]
    reply = claude(
        litellm, anthropic, answering(message), tools=TOOLS, reasoning_effort="low", max_tokens=3000
    )  # litellm's own message object
    assert reply.choices[0].message.content == "Done: the change was made successfully."
    reduced = {"role": "assistant", "content": message.content, "tool_calls": [call.model_dump() for call in message.tool_calls]}
    with pytest.raises(
        litellm.BadRequestError,
        match=re.escape(
            "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
            "`tool_use`. When `thinking` is enabled, a final `assistant` message must start"
        ),
    ):
        claude(litellm, anthropic, answering(reduced), tools=TOOLS, reasoning_effort="low", max_tokens=3000)
    edited = {**message.model_dump(), "thinking_blocks": [{**block, "thinking": block["thinking"] + " "}]}
    with pytest.raises(litellm.BadRequestError, match=re.escape("messages.1.content.0: Invalid `signature` in `thinking` block")):
        claude(litellm, anthropic, answering(edited), tools=TOOLS, reasoning_effort="low", max_tokens=3000)
    with FakeAnthropic(roles={"claude-sonnet-4-5": "agent"}) as other:  # another server's secret: its blocks are not this one's
        with pytest.raises(litellm.BadRequestError, match="Invalid `signature`"):
            claude(litellm, other, answering(message), tools=TOOLS, reasoning_effort="low", max_tokens=3000)
    assert claude(litellm, anthropic, answering(reduced), tools=TOOLS).choices[0].message.content  # thinking off: the block is not needed


def test_anthropic_caches_marked_prefixes_only(anthropic, litellm):
    marked = [
        {"role": "system", "content": [{"type": "text", "text": POLICY, "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": ASK},
    ]
    first = claude(litellm, anthropic, marked, model="claude-opus-4-1").usage
    assert first.cache_creation_input_tokens > 1024 and first.prompt_tokens_details.cached_tokens == 0
    again = claude(litellm, anthropic, marked, model="claude-opus-4-1").usage  # litellm maps a read to cached_tokens
    assert again.prompt_tokens_details.cached_tokens == first.cache_creation_input_tokens and again.cache_creation_input_tokens == 0
    assert anthropic.received[-1].body["system"][0]["cache_control"] == {"type": "ephemeral"}  # litellm passed the mark on
    unmarked = conversation(POLICY)
    assert [claude(litellm, anthropic, unmarked, model="claude-opus-4-1").usage.prompt_tokens_details.cached_tokens for _ in range(2)] == [
        0,
        0,
    ]
    usage = anthropic_post(anthropic, {"model": "claude-opus-4-1", "system": marked[0]["content"]})[1][
        "usage"
    ]  # input_tokens: neither read nor written
    assert usage["cache_read_input_tokens"] == first.cache_creation_input_tokens and usage["cache_creation_input_tokens"] == 0
    assert 0 < usage["input_tokens"] < 50
    haiku = anthropic_post(anthropic, {"model": "claude-haiku-4-5", "system": marked[0]["content"]})[1]["usage"]
    assert haiku["cache_creation_input_tokens"] == 0  # Haiku 4.5 caches 4,096 tokens or more only


def test_anthropic_a_growing_conversation_reads_the_prefix_marked_last_turn(anthropic):
    def turn(n: int, ttl: str | None = None) -> dict:
        """The conversation's n-th request: it repeats the earlier ones and marks its own last message."""
        messages = [{"role": "user", "content": "Question 0: " + POLICY}]
        for i in range(1, n + 1):
            messages += [{"role": "assistant", "content": f"Answer {i - 1}."}, {"role": "user", "content": f"Question {i}?"}]
        mark = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
        messages[-1] = {"role": "user", "content": [{"type": "text", "text": messages[-1]["content"], "cache_control": mark}]}
        return anthropic_post(anthropic, {"model": "claude-opus-4-1", "messages": messages})[1]["usage"]

    one = turn(1)
    two = turn(2)  # the mark moved to the new last message; last turn's prefix is found 2 blocks back
    assert one["cache_read_input_tokens"] == 0 and two["cache_read_input_tokens"] == one["cache_creation_input_tokens"] > 1024
    assert 0 < two["cache_creation_input_tokens"] < 50 and two["input_tokens"] < 50  # only the new turn is written
    clock = anthropic.cache.clock
    anthropic.cache.clock = lambda: clock() + 301  # past the 5 minutes
    try:
        assert turn(2)["cache_read_input_tokens"] == 0
        turn(3, ttl="1h")
        anthropic.cache.clock = lambda: clock() + 602
        assert turn(3)["cache_read_input_tokens"] > 0  # an hour's entry outlives five minutes
    finally:
        anthropic.cache.clock = clock


FIX = Fix(
    symptom=r"garbled title", path="agent/agent.py", old="Be helpful.", new="Be helpful. Keep the user's exact title.", title="Keep titles"
)
META_TOOLS = [
    {"type": "function", "function": {"name": name, "description": name, "parameters": {"type": "object", "properties": props}}}
    for name, props in (
        ("list_failures", {}),
        ("read_trajectory", {"task": {"type": "string"}, "trial": {"type": "integer"}}),
        ("read_file", {"path": {"type": "string"}}),
        ("replace_in_file", {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}),
    )
]


def investigator(name, messages, tools):
    """EVOLVER_SCRIPT for the meta role: tests/scripts/meta_agent.py's read-the-trace strategy."""
    return investigate(messages, [FIX])


def test_anthropic_drives_the_scripted_meta_agent_through_a_thinking_tool_loop(litellm, monkeypatch):
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.test_fake_providers:investigator")
    results = {
        "list_failures": "T3 trial 0: reward 0.0",
        "read_trajectory": "turn 2: the agent sent a garbled title",
        "read_file": 'AGENT_INSTRUCTION = """Be helpful."""',
    }
    messages, made = [{"role": "system", "content": "Find the fault."}, {"role": "user", "content": "Here are the runs."}], []
    with FakeAnthropic(roles={"claude-sonnet-4-5": "meta"}) as fake:
        for _ in range(4):
            message = claude(litellm, fake, messages, tools=META_TOOLS, reasoning_effort="low", max_tokens=3000).choices[0].message
            [call] = message.tool_calls
            made.append((call.function.name, json.loads(call.function.arguments)))
            messages += [message, {"role": "tool", "tool_call_id": call.id, "content": results.get(call.function.name, "applied")}]
        sent = fake.received[-1].body["messages"]
    assert made == [
        ("list_failures", {}),
        ("read_trajectory", {"task": "T3", "trial": 0}),
        ("read_file", {"path": FIX.path}),
        ("replace_in_file", {"path": FIX.path, "old": FIX.old, "new": FIX.new}),
    ]
    # The last request handed back every turn's thinking block, signed, and every tool_use id it was given.
    assert [m["content"][0]["type"] for m in sent if m["role"] == "assistant"] == ["thinking"] * 3
    asked = [b["id"] for m in sent if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
    answered = [b["tool_use_id"] for m in sent if m["role"] == "user" for b in m["content"] if b.get("type") == "tool_result"]
    assert asked == answered and len(set(asked)) == 3


def test_anthropic_faults_and_lifetime(litellm):
    faults = {"claude-opus-4-1": Fault(rate_limited=1), "claude-haiku-4-5": Fault(status=529), "claude-sonnet-4-5": Fault(drop=True)}
    with FakeAnthropic(roles={name: "agent" for name in faults}, faults=faults) as fake:
        with pytest.raises(litellm.RateLimitError):
            claude(litellm, fake, conversation(), model="claude-opus-4-1")
        assert (
            claude(litellm, fake, conversation(), model="claude-opus-4-1").choices[0].message.tool_calls[0].function.name == "create_task"
        )
        status, answer = anthropic_post(fake, {"model": "claude-haiku-4-5"})
        assert status == 529 and answer["error"]["type"] == "overloaded_error"
        with pytest.raises((litellm.APIConnectionError, litellm.InternalServerError)):  # litellm's Anthropic route says the latter
            claude(litellm, fake, conversation(), model="claude-sonnet-4-5")
        assert fake.requests == {"claude-opus-4-1": 2, "claude-haiku-4-5": 1, "claude-sonnet-4-5": 1}
    short = FakeAnthropic(lifetime=0.2)
    short.timer.join(5)  # it stops by itself
    with pytest.raises(urllib.error.URLError):
        anthropic_post(short, {})


# ---- Gemini ---------------------------------------------------------------------------------

GEMINI_ROLES = {name: "agent" for name in ("gemini-2.5-flash", "gemini-2.5-flash-lite", "gemini-2.5-pro", "gemini-3-pro-preview")}


@pytest.fixture(scope="module")
def gemini():
    with FakeGemini(roles=GEMINI_ROLES, faults={"gemini-2.5-flash-lite": Fault(rate_limited=1)}) as fake:
        yield fake


def gemini_call(litellm, fake: FakeGemini, messages: list[dict], model: str = "gemini-2.5-flash", **kw):
    return litellm.completion(model=f"gemini/{model}", messages=messages, api_base=fake.api_base, api_key=KEY, **kw)


def gemini_post(fake: FakeGemini, body: dict, model: str = "gemini-2.5-flash", key: str | None = KEY) -> tuple[int, dict]:
    sent = {"contents": [{"role": "user", "parts": [{"text": ASK}]}], **body}
    return post(
        f"{fake.api_base}/models/{model}:generateContent",
        {k: v for k, v in sent.items() if v is not None},
        {"x-goog-api-key": key} if key else {},
    )


CALL = {"role": "model", "parts": [{"functionCall": {"name": "create_task", "args": {"user_id": "user_1", "title": "Buy milk"}}}]}
ANSWER = {"role": "user", "parts": [{"functionResponse": {"name": "create_task", "response": {"content": "created task_9"}}}]}


def test_gemini_answers_litellm_function_calls_round_trip_and_usage_counts_thoughts_and_cache(gemini, litellm):
    messages = conversation(POLICY * 2)  # over 2,048 tokens: implicitly cached by Gemini 2.5
    first = gemini_call(litellm, gemini, messages, tools=TOOLS)
    [call] = first.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"user_id": "user_1", "title": "Buy milk"}
    assert first.usage.completion_tokens_details.reasoning_tokens == 256 and not first.usage.prompt_tokens_details.cached_tokens
    again = gemini_call(litellm, gemini, messages, tools=TOOLS).usage  # the same prefix again: read from the cache
    assert again.prompt_tokens - 128 < again.prompt_tokens_details.cached_tokens <= again.prompt_tokens
    reply = gemini_call(
        litellm,
        gemini,
        [*messages, first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "created task_9"}],
        tools=TOOLS,
    )
    assert reply.choices[0].message.content == "Done: the change was made successfully."
    sent = gemini.received[-1]
    assert sent.path == "/v1beta/models/gemini-2.5-flash:generateContent" and sent.headers["x-goog-api-key"] == REDACTED
    assert (
        sent.body["contents"][-1]["parts"][0]["function_response"]["name"] == "create_task"
    )  # litellm's snake_case, taken as Google takes it
    no_key_kept(gemini)


@pytest.mark.parametrize(
    "body, model, status, message",
    [
        ({"seed": 3}, "gemini-2.5-flash", 400, 'Invalid JSON payload received. Unknown name "seed": Cannot find field.'),
        (
            {"generationConfig": {"reasoning_effort": "low"}},
            "gemini-2.5-flash",
            400,
            "Invalid JSON payload received. Unknown name \"reasoning_effort\" at 'generation_config': Cannot find field.",
        ),
        (
            {
                "tools": [
                    {
                        "functionDeclarations": [
                            {
                                "name": "create_task",
                                "parameters": {
                                    "type": "object",
                                    "properties": {"title": {"type": "string"}},
                                    "additionalProperties": False,
                                },
                            }
                        ]
                    }
                ]
            },
            "gemini-2.5-flash",
            400,
            "Invalid JSON payload received. Unknown name \"additionalProperties\" at 'tools[0].function_declarations[0].parameters': Cannot find field.",
        ),
        (
            {"contents": [{"role": "assistant", "parts": [{"text": "Hi."}]}]},
            "gemini-2.5-flash",
            400,
            "Please use a valid role: user, model.",
        ),
        (
            {"contents": [CALL]},
            "gemini-2.5-flash",
            400,
            "Please ensure that function call turn comes immediately after a user turn or after a function response turn.",
        ),
        (
            {"contents": [{"role": "user", "parts": [{"text": ASK}]}, ANSWER]},
            "gemini-2.5-flash",
            400,
            "Please ensure that function response turn comes immediately after a function call turn.",
        ),
        (
            {"contents": [{"role": "user", "parts": [{"text": ASK}]}, CALL, {"role": "user", "parts": ANSWER["parts"] * 2}]},
            "gemini-2.5-flash",
            400,
            "Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn.",
        ),
        (
            {"generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}},
            "gemini-2.5-pro",
            400,
            "Budget 0 is invalid. This model only works in thinking mode.",
        ),
        (
            {"generationConfig": {"thinkingConfig": {"thinkingBudget": 40000}}},
            "gemini-2.5-pro",
            400,
            "The thinking budget (40000) is invalid.",
        ),
        (
            {"contents": [{"role": "user", "parts": [{"text": ASK}]}, CALL, ANSWER]},
            "gemini-3-pro-preview",
            400,
            "Function call is missing a thought_signature in functionCall parts.",
        ),
        (
            {
                "contents": [
                    {"role": "user", "parts": [{"text": ASK}]},
                    {"role": "model", "parts": [{**CALL["parts"][0], "thoughtSignature": "c2lnbmVk"}]},
                    ANSWER,
                ]
            },
            "gemini-3-pro-preview",
            400,
            "Thought signature is not valid.",
        ),
        ({}, "gemini-9", 404, "models/gemini-9 is not found for API version v1beta"),
        ({"generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}}, "gemini-2.5-flash", 200, None),  # Flash may stop thinking
        (
            {
                "contents": [
                    {"role": "user", "parts": [{"text": ASK}]},
                    {"role": "model", "parts": [{**CALL["parts"][0], "thoughtSignature": "c2tpcF90aG91Z2h0X3NpZ25hdHVyZV92YWxpZGF0b3I="}]},
                    ANSWER,
                ]
            },
            "gemini-3-pro-preview",
            200,
            None,
        ),  # Google's documented dummy
    ],
    ids=[
        "seed",
        "unknown-config-field",
        "json-schema-key",
        "role",
        "call-first",
        "answer-without-call",
        "answer-count",
        "pro-budget-0",
        "pro-budget-too-big",
        "gemini-3-no-signature",
        "gemini-3-forged-signature",
        "unknown-model",
        "flash-budget-0",
        "gemini-3-dummy-signature",
    ],
)
def test_gemini_refuses_what_generate_content_refuses(gemini, body, model, status, message):
    got, answer = gemini_post(gemini, body, model)
    assert got == status, answer
    if message:
        assert answer["error"]["status"] == {400: "INVALID_ARGUMENT", 404: "NOT_FOUND"}[status] and answer["error"]["message"].startswith(
            message
        ), answer


def test_gemini_through_litellm_thinking_budgets_signatures_key_and_faults(gemini, litellm):
    with pytest.raises(litellm.BadRequestError, match="Budget 0 is invalid"):  # litellm maps "disable" to a budget of 0
        gemini_call(litellm, gemini, conversation(), model="gemini-2.5-pro", reasoning_effort="disable")
    cut = gemini_call(litellm, gemini, conversation(), model="gemini-2.5-pro", reasoning_effort="low", max_tokens=100)
    assert cut.choices[0].finish_reason == "length" and not cut.choices[0].message.content  # the thoughts used up the output tokens
    first = gemini_call(litellm, gemini, conversation(), model="gemini-3-pro-preview", tools=TOOLS).choices[0].message
    [call] = first.tool_calls
    follow = [*conversation(), first, {"role": "tool", "tool_call_id": call.id, "content": "created task_9"}]
    assert gemini_call(litellm, gemini, follow, model="gemini-3-pro-preview", tools=TOOLS).choices[0].message.content
    assert gemini.received[-1].body["contents"][1]["parts"][0]["thoughtSignature"]  # handed back as issued
    assert gemini_post(gemini, {}, key=None)[1]["error"] == {"code": 403, "message": gemini_rules.NO_KEY, "status": "PERMISSION_DENIED"}
    with pytest.raises(litellm.RateLimitError):
        gemini_call(litellm, gemini, conversation(), model="gemini-2.5-flash-lite")
    assert gemini_call(litellm, gemini, conversation(), model="gemini-2.5-flash-lite", tools=TOOLS).choices[0].finish_reason == "tool_calls"
