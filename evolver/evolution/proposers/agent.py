"""The investigating proposer: the meta-LLM works like a coding agent before it commits to a patch.

A litellm tool-calling loop. The meta-LLM lists and reads the analysis failures and trajectories,
reads and searches agent/ and the guide, looks at the run's earlier candidates, edits a scratch copy
of agent/ (every edit answered at once with what validation says), tries the copy on a few analysis
tasks in the sandbox, and submits. Every tool is one of evolver's own functions over that data
(evolver.evolution.evidence, evolver.evolution.scratch): a tool name or argument from the meta-LLM
selects among them and is checked, never run. A bad call gets a one-line refusal as its result.
Here: the conversation, its budget and its transcript; the tools themselves are agent_tools.

Cheap on the embedded model: the system prompt and the tool schemas are the same for every proposal
and the conversation only grows, so llama.cpp's prompt cache carries it from turn to turn; tool
results are short and paged.
"""

from __future__ import annotations

import time
from pathlib import Path

from evolver.data import RoleModel, RoleUsage, write_json_atomic
from evolver.evolution.patch import Proposal
from evolver.evolution.proposers import ProposalResult, Request, meta_call
from evolver.evolution.proposers.agent_tools import Tally, Toolbox, tool_schemas, written_call
from evolver.evolution.scratch import Scratch
from evolver.models import takes

TEMPERATURE = 0.4  # a retry, or a second proposal from the same parent, should not repeat the first word for word
ANSWER_TOKENS = 1500
TOOLS_PLEASE = "Use the tools: answer with a tool call, not text."
ONE_AT_A_TIME = "not run: call one tool at a time; call it again if you still need it"
# Told to a model that repeats itself; one after the other where the model takes no temperature to vary its answer.
AGAIN = ("do something different now.", "try another tool, or another file or task.",
         "read the failing trajectory again from its start: what went wrong first?", "change your edit, or submit what you have.")

SYSTEM = """You improve the harness of a customer-service agent that runs on tau2-bench. The model inside the
agent is frozen: you change only files under agent/, through the tools. Work like a careful engineer:

1. See what fails: list_failures, then read one or two failing trajectories whole with read_trajectory.
   Where a failure's line says what the harness changed, read_turn shows that turn as the model saw it
   and names the lines of agent/agent.py that run there: read those lines first.
2. Find the cause in the code: list_files, read_file, search_code. The guide Harness.md explains the
   agent, its four harness layers (switched in agent/harness.toml) and the skill format.
3. Look at what earlier candidates of this run tried and why they were not kept: list_candidates,
   show_candidate. Do not repeat a rejected idea unless you change what made it fail.
4. Make one focused change: replace_in_file, remove_lines, write_file, set_layer. Each edit is checked
   at once and is applied only if it passes; fix what the answer says.
5. Try your change on the failing tasks with try_agent and compare with the parent's result.
6. When it helps, call submit with a short title and a rationale naming the failures it fixes.

Rules: fix procedures, not answers. Never copy ids, names or values from a trajectory into the agent
(they are masked as <Vn> anyway, and a patch holding task data is refused). Do not read environment
variables, start processes, open files outside agent/ or use the network from the agent's code.
Call one tool at a time and keep your messages short."""


def tool_choice(meta: RoleModel) -> dict:
    """A model on a local server is held to one call per reply (evolver.local.serving constrains its decoding):
    the embedded 1.5B otherwise spent most turns on prose and empty tags. Hosted models call tools natively
    and keep the choice, so a provider without "required" is never asked for it."""
    return {"tool_choice": "required"} if meta.model.startswith("local/") else {}


def request_shape(meta: RoleModel) -> dict:
    """What this proposer's meta-LLM requests carry besides the conversation (its first turn's), for the preflight."""
    return {"tools": tool_schemas(), "answer_tokens": ANSWER_TOKENS, "temperature": TEMPERATURE, "seed": 1, **tool_choice(meta)}


class Investigator:
    name = "agent"

    def propose(self, request: Request) -> ProposalResult:
        session = Session(request)
        try:
            return session.run()
        finally:
            session.save()


