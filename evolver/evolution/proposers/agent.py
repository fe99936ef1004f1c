"""The investigating proposer: the meta-LLM works like a coding agent before it commits to a patch.

A litellm tool-calling loop. The meta-LLM lists and reads the analysis failures and trajectories,
reads and searches agent/ and the guide, looks at the run's earlier candidates, edits a scratch copy
of agent/ (every edit answered at once with what validation says), tries the copy on a few analysis
tasks in the sandbox, and submits. Every tool is one of evolver's own functions over that data
(evolver.evolution.evidence, evolver.evolution.scratch): a tool name or argument from the meta-LLM
selects among them and is checked, never run. A bad call gets a one-line refusal as its result.
Here: the conversation, its budget and its transcript; the tools themselves are agent_tools; what the meta-LLM
is told, prompts/agent/ (system.md, opening.md, texts.toml, tools.toml).

Cheap on the embedded model: the system prompt and the tool schemas are the same for every proposal
and the conversation only grows, so llama.cpp's prompt cache carries it from turn to turn; tool
results are short and paged.
"""

from __future__ import annotations

import time
from pathlib import Path

from evolver.data import RoleModel, RoleUsage, write_json_atomic
from evolver.evolution.patch import Proposal
from evolver.evolution.proposers import ProposalResult, Proposer, Request, meta_call
from evolver.evolution.proposers.agent_tools import Tally, Toolbox, tool_schemas, written_call
from evolver.evolution.proposers.prompts import Prompts, sentences
from evolver.evolution.scratch import Scratch
from evolver.models import takes

TEMPERATURE = 0.4  # a retry, or a second proposal from the same parent, should not repeat the first word for word
ANSWER_TOKENS = 1500
TOKEN_SHARE = 0.5  # of its token budget, what a proposal is assumed to use before any is measured (the dry run's figure)


def tool_choice(meta: RoleModel) -> dict:
    """A model on a local server is held to one call per reply (evolver.local.serving constrains its decoding):
    a small model otherwise spends most turns on prose and empty tags. Hosted models call tools natively
    and keep the choice, so a provider without "required" is never asked for it."""
    return {"tool_choice": "required"} if meta.model.startswith("local/") else {}


def request_shape(meta: RoleModel) -> dict:
    """What this proposer's meta-LLM requests carry besides the conversation (its first turn's), for the preflight."""
    return {"tools": tool_schemas(), "answer_tokens": ANSWER_TOKENS, "temperature": TEMPERATURE, "seed": 1, **tool_choice(meta)}


