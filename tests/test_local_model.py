"""The embedded local model.

The last test runs it for real, through `evolver eval` as a user types it: the
0.5B GGUF joined from its pip chunk packages, served by llama.cpp (xllamacpp)
in a subprocess, playing agent and user through one real tau2 mock simulation
in a real worker. It fails (it
does not skip) when the model cannot be provisioned or the server does not
start; it skips only when the `local-small` extra is not installed at all and
EVOLVER_SKIP_LOCAL_MODEL=1 says that is intended.

The tests before it cover provisioning, bad input and the serving path's
handling with small stand-ins; they need no model.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from evolver.errors import UsageError
from evolver.llm import prepare_environment
from evolver.local import customer, provision, serving
from evolver.local.provision import MODELS, ModelSpec, check_cpu, check_gguf, resolve_model
from evolver.local.server import LocalServer
from tests.conftest import run_cli

EXTRA_INSTALLED = any(importlib.util.find_spec(m) for m in ("xllamacpp", MODELS["small"].modules[0]))
needs_model = pytest.mark.skipif(
    not EXTRA_INSTALLED and os.environ.get("EVOLVER_SKIP_LOCAL_MODEL") == "1",
    reason="the local-small extra is not installed and EVOLVER_SKIP_LOCAL_MODEL=1",
)
CLEAN_ENDINGS = {"user_stop", "agent_stop", "judge_stop", "max_steps"}


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    # A fresh cache: the chunks are joined and verified here, as on a new machine.
    return resolve_model("small", cache=tmp_path_factory.mktemp("model-cache"))


# ---- provisioning and bad input, with stand-in chunk packages ----------------


@pytest.fixture
def fake_model(tmp_path, monkeypatch) -> ModelSpec:
    """Three importable chunk modules, like the real ones, holding a tiny 'GGUF'."""
    chunks = [b"GGUF" + b"a" * 1000, b"b" * 1000, b"c" * 500]
    pkg_root = tmp_path / "site"
    names = []
    for i, data in enumerate(chunks, 1):
        name = f"evolver_fake_part{i}"
        (pkg_root / name / "data").mkdir(parents=True)
        (pkg_root / name / "data" / f"part{i:02d}.bin").write_bytes(data)
        (pkg_root / name / "__init__.py").write_text(
            "import os\ndef get_part_path():\n"
            f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{i:02d}.bin')\n"
        )
        names.append(name)
    monkeypatch.syspath_prepend(str(pkg_root))
    whole = b"".join(chunks)
    return ModelSpec(
        size="fake",
        description="test",
        filename="fake.gguf",
        modules=tuple(names),
        sha256=hashlib.sha256(whole).hexdigest(),
        nbytes=len(whole),
        extra="local-fake",
    )


def test_chunks_are_joined_verified_and_reused(fake_model, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    path = provision.provision(fake_model, cache)
    assert path.read_bytes().startswith(b"GGUF") and path.stat().st_size == fake_model.nbytes
    assert not list(cache.glob("*.part"))  # no temp file left behind
    # Reuse: a stat() and the marker, no second join.
    monkeypatch.setattr(provision, "_join", lambda *a: pytest.fail("joined again"))
    assert provision.provision(fake_model, cache) == path


def test_a_partial_or_corrupt_file_is_rebuilt_never_served(fake_model, tmp_path):
    cache = tmp_path / "cache"
    path = provision.provision(fake_model, cache)
    good = path.read_bytes()
    with open(path, "r+b") as fh:  # partial: cut short
        fh.truncate(100)
    assert provision.provision(fake_model, cache).read_bytes() == good
    # Same size, different bytes, and no marker to vouch for it: hashed and rebuilt.
    path.write_bytes(b"GGUF" + b"x" * (len(good) - 4))
    (cache / "fake.gguf.verified").unlink()
    assert provision.provision(fake_model, cache).read_bytes() == good


def test_chunks_that_do_not_match_the_checksum_are_refused(fake_model, tmp_path):
    bad = ModelSpec(**{**fake_model.__dict__, "sha256": "0" * 64})
    with pytest.raises(UsageError, match="do not match the expected sha256"):
        provision.provision(bad, tmp_path / "cache")
    assert not (tmp_path / "cache" / "fake.gguf").exists()


def test_missing_chunk_packages_say_what_to_install(fake_model, tmp_path):
    missing = ModelSpec(**{**fake_model.__dict__, "modules": fake_model.modules + ("evolver_no_such_part",)})
    with pytest.raises(UsageError, match=r"pip install 'evolver\[local-fake\]'"):
        provision.provision(missing, tmp_path / "cache")


def test_cache_dir_that_is_not_writable(fake_model, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="is not writable.*EVOLVER_MODEL_CACHE"):
        provision.provision(fake_model, blocker / "cache")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("EVOLVER_CACHE", raising=False)
    monkeypatch.delenv("EVOLVER_MODEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert provision.cache_dir() == tmp_path / "xdg" / "evolver" / "models"
    monkeypatch.setenv("EVOLVER_CACHE", str(tmp_path / "evolver"))  # evolver's cache, the noise floors' too
    assert provision.cache_dir() == tmp_path / "evolver" / "models"
    monkeypatch.setenv("EVOLVER_MODEL_CACHE", str(tmp_path / "mine"))
    assert provision.cache_dir() == tmp_path / "mine"


def test_gguf_path_is_checked(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        check_gguf(tmp_path / "nope.gguf")
    (tmp_path / "model.bin").write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(UsageError, match="is not a GGUF model file"):
        check_gguf(tmp_path / "model.bin")
    (tmp_path / "ok.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    assert check_gguf(tmp_path / "ok.gguf") == (tmp_path / "ok.gguf").resolve()
    with pytest.raises(UsageError, match="unknown local model size 'huge'"):
        resolve_model("huge")


def test_cpu_without_avx2_is_refused_before_starting(tmp_path, monkeypatch):
    monkeypatch.setattr(provision.platform, "machine", lambda: "x86_64")
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 ssse3 sse4_1 avx\n")
    with pytest.raises(UsageError, match="lacks avx2, fma, f16c"):
        check_cpu(info)
    info.write_text("flags\t\t: fpu sse avx avx2 fma f16c bmi2\n")
    check_cpu(info)


def test_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        (tmp_path / "m.gguf").write_bytes(b"GGUF")
        with pytest.raises(UsageError, match=f"port {port} is in use"):
            LocalServer(tmp_path / "m.gguf", port=port, fix_template=False).start()


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="needs xllamacpp")
def test_a_server_that_cannot_load_the_model_is_one_clear_error(tmp_path):
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(UsageError, match="exited with code .* before serving"):
        LocalServer(tmp_path / "broken.gguf", fix_template=False, log_path=tmp_path / "server.log").start()


def _gguf_with_template(path: Path, template: str) -> Path:
    """A GGUF header with a few metadata keys (a string array among them), no tensors."""
    import struct

    def string(text: str) -> bytes:
        data = text.encode()
        return struct.pack("<Q", len(data)) + data

    kvs = [
        string("general.name") + struct.pack("<I", 8) + string("tiny"),
        string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + string("a") + string("bb"),
        string("general.alignment") + struct.pack("<II", 4, 32),
        string("tokenizer.chat_template") + struct.pack("<I", 8) + string(template),
    ]
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
    return path


def test_the_doubled_brace_tool_call_example_is_fixed(tmp_path):
    from evolver.local.template import fixed_chat_template, read_chat_template

    doubled = '{{- "<tool_call>\\n{{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}}\\n</tool_call>" }}'
    path = _gguf_with_template(tmp_path / "bug.gguf", doubled)
    assert read_chat_template(path) == doubled
    assert fixed_chat_template(path) == doubled.replace('{{\\"name', '{\\"name').replace("object>}}", "object>}")
    assert fixed_chat_template(_gguf_with_template(tmp_path / "ok.gguf", "{{ messages }}")) is None


# ---- the serving path's handling, with a stand-in server ----------------------


def _reply(content=None, tool_calls=None):
    from litellm import ModelResponse

    return ModelResponse(
        model="local",
        choices=[{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content, "tool_calls": tool_calls}}],
        usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    )


TOOLS = [{"type": "function", "function": {"name": "create_task", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture
def fake_server(monkeypatch, tmp_path):
    """serving._forward answers from a list; the requests it saw are kept."""
    prepare_environment()
    serving.reset_stats()
    monkeypatch.setenv(serving.STATS_ENV, str(tmp_path / "stats.json"))
    seen, replies = [], []

    def forward(name, messages, api_base, params):
        seen.append((messages, params))
        return replies.pop(0)

    monkeypatch.setattr(serving, "_forward", forward)
    return seen, replies


def test_calls_written_as_text_become_tool_calls(fake_server):
    seen, replies = fake_server
    replies.append(_reply('Creating it now.\n```json\n{"name": "create_task", "arguments": {"title": "x"}}\n```'))
    response = serving.complete("agent", [{"role": "user", "content": "hi"}], "http://x/v1", {"tools": TOOLS})
    message = response.choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [("create_task", {"title": "x"})]
    assert message.content == "Creating it now."  # the text around the call is kept
    assert seen[0][1]["max_tokens"] == serving.DEFAULT_MAX_TOKENS
    assert serving.stats()["agent"] == {"requests": 1, "replies": 1, "text_tool_calls": 1}


def test_a_genuine_text_reply_is_left_alone(fake_server):
    _, replies = fake_server
    replies.append(_reply('Your task {"name": "Alice"} is done.'))
    message = serving.complete("agent", [{"role": "user", "content": "hi"}], "http://x/v1", {"tools": TOOLS}).choices[0].message
    assert message.content == 'Your task {"name": "Alice"} is done.' and not message.tool_calls


def test_an_empty_reply_is_re_asked_a_bounded_number_of_times(fake_server, tmp_path):
    seen, replies = fake_server
    replies += [_reply(""), _reply("Hello, how can I help?")]
    # The user label with its adapter off: the empty-reply handling alone (the adapter's own tests follow).
    off = {serving.USER_ADAPTER: False}
    message = serving.complete("user", [{"role": "user", "content": "hi"}], "http://x/v1", {"temperature": 0.0, **off}).choices[0].message
    assert message.content == "Hello, how can I help?"
    assert seen[1][0][-1]["role"] == "system" and seen[1][1]["temperature"] == serving.REASK_TEMPERATURE
    assert serving.stats()["user"] == {"requests": 1, "replies": 2, "empty": 1, "reasks": 1, "recovered": 1}
    # A reply that stays empty is returned as it is, after REASKS re-asks, and counted.
    replies += [_reply("   ")] * (1 + serving.REASKS)
    serving.complete("user", [{"role": "user", "content": "hi"}], "http://x/v1", dict(off))
    counters = json.loads((tmp_path / "stats.json").read_text())["user"]
    assert counters["still_empty"] == 1 and counters["reasks"] == 1 + serving.REASKS


def test_a_call_to_a_made_up_tool_is_re_asked_with_constrained_decoding(fake_server):
    seen, replies = fake_server
    replies += [_reply('{"name": "delete_tasks", "arguments": {}}'), _reply('{"name": "create_task", "arguments": {}}')]
    message = serving.complete("agent", [{"role": "user", "content": "hi"}], "http://x/v1", {"tools": TOOLS}).choices[0].message
    assert [c.function.name for c in message.tool_calls] == ["create_task"]
    schema = seen[1][1]["response_format"]["json_schema"]["schema"]
    assert [o["properties"]["name"]["const"] for o in schema["anyOf"]] == ["create_task"]
    assert serving.stats()["agent"]["constrained_tool_calls"] == 1


def test_a_request_that_requires_a_call_is_constrained_to_one_from_the_start(fake_server):
    seen, replies = fake_server
    replies += [_reply('{"name": "create_task", "arguments": {}}'), _reply("Here is my plan: first, read.")]
    required = serving.complete("meta", [{"role": "user", "content": "go"}], "http://x/v1", {"tools": TOOLS, "tool_choice": "required"})
    assert [c.function.name for c in required.choices[0].message.tool_calls] == ["create_task"]
    schema = seen[0][1]["response_format"]["json_schema"]["schema"]
    assert [o["properties"]["name"]["const"] for o in schema["anyOf"]] == ["create_task"]
    free = serving.complete("agent", [{"role": "user", "content": "hi"}], "http://x/v1", {"tools": TOOLS})
    assert "response_format" not in seen[1][1] and free.choices[0].message.content == "Here is my plan: first, read."


def test_a_repetition_loop_yields_one_call(fake_server):
    _, replies = fake_server
    loop = _reply('{"name": "create_task", "arguments": {"a": 1}}\n' * 5 + '{"name": "create_task", "argu')
    loop.choices[0].finish_reason = "length"
    replies.append(loop)
    message = serving.complete("agent", [{"role": "user", "content": "hi"}], "http://x/v1", {"tools": TOOLS}).choices[0].message
    assert len(message.tool_calls) == 1
    assert serving.stats()["agent"]["repeated_calls_dropped"] == 1


# ---- the user-role adapter (evolver.local.customer), with a stand-in server ------


TAU2_USER_SYSTEM = (
    "# User Simulation Guidelines\nYou are playing the role of a customer.\n\n<scenario>\nDelete all your tasks.\n</scenario>"
)
GREETING = "Hi! How can I help you today?"


def test_the_customer_gets_a_reminder_and_a_begun_first_message_after_tau2s_own_request(fake_server):
    seen, replies = fake_server
    replies.append(_reply("Hi, I need to delete all my tasks."))  # llama.cpp returns the prefill with the reply
    tau2_request = [{"role": "system", "content": TAU2_USER_SYSTEM}, {"role": "user", "content": GREETING}]
    message = serving.complete("user", [dict(m) for m in tau2_request], "http://x/v1", {"temperature": 0.0}).choices[0].message
    presented, params = seen[0]
    assert presented == tau2_request + [  # tau2's guidelines, scenario and conversation as they are, then the two steps
        {"role": "system", "content": customer.REMINDER + customer.FIRST_MESSAGE},
        {"role": "assistant", "content": customer.OPENING},
    ]
    assert serving.USER_ADAPTER not in params  # the provider's option never reaches the server
    assert message.content == "Hi, I need to delete all my tasks."
    assert serving.stats()["user"] == {"as_customer": 1, "requests": 1, "replies": 1}


def test_a_task_that_begins_with_a_history_gets_a_continuation_until_the_customer_speaks_live(fake_server):
    # The customer's earlier request is in tau2's message history, already met: told the stop rule
    # there, the small model ended at once. The worker says how many customer messages the history holds.
    seen, replies = fake_server
    replies += [_reply("Thanks. Now I need to mark the task as completed."), _reply("It is task_2.")]
    history = [
        {"role": "system", "content": TAU2_USER_SYSTEM},
        {"role": "assistant", "content": "I need a new task."},
        {"role": "user", "content": "I've created the task for you."},
    ]
    message = serving.complete("user", [dict(m) for m in history], "http://x/v1", {serving.USER_HISTORY: 1}).choices[0].message
    presented, params = seen[0]
    assert presented == history + [
        {"role": "system", "content": customer.REMINDER + customer.CONTINUATION},
        {"role": "assistant", "content": customer.CONTINUATION_OPENING},
    ]
    assert serving.USER_HISTORY not in params and message.content.startswith(customer.CONTINUATION_OPENING)
    # Once it has spoken live, the stop rule again.
    live = history + [{"role": "assistant", "content": message.content}, {"role": "user", "content": "Which task?"}]
    serving.complete("user", [dict(m) for m in live], "http://x/v1", {serving.USER_HISTORY: 1})
    assert seen[1][0] == live + [{"role": "system", "content": customer.REMINDER + customer.DONE}]


def test_the_worker_tells_only_an_adapted_user_how_long_the_tasks_history_is():
    from tau2.registry import registry

    from evolver.evaluation.worker.recorder import user_simulator_args

    tasks = {t.id: t for t in registry.get_tasks_loader("mock")()}
    adapted = {"temperature": 0.0, serving.USER_ADAPTER: True}
    assert user_simulator_args(tasks["update_task_with_message_history"], adapted) == {**adapted, serving.USER_HISTORY: 1}
    assert user_simulator_args(tasks["create_task_1"], adapted) == {**adapted, serving.USER_HISTORY: 0}
    plain = {"temperature": 0.0}  # an API model's user, or the adapter off: nothing added
    assert user_simulator_args(tasks["update_task_with_message_history"], plain) == plain
    assert user_simulator_args(tasks["update_task_with_message_history"], {serving.USER_ADAPTER: False}) == {serving.USER_ADAPTER: False}


def test_a_later_turn_gets_the_reminder_with_tau2s_stop_rule_but_no_begun_message(fake_server):
    seen, replies = fake_server
    replies.append(_reply("It is for user_1."))
    flipped = [
        {"role": "system", "content": TAU2_USER_SYSTEM},
        {"role": "user", "content": GREETING},
        {"role": "assistant", "content": "I need a new task."},
        {"role": "user", "content": "For which user?"},
    ]
    message = serving.complete("user", [dict(m) for m in flipped], "http://x/v1", {}).choices[0].message
    assert seen[0][0] == flipped + [{"role": "system", "content": customer.REMINDER + customer.DONE}]
    assert "###STOP###" in customer.DONE  # tau2's own token, which ends the simulation as the customer's stop
    assert message.content == "It is for user_1."


def test_an_opening_the_server_does_not_echo_is_put_back(fake_server):
    _, replies = fake_server
    replies.append(_reply(" to create a task."))
    request = [{"role": "system", "content": TAU2_USER_SYSTEM}, {"role": "user", "content": GREETING}]
    assert serving.complete("user", request, "http://x/v1", {}).choices[0].message.content == "Hi, I need to create a task."


def test_a_reply_that_reads_like_an_assistant_is_asked_again_once(fake_server):
    seen, replies = fake_server
    request = [{"role": "system", "content": TAU2_USER_SYSTEM}, {"role": "user", "content": GREETING}]
    replies += [_reply("Hello! How can I assist you today?"), _reply("Hi, I need to delete all my tasks.")]
    message = serving.complete("user", list(request), "http://x/v1", {"temperature": 0.0}).choices[0].message
    assert message.content == "Hi, I need to delete all my tasks."
    assert len(seen) == 2 and seen[1][1]["temperature"] == serving.REASK_TEMPERATURE
    assert seen[1][0][-2] == {"role": "system", "content": customer.REMINDER + customer.FIRST_MESSAGE + customer.RECHECK_NOTE}
    assert customer.RECHECK_NOTE not in json.dumps(seen[0][0])
    assert serving.stats()["user"]["assistant_like"] == serving.stats()["user"]["rechecks"] == 1
    assert "still_off_role" not in serving.stats()["user"]
    # Still an assistant's after the re-ask: returned, counted, and not asked a third time.
    replies += [_reply("How may I help you?"), _reply("I'm here to help you with your tasks.")]
    serving.complete("user", list(request), "http://x/v1", {})
    assert len(seen) == 4 and serving.stats()["user"]["still_off_role"] == 1
    # Without the recheck step an assistant-like reply is counted and returned as it is.
    replies.append(_reply("How can I help?"))
    message = serving.complete("user", list(request), "http://x/v1", {serving.USER_ADAPTER: ["reminder", "prefill"]}).choices[0].message
    assert len(seen) == 5 and message.content == "Hi, I need How can I help?" and serving.stats()["user"]["rechecks"] == 2


def test_a_reply_that_repeats_the_customers_own_line_is_asked_again(fake_server):
    seen, replies = fake_server
    # tau2's message-history tasks: the customer spoke before the simulator starts.
    flipped = [
        {"role": "system", "content": TAU2_USER_SYSTEM},
        {"role": "assistant", "content": "I need to create a task for the review."},
        {"role": "user", "content": "I've created task_2 for you."},
    ]
    replies += [
        _reply("I need to create a task for the review. The previous discussion was about it."),
        _reply("Thanks. Please mark task_2 as completed."),
    ]
    message = serving.complete("user", flipped, "http://x/v1", {}).choices[0].message
    assert message.content == "Thanks. Please mark task_2 as completed." and len(seen) == 2
    assert serving.stats()["user"]["repeats_customer"] == 1
    assert customer.repeats_customer("i NEED to create a task, for the review", flipped)
    assert not customer.repeats_customer("I need to create", flipped)  # a shared beginning is not a repeat


def test_a_reply_that_echoes_the_agents_last_message_is_asked_again(fake_server):
    seen, replies = fake_server
    # Seen with the 1.5B on tau2's message-history tasks: the agent's line said back, then a stop.
    agent_line = "I've created a task titled 'Project Review' for you, with ID task_2."
    flipped = [
        {"role": "system", "content": TAU2_USER_SYSTEM},
        {"role": "assistant", "content": "I need a task for the review."},
        {"role": "user", "content": agent_line},
    ]
    replies += [_reply(agent_line + " ###STOP###"), _reply("Thanks. Please mark task_2 as completed.")]
    message = serving.complete("user", flipped, "http://x/v1", {}).choices[0].message
    assert message.content == "Thanks. Please mark task_2 as completed." and len(seen) == 2
    assert serving.stats()["user"]["echoes_agent"] == serving.stats()["user"]["rechecks"] == 1
    assert customer.off_role("Done.", [{"role": "user", "content": "Done."}]) is None  # too short to call an echo
    assert customer.off_role("Thanks, that is all. ###STOP###", flipped) is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Hello! How can I assist you today?", True),
        ("Hi, how may I help?", True),
        ("I'm happy to help with that.", True),
        ("I'm sorry, but I can't assist with that.", True),
        ("Is there anything else I can do for you?", True),
        ("Agent: Sure, one moment.", True),
        ("Sure, I'll mark the task as completed.", True),
        ("Certainly! Let me update that for you.", True),
        ("Sure, my user id is user_1.", False),
        ("I'll wait, thanks.", False),
        ("Hi, I need to delete all my tasks.", False),
        ("Can you help me create a task?", False),
        ("Could you assist me with task_1?", False),
        ("Thanks, that is all. ###STOP###", False),
        ("", False),
        (None, False),
    ],
)
def test_an_assistant_like_reply_is_told_from_a_customer_one(text, expected):
    assert customer.reads_like_assistant(text) is expected


def test_chosen_steps_only_and_no_begun_message_for_a_customer_with_tools(fake_server):
    seen, replies = fake_server
    request = [{"role": "system", "content": TAU2_USER_SYSTEM}, {"role": "user", "content": GREETING}]
    replies.append(_reply("I want to delete my tasks."))
    serving.complete("user", list(request), "http://x/v1", {serving.USER_ADAPTER: ["prefill"]})
    assert seen[0][0] == request + [{"role": "assistant", "content": customer.OPENING}]
    # tau2's telecom customer has tools of its own: a begun text message would leave no room for a call.
    replies.append(_reply("I want to delete my tasks."))
    serving.complete("user", list(request), "http://x/v1", {"tools": TOOLS})
    assert seen[1][0] == request + [{"role": "system", "content": customer.REMINDER + customer.FIRST_MESSAGE}]
    with pytest.raises(ValueError, match="unknown user_adapter steps"):
        serving.complete("user", list(request), "http://x/v1", {serving.USER_ADAPTER: ["transcript"]})


@pytest.fixture
def openai_stub():
    """A loopback OpenAI-compatible server that records each request body as it arrived, byte for byte."""
    import http.server
    import threading

    bodies: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            answer = json.dumps(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "I need a new task."}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", bodies
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "user_model, role", [("gpt-4.1-mini", "user"), ("openai/qwen2.5-7b", "user"), ("local", "agent"), ("local", "judge")]
)
def test_requests_of_other_models_and_roles_are_byte_identical_with_the_adapter_on_or_off(openai_stub, tmp_path, user_model, role):
    import litellm

    from evolver.config_load import load_config
    from evolver.local.providers import register_providers

    api_base, bodies = openai_stub
    request = [{"role": "system", "content": TAU2_USER_SYSTEM}, {"role": "user", "content": GREETING}]
    for switch in (True, False):
        cfg = load_config(
            tmp_path,
            {"agent_model": user_model, "user_model": user_model, "api_base": api_base, "local_user_adapter": switch},
            environ={"OPENAI_API_KEY": "sk-test"},
        )
        model = cfg.role(role)
        register_providers([model.model])
        litellm.completion(model=model.model, messages=[dict(m) for m in request], api_key="sk-test", **model.litellm_args())
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    sent = json.loads(bodies[0])
    assert sent["messages"] == request and serving.USER_ADAPTER not in sent


def test_the_local_user_is_adapted_by_default_and_the_switch_turns_it_off(openai_stub, tmp_path):
    import litellm

    from evolver.config_load import load_config
    from evolver.config_requests import eval_request
    from evolver.local.providers import register_providers

    api_base, bodies = openai_stub
    request = [{"role": "system", "content": TAU2_USER_SYSTEM}, {"role": "user", "content": GREETING}]
    for overrides in ({}, {"local_user_adapter": False}):
        cfg = load_config(tmp_path, {"user_model": "local", "api_base": api_base, **overrides}, environ={})
        user = eval_request(cfg, tmp_path, tmp_path / "out", local_api_base=None).user  # result.json records it: models.user
        assert user.llm_args[serving.USER_ADAPTER] is (not overrides)
        register_providers([user.model])
        litellm.completion(model=user.model, messages=[dict(m) for m in request], **user.litellm_args())
    adapted, plain = (json.loads(b) for b in bodies)
    assert plain["messages"] == request and serving.USER_ADAPTER not in plain
    assert adapted["messages"][-1] == {"role": "assistant", "content": customer.OPENING}
    assert serving.USER_ADAPTER not in adapted


# ---- the real model --------------------------------------------------------------


@needs_model
def test_evolver_eval_on_the_embedded_model_through_the_command_line(small_model, repo, tmp_path):
    """`evolver eval` as a new user types it, with no key and no model flags but the small size: the
    command starts the embedded server before it builds its request (the other order failed every
    simulation), the customer speaks, the agent answers, and what it prints agrees with result.json.
    (Kept short, as the model is slow on a CPU: two steps, and the agent's replies capped at 32 tokens.)"""
    stats_file = tmp_path / "local_stats.json"
    env = {serving.STATS_ENV: str(stats_file), provision.CACHE_ENV: str(small_model.parent)}
    # Two steps: the customer's first message, then the agent's answer (and the tool's result, if it called one),
    # all this test asks of the model; each further step, and each token of a long answer (the agent's first has run past
    # 100), is more generation on a CPU, slowest of all when other processes share it.
    proc = run_cli(
        [
            "eval",
            str(repo),
            "--json",
            "--local-size",
            "small",
            "--domain",
            "mock",
            "--split",
            "base",
            "--task-ids",
            "create_task_1",
            "--trials",
            "1",
            "--max-steps",
            "2",
            "--agent-arg",
            "max_tokens=32",
        ],
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "embedded model ready at http://127.0.0.1:" in proc.stderr
    summary = json.loads(proc.stdout)
    result = json.loads(Path(summary["result_file"]).read_text())
    assert {k: summary[k] for k in ("num_simulations", "scored", "failed", "infra_errors", "avg_reward")} == {
        k: result["summary"][k] for k in ("num_simulations", "scored", "failed", "infra_errors", "avg_reward")
    }
    assert result["candidate_error"] is None and result["worker_note"] is None, (result["candidate_error"], result["worker_note"])
    [sim] = result["simulations"]
    assert sim["outcome"] == "ok" and not sim["error"], sim["error"]
    assert sim["termination_reason"] in CLEAN_ENDINGS, sim["termination_reason"]
    assert {m["model"] for m in result["models"].values()} == {"local/agent", "local/user", "local/judge"}
    assert all(m["api_base"].startswith("http://127.0.0.1:") for m in result["models"].values())

    # Each role got replies from the embedded server, counted on the serving path ...
    counters = json.loads(stats_file.read_text())
    assert counters["agent"]["replies"] >= 1 and counters["user"]["replies"] >= 1, counters
    # ... the customer spoke and the agent answered, both with tokens the server generated,
    trajectory = json.loads((Path(summary["result_file"]).parent / sim["trajectory_file"]).read_text())
    produced = {"assistant": 0, "user": 0}
    for m in trajectory["messages"]:
        if m["role"] in produced and m.get("usage"):
            produced[m["role"]] += m["usage"]["completion_tokens"]
    assert produced["assistant"] > 0 and produced["user"] > 0, produced
    assert any(m["role"] == "user" and m.get("content") for m in trajectory["messages"])
    # ... and the server is gone with the command: no process names this test's own copy of the model (another
    # test process on the machine may serve a model of the same name from its own cache).
    assert subprocess.run(["pgrep", "-f", str(small_model)], capture_output=True).returncode == 1