class Session:
    """One proposal: the conversation, its budget and its transcript. The tools that answer its calls (agent_tools.Toolbox)
    get the request, the scratch copy and the tally they count in, which the session reads for its next step and stats."""

    def __init__(self, request: Request):
        self.request, self.budget = request, request.budget
        request.workdir.mkdir(parents=True, exist_ok=True)
        self.scratch = Scratch(request.parent, request.workdir / "scratch", request.identifiers, request.guide)
        self.tally = Tally()
        self.tools = Toolbox(request, self.scratch, self.tally)
        self.started = time.monotonic()
        self.usage = RoleUsage()
        self.turns = 0
        self.transcript: list[dict] = []
        self.said: set[str] = set()  # replies without a tool call, to tell a loop
        self.repeats = 0
        self.calls_made: set[tuple] = set()
        self.choice = tool_choice(request.meta)
        meta = request.meta
        self.tempered = takes(meta.model, meta.api_base, meta.llm_args, "temperature", TEMPERATURE)  # a temperature of the proposer's own

    # -- the conversation ---------------------------------------------------------------------
    def run(self) -> ProposalResult:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.opening()}]
        self.log("system", SYSTEM)
        self.log("user", messages[1]["content"])
        schemas = tool_schemas()
        stop = None
        while self.submitted is None:
            stop = self.out_of_budget()
            if stop:
                break
            self.turns += 1
            self.request.progress(self.turns, self.budget.turns, "thinking")
            left = self.budget.turns - self.turns
            if left == 0:  # the last turn: only submit is useful now
                messages.append({"role": "user", "content": "This is your last turn: call submit now if your edit is in place."})
            response, usage = meta_call(self.request.meta, messages, self.request.llm_retries, tools=schemas, answer_tokens=ANSWER_TOKENS,
                                        timeout=max(60.0, self.budget.seconds - self.elapsed()), **self.sampling(), **self.choice)
            self.usage = self.usage.add(usage)
            message = response.choices[0].message
            calls = list(message.tool_calls or [])[:1]  # one at a time: the next depends on this one's answer
            if not calls and (written := written_call(message.content or "")):
                calls = [written]  # a small model writes `read_file(path="agent/agent.py")` as text
            self.log("assistant", message.content or "", calls=[{"name": c.function.name, "arguments": c.function.arguments} for c in calls],
                     usage=usage.model_dump())
            if not calls:
                answer = self.tools.patch_in_text(message.content or "")
                if self.submitted is None:
                    note = (answer or TOOLS_PLEASE) + " " + self.next_step()
                    if (message.content or "") in self.said:  # the same words again: a small model is looping
                        self.repeats += 1
                        note += " You wrote exactly this before: " + self.again()
                    self.said.add(message.content or "")
                    # A reply that is neither a call nor a patch stays out of the conversation: a small model
                    # copies its own earlier prose (a plan, said again every turn) instead of calling a tool.
                    if answer:
                        messages.append(_assistant(message, calls))
                    elif len(messages) > 2 and messages[-1]["role"] == "user":
                        messages.pop()  # the note it did not follow: the new one replaces it
                    messages.append({"role": "user", "content": note})
                    self.log("user", note)
                continue
            messages.append(_assistant(message, calls))
            call = calls[0]
            result = self.call(call.function.name, call.function.arguments)
            if (call.function.name, call.function.arguments) in self.calls_made:  # a small model's loop, in calls this time
                self.repeats += 1
                result += f"\nYou made exactly this call before: {self.again()} {self.next_step()}"
            self.calls_made.add((call.function.name, call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            # The provider's turn goes back as it came, every call in it answered: one was run, the others were not.
            messages += [{"role": "tool", "tool_call_id": c.id, "content": ONE_AT_A_TIME} for c in (message.tool_calls or [])[1:]]
            self.log("tool", result, name=call.function.name)
        return self.outcome(stop)

    @property
    def submitted(self) -> Proposal | None:
        return self.tools.submitted

    @property
    def tools_used(self) -> dict[str, int]:
        return self.tally.used

    def call(self, name, raw_arguments) -> str:
        """One tool call at the current turn."""
        return self.tools.call(name, raw_arguments, self.turns)

    def sampling(self) -> dict:
        """A model that repeats itself word for word gets more temperature, and every turn its own seed (a server
        with a fixed seed would otherwise repeat the same sample forever): where the model takes them."""
        meta = self.request.meta
        out = {"seed": self.turns} if takes(meta.model, meta.api_base, meta.llm_args, "seed", self.turns) else {}
        return {"temperature": min(1.0, TEMPERATURE + 0.2 * self.repeats), **out} if self.tempered else out

    def again(self) -> str:
        """What a model that repeats itself is told: where no temperature will make its next answer differ
        (a reasoning model takes only 1), the words themselves differ from one repeat to the next."""
        return AGAIN[0] if self.tempered else AGAIN[self.repeats % len(AGAIN)]

    def opening(self) -> str:
        r = self.request
        i, k = r.focus
        parts = [f"Proposal {i + 1} of {k} from the same parent." + (" Work on failures the others are less likely to pick: "
                                                                      f"start from failure {i + 1} of the list." if k > 1 else ""),
                 r.evidence.failures(),
                 "Earlier candidates of this run:\n" + r.evidence.candidates()]
        if r.learnings:
            parts.append("Learnings so far:\n" + "\n".join(r.learnings[-8:]))
        first, place = r.evidence.first_read(), r.evidence.first_place()
        parts.append(f"Budget: {self.budget.turns} turns, {self.budget.tries} try simulations, {self.budget.seconds / 60:.0f} minutes. "
                     + (f"Start with {first}: the lines where the harness changed what passed between tau2 and the model."
                        if first else "Start by reading a failing trajectory.") + _removal(place, self.scratch)
                     + (f" {off[0].upper()}{off[1:]}." if (off := r.evidence.layer_off()) else ""))
        return "\n\n".join(parts)

    def out_of_budget(self) -> str | None:
        if self.turns >= self.budget.turns:
            return f"used all {self.budget.turns} turns"
        if self.usage.tokens >= self.budget.tokens:
            return f"used {self.usage.tokens:,} of {self.budget.tokens:,} tokens"
        # A turn is not started that would likely end past the time budget: the mean turn so far, as the guess.
        turn = self.elapsed() / self.turns if self.turns else 0.0
        if self.elapsed() + turn >= self.budget.seconds:
            return f"ran for {self.elapsed():.0f} s of {self.budget.seconds:.0f} s (a turn takes about {turn:.0f} s)"
        return None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # -- the procedure ---------------------------------------------------------------------
    def next_step(self) -> str:
        """The step of SYSTEM's procedure the conversation has not reached yet, as one concrete call."""
        used = self.tally.used
        if not used.get("read_trajectory"):
            return "Next: call read_trajectory with the task of a failure (list_failures names them)."
        if not used.get("read_file"):
            return "Next: call read_file (path agent/agent.py, start and end around the code that caused it; search_code finds it)."
        if not self.scratch.changed():
            return "Next: call replace_in_file or remove_lines (or write_file, set_layer) to fix it." + self.tools.layer_step()
        why, _ = self.tools.refusal()
        if why:  # the 1.5B was told to submit after each refused submit, and did, until its time ran out
            return f"Next: change your edit, submit would refuse it: {why[:160]}." + self.tools.layer_step()
        if not used.get("try_agent") and self.request.try_agent is not None and self.tally.tries < self.budget.tries:
            return "Next: call try_agent with a failing task to see if your edit helps."
        return "Next: call submit with a title and a rationale."

    # -- the result -------------------------------------------------------------------------
    def outcome(self, stop: str | None) -> ProposalResult:
        stats = {"turns": self.turns, "tools": dict(self.tally.used), "edits": self.scratch.edits_made, "rejected_edits": self.tally.rejected_edits,
                 "tries": self.tally.tried, "try_simulations": self.tally.tries, "seconds": round(self.elapsed(), 1), "tokens": self.usage.tokens,
                 "stopped": stop or "submitted", "transcript": str(self.transcript_file)}
        if self.submitted is None:
            return ProposalResult(proposal=None, errors=[f"no candidate submitted: {stop}"], usage=self.usage, stats=stats)
        return ProposalResult(proposal=self.submitted, usage=self.usage, stats=stats)

    @property
    def transcript_file(self) -> Path:
        return self.request.workdir / "transcript.json"

    def log(self, role: str, content: str, **extra) -> None:
        self.transcript.append({"turn": self.turns, "at": round(self.elapsed(), 2), "role": role, "content": content, **extra})
        self.save()

    def save(self) -> None:
        write_json_atomic(self.transcript_file, {"label": self.request.label, "usage": self.usage.model_dump(), "turns": self.turns,
                                                 "messages": self.transcript})


def _removal(place, scratch: Scratch) -> str:
    """The edit that takes out the lines the view names, as a call a small model can copy: it copied the call to read
    them every time, then copied them unchanged into every replace_in_file. Only where remove_lines would be applied, and
    not for an `if` that leaves messages out: removed whole, it takes every message its body writes with it."""
    run = place.removable_run() if place is not None else None
    if run is None or not scratch.removable(place.path, *run) or (place.losing and scratch.guards(place.path, *run)):
        return ""
    return (f" If those lines are the fault, remove_lines path={place.path} start={run[0]} end={run[1]} takes them out;"
            " otherwise correct them with replace_in_file.")


def _assistant(message, calls):
    """The meta-LLM's turn for the next request. Its own calls: the provider's message as it came (Anthropic
    refuses a tool-using turn handed back without its signed thinking blocks). A call it wrote as text:
    that call as plain data, with the turn's thinking blocks."""
    if not calls or any(calls[0] is own for own in message.tool_calls or []):
        return message
    out = {"role": "assistant", "content": message.content or "",
           "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments or "{}"}}
                          for c in calls]}
    blocks = getattr(message, "thinking_blocks", None)
    return {**out, "thinking_blocks": blocks} if blocks else out
