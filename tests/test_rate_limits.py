"""One rate limit per provider endpoint and model (evolver.ratelimit), shared by every call of a command.

The lane's arithmetic on a clock of the test's own (no waiting): permits spaced first come first
served, a 429 and its Retry-After, learning and growing, the provider's declared limit, tokens; the
limiter reached from another process over its socket; what litellm's answers say. Then `evolver
eval` (local backend, and on Ray in tests/test_ray.py) against a fake provider that enforces a
token-bucket limit: nothing lost, every 429 counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from evolver import ratelimit
from evolver.ratelimit.answers import Answer, estimate_tokens, read_headers
from evolver.ratelimit.lanes import HEADROOM, Limiter, matches
from evolver.ratelimit.learning import CUT, FLOOR, GROWTH, HOLD, Learner
from evolver.ratelimit.service import Service
from tests.conftest import run_cli
from tests.scripts.fake_openai import FakeOpenAI, Limit


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_configured_limit_spaces_permits_first_come_first_served():
    clock = Clock()
    limiter = Limiter({"gpt-4.1-mini": {"rpm": 600}}, clock=clock)  # 10 a second; a second's burst at once
    booked = [limiter.reserve("openai/gpt-4.1-mini", 1) for _ in range(20)]
    delays = [delay for delay, _ in booked]
    assert delays == pytest.approx([0.0] * 11 + [0.1 * k for k in range(1, 10)])
    assert limiter.reserve("openai/other", 1)[0] == 0.0  # another model is another lane, unlimited
    view = limiter.snapshot()["openai/gpt-4.1-mini"]
    assert (view["rpm"], view["source"], view["calls"], view["waiting"]) == (600, "configured", 20, 9)
    started = clock.now
    for delay, ticket in booked[11:]:  # each comes back when it was told to: its turn
        clock.now = started + delay
        assert limiter.reserve("openai/gpt-4.1-mini", 1, ticket)[0] == 0.0
    view = limiter.snapshot()["openai/gpt-4.1-mini"]
    assert view["waited"] == pytest.approx(sum(delays)) and view["waiting"] == 0
    assert limiter.throttled() == pytest.approx(0.9)  # the span during which some call waited


def test_a_waiting_call_keeps_its_place_when_the_rate_changes_and_a_retry_after_pauses_the_lane():
    clock = Clock()
    limiter = Limiter(clock=clock)
    limiter.report("m", Answer(limit_requests=60 / HEADROOM))  # the provider declares 1 a second
    tickets = [limiter.reserve("m") for _ in range(4)]
    assert [d for d, _ in tickets] == pytest.approx([0.0, 1.0, 2.0, 3.0])  # a limit that just appeared: no burst
    clock.now += 1.0
    assert limiter.reserve("m", 1, tickets[1][1]) == (0.0, tickets[1][1])  # waited its turn: it goes
    limiter.report("m", Answer(limit_requests=120 / HEADROOM))  # now 2 a second
    assert limiter.reserve("m", 1, tickets[2][1])[0] == 0.0  # told 1 s, goes now: a second's burst is now 2 calls
    assert limiter.reserve("m", 1, tickets[3][1])[0] == pytest.approx(0.5)  # told 2 s: half a second, still after it
    limiter.report("m", Answer(limited=True, retry_after=5.0))  # the provider says: nobody for 5 s
    again, same = limiter.reserve("m", 1, tickets[3][1])
    assert same == tickets[3][1] and again == pytest.approx(5.5)  # its place, behind the pause
    assert limiter.snapshot()["m"]["limited"] == 1


def test_429s_teach_a_rate_that_halves_and_sustained_success_grows_it():
    clock = Clock()
    limiter = Limiter(clock=clock)
    for _ in range(40):  # 40 answered over 4 s: 10 a second got through
        limiter.reserve("m")
        limiter.report("m", Answer())
        clock.now += 0.1
    assert limiter.snapshot()["m"]["rpm"] is None  # no 429 yet: no limit
    limiter.report("m", Answer(limited=True))  # the first cut: from what got through over the last seconds
    first = limiter.snapshot()["m"]["rpm"]
    assert first == pytest.approx(10 * 60 * CUT, rel=0.05)
    limiter.report("m", Answer(limited=True))  # the calls already in flight: no second cut within the hold
    assert limiter.snapshot()["m"]["rpm"] == first
    clock.now += HOLD
    limiter.report("m", Answer(limited=True))
    assert limiter.snapshot()["m"]["rpm"] == pytest.approx(first * CUT)
    clock.now += HOLD
    limiter.report("m", Answer())
    clock.now += 10
    limiter.report("m", Answer())
    cut = first * CUT
    assert limiter.snapshot()["m"]["rpm"] == pytest.approx(cut)  # nobody waited for a turn: the rate was not what held calls back

    for _ in range(30):  # calls waiting for their turn: now the rate is what holds them back
        limiter.reserve("m")
    assert limiter.snapshot()["m"]["waiting"] > 0
    limiter.report("m", Answer())
    clock.now += 10
    limiter.report("m", Answer())
    assert limiter.snapshot()["m"]["rpm"] == pytest.approx(cut * (1 + GROWTH) ** 10, abs=0.1)  # 10 s of growth


def test_a_limit_the_provider_declares_wins_and_tokens_are_booked_and_corrected():
    clock = Clock()
    limiter = Limiter(clock=clock)
    limiter.report("m", Answer(limit_requests=1200, limit_tokens=60_000))  # x-ratelimit-limit-*: 20/s, 1000 tokens/s
    view = limiter.snapshot()["m"]
    assert (view["rpm"], view["tpm"], view["source"]) == (pytest.approx(1200 * HEADROOM), round(60_000 * HEADROOM), "provider")
    limiter.report("m", Answer(limited=True))  # a declared limit is not second-guessed by learning
    assert limiter.snapshot()["m"]["rpm"] == pytest.approx(1200 * HEADROOM)
    assert limiter.reserve("m", 1)[0] == 0.0 and limiter.reserve("m", 1)[0] == pytest.approx(60 / 1200 / HEADROOM)
    # A limit that just appeared: spaced from now on, no burst.

    tokens = Limiter({"m": {"tpm": 60_000}}, clock=clock)  # 1000 tokens a second, a second's worth at once
    assert tokens.reserve("m", 2000)[0] == 0.0
    assert tokens.reserve("m", 10)[0] == pytest.approx(1.0)  # the first call's 2000 tokens: 2 s of the limit, 1 s of burst
    tokens.report("m", Answer(tokens=500), estimated=2000)  # it used 1500 fewer than booked: they come back
    assert tokens.reserve("m", 10)[0] == 0.0
    assert tokens.snapshot()["m"]["calls"] == 3 and tokens.snapshot()["m"]["rpm"] is None


def test_what_litellm_answers_says_about_the_limit():
    headers = {
        "llm_provider-x-ratelimit-limit-requests": "500",
        "x-ratelimit-limit-tokens": "200000",
        "llm_provider-retry-after-ms": "1500",
        "retry-after": "7",
    }
    found = read_headers(headers)
    assert (found.limit_requests, found.limit_tokens, found.retry_after) == (500, 200000, 1.5)
    assert read_headers({"Retry-After": "2"}).retry_after == 2.0
    assert read_headers({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}).retry_after is None
    assert read_headers({"x-ratelimit-limit-requests": "-1"}).limit_requests is None
    assert estimate_tokens({"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 50}) == 150


@pytest.mark.parametrize(
    "configured, key, matched",
    [
        ("openai/gpt-4.1-mini", "openai/gpt-4.1-mini", True),
        ("gpt-4.1-mini", "openai/gpt-4.1-mini", True),
        ("openai/gpt-4.1-mini", "gpt-4.1-mini", True),
        ("openai/gpt-4.1", "openai/gpt-4.1-mini", False),
        ("openai/qwen @ http://127.0.0.1:8000/v1", "openai/qwen @ http://127.0.0.1:8000/v1", True),
        ("openai/qwen @ http://127.0.0.1:8000/v1", "openai/qwen @ http://127.0.0.1:9000/v1", False),
        ("openai/qwen", "openai/qwen @ http://127.0.0.1:9000/v1", True),
    ],
)
def test_a_configured_name_names_its_lanes(configured, key, matched):
    assert matches(configured, key) is matched


CHILD = """
import json, sys, time
from evolver import ratelimit
print("ready", flush=True)
sys.stdin.readline()  # both go together, however long each took to start
granted = []
for _ in range(6):
    ratelimit.permit("openai/m", None, {"messages": []}).answered(None)
    granted.append(time.time())
