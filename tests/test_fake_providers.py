"""The provider-faithful fake servers (tests/scripts/fake_openai.py, fake_anthropic.py, fake_gemini.py) refuse
what the real providers refuse and take what they take: the proof that a test run against them proves something.

Each rule is shown through litellm (the client evolver uses) pointed at the server; where litellm itself refuses
before sending, the server is also asked directly over HTTP. No tau2 simulation: one request is milliseconds.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from evolver.llm import prepare_environment
from tests.scripts import fake_openai
from tests.scripts.fake_openai import FakeOpenAI
from tests.scripts.fake_server import REDACTED

KEY = "sk-test-0123456789-not-a-real-key"
TOOLS = [{"type": "function", "function": {"name": "create_task", "description": "Create a task for a user.",
                                           "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}, "title": {"type": "string"}},
                                                          "required": ["user_id", "title"]}}}]
ASK = "Hi, please create a task called 'Buy milk' for user_1."
POLICY = "You are a task manager's agent. Follow the policy: create tasks with the exact title the user gives. " * 60  # > 1,024 tokens


@pytest.fixture(scope="module")
def litellm():
    prepare_environment()  # no price list from the network
    import litellm

    return litellm


def conversation(system: str = "You are an agent.") -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": ASK}]


def post(url: str, body: dict, headers: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}, method="POST")
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

OPENAI_ROLES = {name: "agent" for name in ("gpt-5", "gpt-5-mini", "gpt-5.1", "gpt-5-chat-latest", "o3", "o4-mini", "gpt-4.1", "gpt-4.1-mini")}


@pytest.fixture(scope="module")
def openai():
    with FakeOpenAI(roles=OPENAI_ROLES) as fake:
        yield fake


def openai_post(fake: FakeOpenAI, body: dict, key: str | None = KEY) -> tuple[int, dict]:
    return post(fake.api_base + "/chat/completions", {"messages": conversation(), **body}, {"Authorization": f"Bearer {key}"} if key else {})


def test_openai_reasoning_model_answers_a_request_shaped_for_it(openai, litellm):
    reply = litellm.completion(model="openai/gpt-5", messages=conversation(), tools=TOOLS, reasoning_effort="low", max_tokens=3000,
                               api_base=openai.api_base, api_key=KEY)
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
        "type": "invalid_request_error", "param": "temperature", "code": "unsupported_value"}
    assert openai_post(openai, {"model": model, "temperature": 0.0})[1]["error"]["message"].startswith(
        "Unsupported value: 'temperature' does not support 0.0 with")  # quoted as sent
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
        "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}
    assert openai_post(openai, {"model": "gpt-4.1", "max_tokens": 100})[0] == 200
    status, answer = openai_post(openai, {"model": "o3", "top_p": 0.5})
    assert status == 400 and answer["error"]["message"] == "Unsupported parameter: 'top_p' is not supported with this model."
    status, answer = openai_post(openai, {"model": "gpt-4.1", "reasoning_effort": "low"})
    assert status == 400 and answer["error"] == {"message": "Unrecognized request argument supplied: reasoning_effort",
                                                 "type": "invalid_request_error", "param": None, "code": None}
    with pytest.raises(litellm.BadRequestError, match="does not support 'minimal' with this model. Supported values are: 'low', 'medium', and 'high'."):
        litellm.completion(model="openai/o3", messages=conversation(), reasoning_effort="minimal", api_base=openai.api_base, api_key=KEY)
    assert openai_post(openai, {"model": "gpt-5", "reasoning_effort": "minimal"})[0] == 200
    with FakeOpenAI() as compatible:  # a vLLM or llama.cpp model name: an OpenAI-compatible server takes what it is sent
        assert openai_post(compatible, {"model": "agent", "reasoning_effort": "low", "max_tokens": 50, "temperature": 0.3})[0] == 200


def test_openai_reasoning_spends_the_completion_budget_before_the_answer(openai, litellm):
    reply = litellm.completion(model="openai/gpt-5", messages=conversation(), tools=TOOLS, reasoning_effort="high", max_tokens=1500,
                               api_base=openai.api_base, api_key=KEY)
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


def test_openai_refuses_no_key_an_unknown_model_and_a_wrong_path(openai, litellm):
    status, answer = openai_post(openai, {"model": "gpt-5"}, key=None)
    assert status == 401 and answer["error"]["message"] == fake_openai.NO_KEY
    with pytest.raises(litellm.NotFoundError, match="The model `gpt-9` does not exist"):
        litellm.completion(model="openai/gpt-9", messages=conversation(), api_base=openai.api_base, api_key=KEY)
    status, answer = post(openai.origin + "/v1/v1/chat/completions", {"model": "gpt-5", "messages": conversation()}, {"Authorization": f"Bearer {KEY}"})
    assert status == 404 and answer["error"]["message"] == "Invalid URL (POST /v1/v1/chat/completions)"
