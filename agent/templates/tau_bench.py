"""The tau2-bench agent that evolver optimizes.

Two copies exist: agent/templates/tau_bench.py is the pristine baseline that no
run edits, and agent/agent.py starts as a copy of it and is the one evolution
changes. Harness.md (repository root) explains how to change it.

One turn is `HarnessAgent.generate_next_message`. Four harness layers sit
between the model and tau2, each switched on in harness.toml next to this
file (no file: all off, and the agent behaves exactly like tau2's LLMAgent):

- H3 environment contract  `tool_schemas`:     rules appended to the tool descriptions the model sees.
- H5 procedural skills     `skill_texts`:      the agent/skills/*.md most relevant to the conversation.
- H4 trajectory regulation `regulation_notes`: notes on loops, error streaks, stagnation, step budget;
                           `should_stop`:      ends a conversation whose model ignores such a note.
- H2 action realization    `realize_action`:   tool calls checked against their schema and repaired,
                                               or sent back to the model for one retry.

The model name and LLM arguments are not set here: tau2 passes them in
(`llm`, `llm_args`) from evolver's configuration at run time.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field
from tau2.agent.base import ValidAgentInputMessage, is_valid_agent_history_message
from tau2.agent.llm_agent import LLMAgent
from tau2.data_model.message import (
    APICompatibleMessage,
    AssistantMessage,
    Message,
    MultiToolMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from tau2.utils.llm_utils import generate

from evolver.toolcalls import parse_text_tool_calls

HERE = Path(__file__).parent

AGENT_INSTRUCTION = """
You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only.
""".strip()

SYSTEM_PROMPT = """
<instructions>
{agent_instruction}
</instructions>
<policy>
{domain_policy}
</policy>
""".strip()

# H3: tool name -> rule appended to that tool's description ("*": every tool).
TOOL_CONTRACTS: dict[str, str] = {
    "*": "Pass only ids and values that the user stated or an earlier tool result returned; never guess them.",
}

# H4 thresholds.
H4_REPEAT_LIMIT = 2  # the same call this often: note; once more after it failed that often: stop
H4_ERROR_STREAK = 2  # consecutive failed tool calls before a note
H4_CALLS_WITHOUT_USER = 8  # tool calls since the user last spoke before a note
H4_STEP_BUDGET = 30  # the step limit when none is given (evolver gives the evaluation's max_steps as self.max_steps)
H4_BUDGET_WARNING = 6  # warn when this few steps remain
H4_STOP_MESSAGE = "I am sorry, I cannot complete this request. ###STOP###"

# H5 retrieval.
H5_TOP_K = 2
H5_MIN_SCORE = 1.0  # below this a skill shares only common words with the conversation


class HarnessSwitches(BaseModel):
    """Which layers are on: harness.toml next to this file; a missing file means all off."""

    model_config = ConfigDict(extra="forbid")  # a misspelt switch fails the import, never stays off silently

    h2_action_realization: bool = False
    h3_environment_contract: bool = False
    h4_trajectory_regulation: bool = False
    h5_procedural_skills: bool = False


def load_switches(path: Path) -> HarnessSwitches:
    return HarnessSwitches(**tomllib.loads(path.read_text())) if path.exists() else HarnessSwitches()


def load_skills(folder: Path) -> dict[str, str]:
    """Skill name (file stem) -> text, for every agent/skills/*.md."""
    return {p.stem: p.read_text().strip() for p in sorted(folder.glob("*.md"))} if folder.is_dir() else {}


class HarnessState(BaseModel):
    """Per-conversation state: the prompt, the messages seen so far, and what each layer did."""

    system_messages: list[SystemMessage]
    messages: list[APICompatibleMessage] = Field(default_factory=list)
    h2_repairs: list[str] = Field(default_factory=list)  # calls read from text, fixed, or sent back
    h4_notes: list[str] = Field(default_factory=list)  # corrective notes given
    h5_skills: list[str] = Field(default_factory=list)  # skills in the latest context


class HarnessAgent(LLMAgent):
    """A tau2 local agent; tau2 builds one per simulation."""

    switches = load_switches(HERE / "harness.toml")
    skills = load_skills(HERE / "skills")
    max_steps: Optional[int] = None  # tau2's step limit for this simulation, set by evolver before the first turn

    @property
    def system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(
            agent_instruction=AGENT_INSTRUCTION, domain_policy=self.domain_policy
        )

    def get_init_state(
        self, message_history: Optional[list[Message]] = None
    ) -> HarnessState:
        history = list(message_history or [])
        if not all(is_valid_agent_history_message(m) for m in history):
            raise ValueError("message history may hold only user, assistant and tool messages")
        return HarnessState(
            system_messages=[SystemMessage(role="system", content=self.system_prompt)],
            messages=history,
        )

    def generate_next_message(
        self, message: ValidAgentInputMessage, state: HarnessState
    ) -> tuple[AssistantMessage, HarnessState]:
        if isinstance(message, MultiToolMessage):
            state.messages.extend(message.tool_messages)
        else:
            state.messages.append(message)
        context = state.system_messages + state.messages + self.guidance(state)
        reply = self.call_llm(context)
        if self.switches.h2_action_realization:
            reply = self.realize_action(reply, context, state)
        if self.switches.h4_trajectory_regulation and self.should_stop(reply, state):
            reply = AssistantMessage(role="assistant", content=H4_STOP_MESSAGE, cost=reply.cost, usage=reply.usage)
        state.messages.append(reply)
        return reply, state

    def is_stop(self, message: AssistantMessage) -> bool:
        """tau2 ends the conversation on H4's stop message (no other reply can equal it)."""
        return self.switches.h4_trajectory_regulation and message.content == H4_STOP_MESSAGE

    def call_llm(self, messages: list) -> AssistantMessage:
        return generate(model=self.llm, tools=self.tool_schemas(), messages=messages, **self.llm_args)

    def guidance(self, state: HarnessState) -> list[SystemMessage]:
        """H5 skills and H4 notes for this turn only, as one system message after the conversation.

        Rebuilt every turn so it fits the conversation as it is now and never piles
        up in the history; placed last so the model reads it last and a server's
        prompt cache of everything before it stays valid.
        """
        parts = []
        if self.switches.h5_procedural_skills:
            parts += self.skill_texts(state)
        if self.switches.h4_trajectory_regulation:
            parts += self.regulation_notes(state)
        return [SystemMessage(role="system", content="\n\n".join(parts))] if parts else []

    # ---- H3 environment contract -------------------------------------------------

    def tool_schemas(self) -> list:
        """The tools as the model sees them: tau2's own, or with TOOL_CONTRACTS appended (H3)."""
        if not self.switches.h3_environment_contract:
            return self.tools
        described = []
        for tool in self.tools:
            schema = json.loads(json.dumps(tool.openai_schema))  # a copy: tau2's Tool stays untouched
            rules = [TOOL_CONTRACTS[k] for k in ("*", tool.name) if k in TOOL_CONTRACTS]
            schema["function"]["description"] = "\n\n".join([schema["function"].get("description", ""), *rules]).strip()
            described.append(SimpleNamespace(openai_schema=schema))  # tau2's generate reads only .openai_schema
        return described

    # ---- H5 procedural skills ----------------------------------------------------

    def skill_texts(self, state: HarnessState) -> list[str]:
        """The H5_TOP_K skills most relevant to the conversation so far."""
        state.h5_skills = retrieve_skills(conversation_text(state.messages), self.skills, H5_TOP_K)
        return [f'<skill name="{name}">\n{self.skills[name]}\n</skill>' for name in state.h5_skills]

    # ---- H4 trajectory regulation ------------------------------------------------

    def regulation_notes(self, state: HarnessState) -> list[str]:
        """Short corrective notes on what went wrong in the trajectory so far."""
        calls = call_outcomes(state.messages)
        just_acted = isinstance(state.messages[-1], ToolMessage)
        notes = [
            repeated_call_note(calls) if just_acted else None,
            error_streak_note(calls) if just_acted else None,
            stagnation_note(state.messages),
            budget_note(state.messages, self.max_steps or H4_STEP_BUDGET),
        ]
        notes = [n for n in notes if n]
        state.h4_notes += notes
        return [f"<harness_note>\n{n}\n</harness_note>" for n in notes]

    def should_stop(self, reply: AssistantMessage, state: HarnessState) -> bool:
        """Stop when the model makes a call again that already failed H4_REPEAT_LIMIT times.

        By then regulation_notes has told it not to; repeating anyway means it
        is stuck, and each further attempt only burns the step budget.
        """
        failed = Counter(call for call, error in call_outcomes(state.messages) if error)
        return any(failed[call_text(c)] >= H4_REPEAT_LIMIT for c in reply.tool_calls or [])

    # ---- H2 action realization ---------------------------------------------------

    def realize_action(self, reply: AssistantMessage, context: list, state: HarnessState) -> AssistantMessage:
        """Repair the reply's tool calls; if one is still broken, show the model why and let it retry once.

        A broken call never reaches the environment on the first attempt. After
        the retry whatever is left goes through: the environment reports it, and
        the model is never blocked from acting.
        """
        schemas = {t.name: t.openai_schema for t in self.tools}
        parsed = calls_from_text(reply, schemas, id_prefix=f"h2_{len(state.messages)}")
        if parsed is not reply:
            state.h2_repairs.append(f"read {len(parsed.tool_calls)} call(s) written as text")
        reply, problems = parsed, {}
        for i, call in enumerate(reply.tool_calls or []):
            was = call_text(call)
            if problem := repair_call(call, schemas):
                problems[i] = problem
                state.h2_repairs.append(f"sent back: {problem}")
            elif call_text(call) != was:
                state.h2_repairs.append(f"repaired: {was} -> {call_text(call)}")
        if not problems:
            return reply
        feedback = [
            ToolMessage(id=c.id, role="tool", error=True, content=(
                f"Error: not executed. {problems[i]} Correct the call and try again." if i in problems
                else "Not executed because another call in the same message was invalid."
            ))
            for i, c in enumerate(reply.tool_calls)
        ]
        retry = calls_from_text(self.call_llm(context + [reply] + feedback), schemas, id_prefix=f"h2r_{len(state.messages)}")
        for call in retry.tool_calls or []:
            repair_call(call, schemas)
        return charge_attempt(retry, reply)


# ---- H2 helpers: schema checks and mechanical repairs ----------------------------

JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict, "null": type(None)}


def calls_from_text(reply: AssistantMessage, schemas: dict[str, dict], id_prefix: str) -> AssistantMessage:
    """A reply that wrote its tool calls as JSON text becomes a reply with real tool calls."""
    if reply.tool_calls or not reply.content:
        return reply
    found, _ = parse_text_tool_calls(reply.content, list(schemas))
    if not found:
        return reply
    calls = [ToolCall(id=f"{id_prefix}_{i}", name=c["name"], arguments=c["arguments"]) for i, c in enumerate(found)]
    # tau2 sends a message with tool calls to the environment only: its text would never reach the user.
    return reply.model_copy(update={"content": None, "tool_calls": calls})


def repair_call(call: ToolCall, schemas: dict[str, dict]) -> Optional[str]:
    """Fix in place what is mechanically recoverable; return what is still wrong, or None."""
    name = known_tool_name(call.name, schemas)
    if name is None:
        return f"Unknown tool '{call.name}'. Available tools: {', '.join(schemas)}."
    call.name = name
    params = schemas[name]["function"].get("parameters") or {}
    props, required = params.get("properties") or {}, params.get("required") or []
    problems = [f"missing required argument '{a}'" for a in required if a not in call.arguments]
    problems += [f"unknown argument '{a}' (arguments: {', '.join(props) or 'none'})" for a in call.arguments if a not in props]
    for arg in [a for a in call.arguments if a in props]:
        call.arguments[arg], problem = fit_value(call.arguments[arg], props[arg], required=arg in required)
        if problem:
            problems.append(f"argument '{arg}' {problem}")
    return f"Invalid call to {name}: {'; '.join(problems)}." if problems else None


def known_tool_name(name: str, schemas: dict[str, dict]) -> Optional[str]:
    """The tool meant, ignoring case and separators (createTask -> create_task); None if unknown or ambiguous."""
    if name in schemas:
        return name
    matches = [t for t in schemas if squash(t) == squash(name)]
    return matches[0] if len(matches) == 1 else None


def squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def fit_value(value: Any, spec: dict, required: bool) -> tuple[Any, Optional[str]]:
    """(value, None) when it fits the argument's schema, after lossless conversion; else (value, why not).

    Only what the schema states for certain is checked: a nested model ($ref)
    or an untyped argument is accepted as it is.
    """
    if value is None and not required:
        return value, None  # an optional argument left empty
    if "anyOf" in spec:
        for option in spec["anyOf"]:
            fitted, problem = fit_value(value, option, required)
            if problem is None:
                return fitted, None
        return value, f"has a value of the wrong type: {value!r}"
    kind = spec.get("type")
    if kind in JSON_TYPES:
        value = convert(value, kind)
        if not isinstance(value, JSON_TYPES[kind]) or (kind in ("integer", "number") and isinstance(value, bool)):
            return value, f"must be of type {kind}, got {type(value).__name__} {value!r}"
    if "enum" in spec and value not in spec["enum"]:
        same = [e for e in spec["enum"] if isinstance(e, str) and isinstance(value, str) and e.lower() == value.strip().lower()]
        if not same:
            return value, f"must be one of {spec['enum']}, got {value!r}"
        value = same[0]
    return value, None


def convert(value: Any, kind: str) -> Any:
    """Lossless conversions models often need: "5" -> 5, 1234 -> "1234", "true" -> True, '[1]' -> [1]."""
    if isinstance(value, str):
        text = value.strip()
        if kind == "integer" and re.fullmatch(r"-?\d+", text):
            return int(text)
        if kind == "number" and re.fullmatch(r"-?\d+(\.\d+)?", text):
            return float(text) if "." in text else int(text)
        if kind == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if kind in ("array", "object") and text.startswith(("[", "{")):
            try:
                return json.loads(text)
            except ValueError:
                return value
    if kind == "string" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def charge_attempt(reply: AssistantMessage, discarded: AssistantMessage) -> AssistantMessage:
    """Add the discarded attempt's tokens and cost to the reply kept, so usage stays honest."""
    usage = dict(reply.usage or {})
    for key, spent in (discarded.usage or {}).items():
        usage[key] = (usage.get(key) or 0) + (spent or 0)
    cost = None if reply.cost is None and discarded.cost is None else (reply.cost or 0) + (discarded.cost or 0)
    return reply.model_copy(update={"usage": usage or None, "cost": cost})


# ---- H4 helpers: reading the trajectory ------------------------------------------


def call_text(call: ToolCall) -> str:
    """A call as one canonical line, so identical calls compare equal."""
    return f"{call.name}({json.dumps(call.arguments, sort_keys=True)})"


def call_outcomes(messages: list) -> list[tuple[str, bool]]:
    """Every answered tool call so far as (call_text, failed), oldest first.

    Results are paired with calls by position: tau2 answers a message's calls in order.
    """
    outcomes, pending = [], []
    for m in messages:
        if isinstance(m, AssistantMessage) and m.tool_calls:
            pending = [call_text(c) for c in m.tool_calls]
        elif isinstance(m, ToolMessage) and pending:
            outcomes.append((pending.pop(0), m.error))
    return outcomes


def repeated_call_note(calls: list[tuple[str, bool]]) -> Optional[str]:
    if not calls:
        return None
    last = calls[-1][0]
    same = [failed for call, failed in calls if call == last]
    if len(same) < H4_REPEAT_LIMIT:
        return None
    outcome = " and it failed every time" if all(same) else ""
    return (f"You have made the call {last} {len(same)} times{outcome}. Do not make it again: "
            "change what is wrong, ask the user, or tell the user what you cannot do.")


def error_streak_note(calls: list[tuple[str, bool]]) -> Optional[str]:
    streak = len(calls) - next((i + 1 for i in range(len(calls) - 1, -1, -1) if not calls[i][1]), 0)
    if streak < H4_ERROR_STREAK:
        return None
    return (f"Your last {streak} tool calls failed. Read each error, check the arguments against the "
            "tool's description, and ask the user for anything you do not know instead of guessing.")


def stagnation_note(messages: list) -> Optional[str]:
    said = [m.content for m in messages if isinstance(m, AssistantMessage) and m.content]
    if len(said) >= 2 and said[-1] == said[-2]:
        return ("Your last two messages to the user were identical: the conversation is not moving. "
                "Do something different: act with a tool, ask a specific question, or explain the problem.")
    since_user = 0
    for m in reversed(messages):
        if isinstance(m, UserMessage):
            break
        if isinstance(m, AssistantMessage):
            since_user += len(m.tool_calls or [])
    if since_user < H4_CALLS_WITHOUT_USER:
        return None
    return (f"You have made {since_user} tool calls since the user last spoke. "
            "Tell the user what you found, or ask for what you need.")


def budget_note(messages: list, step_budget: int) -> Optional[str]:
    remaining = step_budget - len(messages)
    if remaining > H4_BUDGET_WARNING:
        return None
    return (f"About {max(remaining, 0)} steps remain before the conversation is cut off. "
            "Complete the essential action now, then tell the user the outcome.")


# ---- H5 helpers: lexical retrieval -----------------------------------------------

STOPWORDS = set("""a an and are as at be been but by can could do does for from had has have
he her his how i if in into is it its me my no not of on or our please she so that the their
them then there they this to us was we were what when which who will with would you your""".split())


def tokens(text: str) -> list[str]:
    """Words without stopwords and numbers, crudely stemmed (tasks -> task; cancelled, cancellation -> cancel)."""
    words = [w for w in re.findall(r"[a-z]+", text.lower()) if w not in STOPWORDS and len(w) > 2]
    return [(w[:-1] if w.endswith("s") else w)[:6] for w in words]


def skill_trigger(name: str, text: str) -> str:
    """What retrieval matches: the skill's name, title and "Use when ..." line (its first two lines)."""
    return " ".join([name.replace("-", " ")] + [line for line in text.splitlines() if line.strip()][:2])


def conversation_text(messages: list) -> str:
    """What a skill should match: what was said, the tools used, and the errors met."""
    parts = []
    for m in messages:
        if isinstance(m, (UserMessage, AssistantMessage)):
            parts += [m.content or ""] + [c.name.replace("_", " ") for c in m.tool_calls or []]
        elif isinstance(m, ToolMessage) and m.error:
            parts.append(m.content or "")
    return "\n".join(parts)


def retrieve_skills(query: str, skills: dict[str, str], k: int) -> list[str]:
    """Names of the k skills scoring highest on BM25 against the query (at least H5_MIN_SCORE)."""
    docs = {name: tokens(skill_trigger(name, text)) for name, text in skills.items()}
    if not docs:
        return []
    avg_len = sum(map(len, docs.values())) / len(docs)
    doc_freq = Counter(t for words in docs.values() for t in set(words))
    query_terms = set(tokens(query))

    def score(words: list[str]) -> float:
        counts, total = Counter(words), 0.0
        for t in query_terms & counts.keys():
            idf = math.log(1 + (len(docs) - doc_freq[t] + 0.5) / (doc_freq[t] + 0.5))
            total += idf * counts[t] * 2.2 / (counts[t] + 1.2 * (0.25 + 0.75 * len(words) / avg_len))
        return total

    scored = sorted(((score(words), name) for name, words in docs.items()), key=lambda s: (-s[0], s[1]))
    return [name for s, name in scored[:k] if s >= H5_MIN_SCORE]