print(json.dumps(granted))
"""


def test_worker_processes_take_their_turn_in_the_commands_limiter_over_its_socket(tmp_path):
    """Two processes of 6 calls each, against 120 rpm (2 a second, 3 at once): the 12 permits go out of the
    command's one queue, 3 at once and then every half second, which neither process alone would need (6 of
    its own take 1.5 s). Measured where the permits are granted, so a slow process can only come later."""
    limiter = Limiter({"openai/m": {"rpm": 120}})
    granted, reserve = [], limiter.reserve

    def recorded(key, tokens=1, ticket=None):
        delay, ticket = reserve(key, tokens, ticket)
        if delay <= 0:  # the call's turn: it goes
            granted.append(time.monotonic())
        return delay, ticket

    limiter.reserve = recorded
    service = Service(limiter, tmp_path)
    try:
        children = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD],
                env={**os.environ, ratelimit.ENV: str(service.path)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        assert [c.stdout.readline() for c in children] == ["ready\n"] * 2
        for c in children:
            c.stdin.write("go\n")
            c.stdin.flush()
        a, b = [json.loads(c.communicate(timeout=60)[0]) for c in children]
    finally:
        service.close()
    assert limiter.snapshot()["openai/m"]["calls"] == len(granted) == 12  # each call came back for its turn, once
    assert min(a) < max(b) and min(b) < max(a)  # the two were in the queue together
    granted.sort()
    late = [round(t - granted[0] - (k - 2) * 0.5, 3) for k, t in enumerate(granted) if k >= 3]
    assert min(late) >= -0.01, late  # 3 at once, then one every half second: none early
    assert not service.path.exists()


def test_a_switched_off_limiter_lets_every_call_go_as_before(monkeypatch):
    """EVOLVER_RATE_LIMITER=off: not even an installed limiter is asked or told; each call goes at once."""
    limiter = Limiter()  # a lane appears in it at the first call it is asked or told of
    previous = ratelimit.install(limiter)
    monkeypatch.setenv(ratelimit.ENV, "off")
    try:
        assert ratelimit.current() is None
        with ratelimit.tracking() as tally:
            turns = [ratelimit.permit("openai/m", None, {"messages": []}) for _ in range(5)]
            for turn in turns:
                turn.failed(RuntimeError("429"), limited=True)
    finally:
        ratelimit.install(previous)
    assert all(turn.limiter is None for turn in turns) and limiter.snapshot() == {}  # the limiter heard of none of them
    assert (tally["openai/m"].calls, tally["openai/m"].waited, tally["openai/m"].limited) == (5, 0.0, 5)  # still counted, none waited


def test_a_simulations_calls_are_tallied_in_its_own_thread():
    limiter = Limiter()
    ratelimit.install(limiter)
    try:
        seen = {}

        def simulation(name: str, calls: int) -> None:
            with ratelimit.tracking() as tally:
                for _ in range(calls):
                    ratelimit.permit(f"openai/{name}", None, {"messages": []}).answered(None)
            seen[name] = tally

        threads = [threading.Thread(target=simulation, args=(n, k)) for n, k in (("a", 3), ("b", 5))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        ratelimit.install(None)
    assert {n: {k: v.calls for k, v in t.items()} for n, t in seen.items()} == {"a": {"openai/a": 3}, "b": {"openai/b": 5}}


def test_a_provider_that_refuses_everything_is_still_called_now_and_then():
    """No answer ever got through: the rate falls by half a cut at a time, never below one call a minute."""
    learner, now = Learner(), 0.0
    for _ in range(40):
        learner.limited(now, through=FLOOR)
        now += HOLD
    assert learner.rate == FLOOR


# ---- through the command line, against a rate-limited provider ---------------------------------

SHORT = dict(rpm=600, burst=1.0, latency=0.2)  # 10 calls a second; 24 at once ask for about 12x that
TASKS = ["create_task_1", "update_task_1", "update_task_with_message_history", "impossible_task_1"]


def shared_model_flags(fake: FakeOpenAI) -> list[str]:
    """Every role on one model name, so one limit: the body names the script that answers it."""
    flags = ["--api-base", fake.api_base]
    for role in ("agent", "user", "judge"):
        flags += [f"--{role}-model", "openai/shared", f"--{role}-arg", f'extra_body={{fake_role = "{role}"}}']
    return flags


def limited_eval(repo, fake: FakeOpenAI, *extra: str, env: dict | None = None) -> tuple[dict, dict]:
    proc = run_cli(
        [
            "eval",
            str(repo),
            "--json",
            "--task-ids",
            ",".join(TASKS),
            "--trials",
            "16",
            "--concurrency",
            "24",
            *shared_model_flags(fake),
            *extra,
        ],
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    return summary, json.loads(open(summary["result_file"]).read())


WAVE = 24  # calls at once in these evaluations (--concurrency 24)


def assert_held(summary: dict, result: dict, fake: FakeOpenAI) -> None:
    """Nothing lost; every call and 429 the provider saw is counted in result.json, per simulation and in all; once the
    limiter has learnt the limit, at most 5% of calls are refused (assert_learnt)."""
    assert summary["num_simulations"] == 64 and summary["infra_errors"] == 0 and summary["scored"] == 64
    [(lane, tally)] = summary["rate_limits"].items()
    assert lane == f"openai/shared @ {fake.api_base}"
    # the provider also had the command's preflight, one request per role (three settings) before the evaluation
    assert tally["limited"] == sum(fake.limited.values()) and tally["calls"] == sum(fake.requests.values()) - 3
    assert sum(s["rate_limits"][lane]["calls"] for s in result["simulations"]) == tally["calls"]
    assert_learnt(fake)


def assert_learnt(fake: FakeOpenAI) -> None:
    """At most 5% of the calls are refused once the limiter has learnt the limit (the issue's target; without a limiter
    about 80% are). Learnt: after the first 429, a whole wave of calls (as many as go at once) answered in a row. Counted
    in the order the provider answered them, not in seconds: how long the opening burst and the first cuts take depends
    on the machine's load, not on the limiter."""
    order = [refused for _, refused in sorted([(t, False) for t in fake.answered] + [(t, True) for t in fake.refused])]
    shown = "".join("R" if refused else "a" for refused in order)
    assert True in order, shown  # 24 at once against a bucket of 10: there is a limit to learn
    first = order.index(True)  # nothing is learnt before a 429
    learnt = next((i for i in range(first + WAVE, len(order) + 1) if not any(order[i - WAVE : i])), None)
    assert learnt is not None, f"never a wave of {WAVE} calls without a 429 after the first: {shown}"
    rest = order[learnt:]
    assert len(rest) >= 100, shown  # most of the evaluation comes after the learning
    assert sum(rest) <= 0.05 * len(rest), shown  # few calls refused once learnt