class Investigator(Proposer):
    name = "agent"
    reuses_prompt = True

    @classmethod
    def meta_shape(cls, meta: RoleModel) -> dict:
        return request_shape(meta)

    @classmethod
    def meta_tokens(cls, cfg, one_request: int) -> tuple[int, int]:
        return round(cfg.proposer_tokens * TOKEN_SHARE), cfg.proposer_tokens

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
        self.prompts = Prompts("agent", request.prompts_dir)
        self.tally = Tally()
        self.tools = Toolbox(request, self.scratch, self.tally, self.prompts)
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
        system = self.prompts.text("system")
        messages = [{"role": "system", "content": system}, {"role": "user", "content": self.opening()}]
        self.log("system", system)
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
                messages.append({"role": "user", "content": self.prompts.short("last_turn")})
            response, usage = meta_call(
                self.request.meta,
                messages,
                self.request.llm_retries,
                tools=schemas,
                answer_tokens=ANSWER_TOKENS,
                timeout=max(60.0, self.budget.seconds - self.elapsed()),
                **self.sampling(),
                **self.choice,
            )
            self.usage = self.usage.add(usage)
            message = response.choices[0].message
            calls = list(message.tool_calls or [])[:1]  # one at a time: the next depends on this one's answer
            if not calls and (written := written_call(message.content or "")):
                calls = [written]  # a small model writes `read_file(path="agent/agent.py")` as text
            self.log(
                "assistant",
                message.content or "",
                calls=[{"name": c.function.name, "arguments": c.function.arguments} for c in calls],
                usage=usage.model_dump(),
            )
            if not calls:
                answer = self.tools.patch_in_text(message.content or "")
                if self.submitted is None:
                    note = sentences(answer or self.prompts.short("tools_please"), self.next_step())
                    if (message.content or "") in self.said:  # the same words again: a small model is looping
                        self.repeats += 1
                        note = sentences(note, self.prompts.short("wrote_before", again=self.again()))
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
                result += "\n" + self.prompts.short("called_before", again=self.again(), next_step=self.next_step())
            self.calls_made.add((call.function.name, call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            # The provider's turn goes back as it came, every call in it answered: one was run, the others were not.
            not_run = self.prompts.short("one_at_a_time")
            messages += [{"role": "tool", "tool_call_id": c.id, "content": not_run} for c in (message.tool_calls or [])[1:]]
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
        again = self.prompts.shorts("again")
        return again[0] if self.tempered else again[self.repeats % len(again)]

    def opening(self) -> str:
        r, short = self.request, self.prompts.short
        i, k = r.focus
        first, place = r.evidence.first_read(), r.evidence.first_place()
        off = r.evidence.layer_off()
        return self.prompts.text(
            "opening",
            proposal=sentences(short("proposal", number=i + 1, count=k), short("focus", number=i + 1) if k > 1 else ""),
            failures=r.evidence.failures(),
            candidates=r.evidence.candidates(),
            learnings=short("learnings", learnings="\n".join(r.learnings[-8:])) if r.learnings else "",
            turns=self.budget.turns,
            tries=self.budget.tries,
            minutes=f"{self.budget.seconds / 60:.0f}",
            start=(short("start_at", first=first) if first else short("start_reading"))
            + _removal(place, self.scratch, self.prompts)
            + (f" {off[0].upper()}{off[1:]}." if off else ""),
        )

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
        """The step of system.md's procedure the conversation has not reached yet, as one concrete call."""
        used, short = self.tally.used, self.prompts.short
        if not used.get("read_trajectory"):
            return short("next_step.read_trajectory")
        if not used.get("read_file"):
            return short("next_step.read_file")
        if not self.scratch.changed():
            return sentences(short("next_step.edit"), self.tools.layer_step())
        why, _ = self.tools.refusal()
        if why:  # not "submit": told that after a refused submit, a model submits the same again until its time runs out
            return sentences(short("next_step.change", why=why[:160]), self.tools.layer_step())
        if not used.get("try_agent") and self.request.try_agent is not None and self.tally.tries < self.budget.tries:
            return short("next_step.try")
        return short("next_step.submit")

    # -- the result -------------------------------------------------------------------------
    def outcome(self, stop: str | None) -> ProposalResult:
        stats = {
            "turns": self.turns,
            "tools": dict(self.tally.used),
            "edits": self.scratch.edits_made,
            "rejected_edits": self.tally.rejected_edits,
            "tries": self.tally.tried,
            "try_simulations": self.tally.tries,
            "seconds": round(self.elapsed(), 1),
            "tokens": self.usage.tokens,
            "stopped": stop or "submitted",
            "transcript": str(self.transcript_file),
        }
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
        write_json_atomic(
            self.transcript_file,
            {"label": self.request.label, "usage": self.usage.model_dump(), "turns": self.turns, "messages": self.transcript},
        )


def _removal(place, scratch: Scratch, prompts: Prompts = Prompts("agent")) -> str:
    """The edit that takes out the lines the view names, as a call a small model can copy (a sentence to append, with its
    space): it copied the call to read them every time, then copied them unchanged into every replace_in_file. Only where
    remove_lines would be applied, and not for an `if` that leaves messages out: removed whole, it takes every message its
    body writes with it."""
    run = place.removable_run() if place is not None else None
    if run is None or not scratch.removable(place.path, *run) or (place.losing and scratch.guards(place.path, *run)):
        return ""
    return " " + prompts.short("removal", path=place.path, start=run[0], end=run[1])


def _assistant(message, calls):
    """The meta-LLM's turn for the next request. Its own calls: the provider's message as it came (Anthropic
    refuses a tool-using turn handed back without its signed thinking blocks). A call it wrote as text:
    that call as plain data, with the turn's thinking blocks."""
    if not calls or any(calls[0] is own for own in message.tool_calls or []):
        return message
    out = {
        "role": "assistant",
        "content": message.content or "",
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments or "{}"}}
            for c in calls
        ],
    }
    blocks = getattr(message, "thinking_blocks", None)
    return {**out, "thinking_blocks": blocks} if blocks else out