def test_one_limit_for_every_role_and_worker_learnt_from_429s(repo):
    with FakeOpenAI(limit=Limit(**SHORT)) as fake:
        summary, result = limited_eval(repo, fake)
        assert_held(summary, result, fake)
        assert sum(fake.requests.values()) >= 250  # a few hundred calls


def test_the_live_view_and_status_show_each_limited_lane():
    """The run's view (ConsoleView) names the rate in use, calls waiting, 429s and time waited of every lane that is
    or was limited; `evolver status`'s table shows the same from status()'s dict."""
    import io

    from rich.console import Console

    from evolver import events as ev
    from evolver.cli.console import ConsoleView
    from evolver.cli.run_tables import status_table

    lanes = {
        "openai/gpt-4.1-mini": {
            "rpm": 490.0,
            "tpm": None,
            "source": "learnt",
            "in_use_rpm": 480.0,
            "waiting": 7,
            "calls": 1200,
            "limited": 31,
            "waited": 95.5,
        },
        "openai/gpt-4.1": {
            "rpm": None,
            "tpm": None,
            "source": "",
            "in_use_rpm": 3.0,
            "waiting": 0,
            "calls": 3,
            "limited": 0,
            "waited": 0.0,
        },
    }
    view = ConsoleView(Console(file=io.StringIO(), width=300), every=3600)
    view(ev.RateLimits(lanes))
    line = view._summary()
    assert (
        "openai/gpt-4.1-mini: 490 rpm (learnt), 480 calls in the last minute, 7 waiting; 1,200 calls, 31 answered 429, "
        "95.5 s waited for a turn"
    ) in line
    assert "openai/gpt-4.1:" not in line  # never limited: nothing to say
    view(ev.Ended("stopped", "done", "run-x"))
    out = io.StringIO()
    info = {
        "run_id": "run-x",
        "status": "finished",
        "step": None,
        "stop_reason": None,
        "iterations_done": 1,
        "iterations_target": 1,
        "candidates_per_iteration": 1,
        "best": {"iteration": 0, "gate": None, "branch": "b"},
        "decisions": 0,
        "expected_false_keeps": 0.0,
        "simulations_done": 1,
        "simulations_planned_at_most": 1,
        "infra_errors": {},
        "elapsed_seconds": 1.0,
        "eta_seconds_at_most": None,
        "usage": {},
        "cost_text": "$0",
        "models": {},
        "split_note": "",
        "rate_limits": {"openai/m": {"calls": 9, "limited": 2, "waited": 1.5}},
    }
    Console(file=out, width=300).print(status_table(info))
    assert "openai/m: no limit known; 9 calls, 2 answered 429, 1.5 s waited for a turn" in out.getvalue()
