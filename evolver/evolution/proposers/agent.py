"""The investigating proposer: the meta-LLM works like a coding agent before it commits to a patch.

A litellm tool-calling loop. The meta-LLM lists and reads the analysis failures and trajectories,
reads and searches agent/ and the guide, looks at the run's earlier candidates, edits a scratch copy
of agent/ (every edit answered at once with what validation says), tries the copy on a few analysis
tasks in the sandbox, and submits. Every tool is one of evolver's own functions over that data
(evolver.evolution.evidence, evolver.evolution.scratch): a tool name or argument from the meta-LLM
selects among them and is checked, never run. A bad call gets a one-line refusal as its result.

Cheap on the embedded model: the system prompt and the tool schemas are the same for every proposal
and the conversation only grows, so llama.cpp's prompt cache carries it from turn to turn; tool
results are short and paged.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from evolver.data import RoleModel, RoleUsage, write_json_atomic
from evolver.evaluation.scan import parse_python
from evolver.evolution.digest import describe, load_messages
from evolver.evolution.evidence import compile_pattern, paged
from evolver.evolution.patch import ParseError, Proposal, parse_proposal
from evolver.evolution.proposers import Outcome, Request, meta_call
from evolver.evolution.scratch import Scratch
from evolver.models import takes

TEMPERATURE = 0.4  # a retry, or a second proposal from the same parent, should not repeat the first word for word
ANSWER_TOKENS = 1500
TOOLS_PLEASE = "Use the tools: answer with a tool call, not text."
ONE_AT_A_TIME = "not run: call one tool at a time; call it again if you still need it"
# Told to a model that repeats itself; one after the other where the model takes no temperature to vary its answer.
AGAIN = ("do something different now.", "try another tool, or another file or task.",
         "read the failing trajectory again from its start: what went wrong first?", "change your edit, or submit what you have.")
MAX_TRY_TASKS = 3
TRY_LINES = 8  # the end of a failed try's conversation, shown with its result
MAX_RESULT_CHARS = 4000  # a tool result the model reads in full: longer ones are cut (the tools page their output)

SYSTEM = """You improve the harness of a customer-service agent that runs on tau2-bench. The model inside the
agent is frozen: you change only files under agent/, through the tools. Work like a careful engineer:

1. See what fails: list_failures, then read one or two failing trajectories whole with read_trajectory.
   Where a failure's line says what the harness changed, read_turn shows that turn as the model saw it
   and names the lines of agent/agent.py that run there: read those lines first.
2. Find the cause in the code: list_files, read_file, search_code. The guide Harness.md explains the
   agent, its four harness layers (switched in agent/harness.toml) and the skill format.
3. Look at what earlier candidates of this run tried and why they were not kept: list_candidates,
   show_candidate. Do not repeat a rejected idea unless you change what made it fail.
4. Make one focused change: replace_in_file, write_file, set_layer. Each edit is checked at once and
   is applied only if it passes; fix what the answer says.
5. Try your change on the failing tasks with try_agent and compare with the parent's result.
6. When it helps, call submit with a short title and a rationale naming the failures it fixes.

Rules: fix procedures, not answers. Never copy ids, names or values from a trajectory into the agent
(they are masked as <Vn> anyway, and a patch holding task data is refused). Do not read environment
variables, start processes, open files outside agent/ or use the network from the agent's code.
Call one tool at a time and keep your messages short."""

# What usually comes next, said after a tool's answer: a small model loses the thread of SYSTEM's steps.
NEXT = {
    "list_failures": "read_turn on a failure the harness changed, else read_trajectory on one of them",
    "read_turn": "read_file agent/agent.py at the lines it names",
    "read_trajectory": "read_file at the lines its last line names; otherwise find the code responsible: search_code, or read_file agent/agent.py",
    "search_code": "read_file around the line that matters",
    "read_file": "replace_in_file, with old copied exactly from these lines without the line numbers",
    "replace_in_file": "try_agent on a failing task, then submit",
    "write_file": "try_agent on a failing task, then submit",
    "set_layer": "try_agent on a failing task, then submit",
    "try_agent": "submit if it helped; otherwise change your edit",
}

TOOLS = [
    ("list_failures", "List the analysis simulations that failed, one line each, optionally only lines containing a text "
                      "(a task label like T3, a termination reason, a failed check, 'tool error').",
     {"contains": ("string", False, "only lines containing this text"), "page": ("integer", False, "page number, from 1")}),
    ("read_trajectory", "Read one analysis simulation's conversation (masked), a page at a time.",
     {"task": ("string", True, "task label, e.g. T3"), "trial": ("integer", False, "trial number, default 0"),
      "page": ("integer", False, "page number, from 1")}),
    ("read_turn", "Read one turn of an analysis simulation as the model saw it: what tau2 gave the harness, each request to the "
                  "model and its answer, what the harness handed back, what it changed and the lines of agent/agent.py that ran there.",
     {"task": ("string", True, "task label, e.g. T3"), "trial": ("integer", False, "trial number, default 0"),
      "turn": ("integer", False, "turn number; default: the first turn the harness changed")}),
    ("search_trajectories", "Search every analysis trajectory for a regular expression; returns the matching lines.",
     {"pattern": ("string", True, "a regular expression"), "page": ("integer", False, "page number, from 1")}),
    ("list_files", "List the files of agent/ you may read and edit, and the harness layers' switches.", {}),
    ("read_file", "Read lines of a file of agent/ or the guide Harness.md, with line numbers.",
     {"path": ("string", True, "e.g. agent/agent.py or Harness.md"), "start": ("integer", False, "first line, default 1"),
      "end": ("integer", False, "last line")}),
    ("search_code", "Search agent/'s files and Harness.md for a regular expression.",
     {"pattern": ("string", True, "a regular expression"), "page": ("integer", False, "page number, from 1")}),
    ("list_candidates", "List the earlier candidates of this run: verdict, gate effect, title.", {}),
    ("show_candidate", "Show an earlier candidate: its diff, verdict and the gate tasks it flipped.",
     {"label": ("string", True, "e.g. 2 or 3b"), "page": ("integer", False, "page number, from 1")}),
    ("replace_in_file", "Replace an exact, unique piece of text in a file of agent/ (checked and applied at once).",
     {"path": ("string", True, "e.g. agent/agent.py"), "old": ("string", True, "the exact text to replace, copied from read_file "
                                                                          "without the line numbers"),
      "new": ("string", True, "the new text")}),
    ("write_file", "Write a whole file under agent/, e.g. a new skill agent/skills/NAME.md (checked and applied at once).",
     {"path": ("string", True, "e.g. agent/skills/check-ids.md"), "content": ("string", True, "the whole file")}),
    ("set_layer", "Switch a harness layer on or off in agent/harness.toml.",
     {"layer": ("string", True, "h2_action_realization, h3_environment_contract, h4_trajectory_regulation or h5_procedural_skills"),
      "on": ("boolean", True, "true to switch it on")}),
    ("try_agent", "Run your edited agent on up to 3 analysis tasks (one trial each) and compare with the parent's rewards.",
     {"tasks": ("array", True, "task labels, e.g. [\"T2\", \"T5\"]")}),
    ("submit", "Submit the edited agent as your candidate. Call it once, when your change is made and checked.",
     {"title": ("string", True, "one line"), "rationale": ("string", True, "which failures it fixes and why")}),
]


def tool_schemas() -> list[dict]:
    out = []
    for name, description, params in TOOLS:
        properties = {}
        for pname, (kind, _, text) in params.items():
            properties[pname] = {"type": kind, "description": text, **({"items": {"type": "string"}} if kind == "array" else {})}
        required = [p for p, (_, needed, _) in params.items() if needed]
        out.append({"type": "function", "function": {"name": name, "description": description,
                                                     "parameters": {"type": "object", "properties": properties, "required": required}}})
    return out


PYTHON_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list}


def check_arguments(name: str, raw) -> dict | str:
    """The arguments of a call the meta-LLM made, checked against the tool's schema; or why not."""
    spec = next((params for tool, _, params in TOOLS if tool == name), None)
    if spec is None:
        return f"there is no tool '{str(name)[:60]}'; the tools are: {', '.join(t for t, _, _ in TOOLS)}"
    if isinstance(raw, str):
        try:
            raw = json.loads(raw or "{}")
        except ValueError:
            return f"the arguments of {name} are not valid JSON"
    if not isinstance(raw, dict):
        return f"the arguments of {name} must be an object"
    unknown = sorted(set(raw) - set(spec))
    if unknown:
        return f"{name} takes no argument {unknown[0]!r}; it takes: {', '.join(spec) or 'nothing'}"
    for pname, (kind, needed, _) in spec.items():
        if pname not in raw:
            if needed:
                return f"{name} needs the argument {pname!r}"
            continue
        value = raw[pname]
        if kind == "integer" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            raw[pname] = value = int(value)  # small models quote numbers
        if not isinstance(value, PYTHON_TYPES[kind]) or (kind == "integer" and isinstance(value, bool)):
            return f"the argument {pname!r} of {name} must be a{'n' if kind[0] in 'aei' else ''} {kind}"
    return raw


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

    def propose(self, request: Request) -> Outcome:
        session = Session(request)
        try:
            return session.run()
        finally:
            session.save()


class Session:
    """One proposal: the conversation, the scratch copy, the budget, the transcript."""

    def __init__(self, request: Request):
        self.request, self.budget = request, request.budget
        request.workdir.mkdir(parents=True, exist_ok=True)
        self.scratch = Scratch(request.parent, request.workdir / "scratch", request.identifiers, request.guide)
        self.started = time.monotonic()
        self.usage = RoleUsage()
        self.turns = self.tries = 0
        self.tools_used: dict[str, int] = {}
        self.rejected_edits = 0
        self.transcript: list[dict] = []
        self.submitted: Proposal | None = None
        self.tried: list[dict] = []
        self.said: set[str] = set()  # replies without a tool call, to tell a loop
        self.repeats = 0
        self.calls_made: set[tuple] = set()
        self.handlers: dict[str, Callable] = self._handlers()
        self.choice = tool_choice(request.meta)
        meta = request.meta
        self.tempered = takes(meta.model, meta.api_base, meta.llm_args, "temperature", TEMPERATURE)  # a temperature of the proposer's own

    # -- the conversation ---------------------------------------------------------------------
    def run(self) -> Outcome:
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
                answer = self.patch_in_text(message.content or "")
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
        first = r.evidence.first_read()
        parts.append(f"Budget: {self.budget.turns} turns, {self.budget.tries} try simulations, {self.budget.seconds / 60:.0f} minutes. "
                     + (f"Start with {first}: the lines where the harness changed what passed between tau2 and the model."
                        if first else "Start by reading a failing trajectory."))
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

    # -- tools ------------------------------------------------------------------------------
    def call(self, name, raw_arguments) -> str:
        args = check_arguments(name, raw_arguments)
        self.tools_used[str(name)[:40]] = self.tools_used.get(str(name)[:40], 0) + 1
        self.request.progress(self.turns, self.budget.turns, str(name)[:40])
        if isinstance(args, str):
            return args
        try:
            result = self.handlers[name](**args)
        except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's to read, never the run's
            result = f"{name} failed: {type(exc).__name__}: {str(exc)[:200]}"
        if len(result) > MAX_RESULT_CHARS:
            result = result[:MAX_RESULT_CHARS] + "\n... (cut; ask for the next page)"
        hint = NEXT.get(name)
        return f"{result}\n(next: {hint})" if hint and not result.startswith(("not ", "no ", "cannot ", "there is no")) else result

    def _handlers(self) -> dict[str, Callable]:
        e, s = self.request.evidence, self.scratch
        return {
            "list_failures": lambda contains="", page=1: e.failures(contains, page),
            "read_trajectory": lambda task, trial=0, page=1: e.trajectory(task, trial, page),
            "read_turn": lambda task, trial=0, turn=None: e.turn(task, trial, turn),
            "search_trajectories": lambda pattern, page=1: e.search(pattern, page),
            "list_files": lambda: s.files(),
            "read_file": lambda path, start=1, end=None: s.read(path, start, end),
            "search_code": self.search_code,
            "list_candidates": lambda: e.candidates(),
            "show_candidate": lambda label, page=1: e.candidate(label, page),
            "replace_in_file": lambda path, old, new: self.edited(s.replace(path, old, new)),
            "write_file": lambda path, content: self.edited(s.write(path, content)),
            "set_layer": lambda layer, on: self.edited(s.set_layer(layer, on)),
            "try_agent": self.try_agent,
            "submit": self.submit,
        }

    def edited(self, answer: str) -> str:
        if not answer.startswith("applied"):
            self.rejected_edits += 1
        return answer

    def search_code(self, pattern: str, page: int = 1) -> str:
        compiled = compile_pattern(pattern)
        if isinstance(compiled, str):
            return compiled
        hits = self.scratch.search(compiled)
        if hits == [None]:
            return "the pattern took too long to match; use a simpler one"
        return paged(f"{len(hits)} matching line(s)", hits, page, size=40)

    def try_agent(self, tasks: list) -> str:
        if self.request.try_agent is None:
            return "trying is not available in this run"
        left = self.budget.tries - self.tries
        if left <= 0:
            return f"no try simulations left (the budget is {self.budget.tries}); submit or keep editing"
        ids = self.request.evidence.labelled_trials(tasks[:MAX_TRY_TASKS])
        if isinstance(ids, str):
            return ids
        problem = self.scratch.problem()
        if problem:
            return f"nothing to try: {problem}"
        ids = ids[:left]
        self.tries += len(ids)
        result, result_dir = self.request.try_agent(self.scratch.root, ids)
        e = self.request.evidence
        parent = {r.task_id: r for r in e.analysis.simulations if r.trial == 0}
        lines = []
        for sim in sorted(result.simulations, key=lambda r: e.labels[r.task_id]):
            before = parent.get(sim.task_id)
            was = "n/a" if before is None or before.reward is None else f"{before.reward:.2f}"
            now = "not measured" if sim.outcome == "infra_error" else f"{sim.reward or 0.0:.2f}"
            lines.append(f"{e.labels[sim.task_id]}: parent {was} -> yours {now}, ended by {sim.termination_reason} after {sim.steps} messages")
            if sim.outcome != "infra_error" and (sim.reward or 0.0) < 1.0:  # the short form of what went wrong
                failure = describe(e.labels[sim.task_id], sim, load_messages(result_dir, sim))
                lines.append(f"  failed: {failure.signature}")
                lines.extend(f"  | {line[:160]}" for line in failure.transcript[-TRY_LINES:])
        self.tried.append({"tasks": [e.labels[t] for t in ids], "rewards": [s.reward for s in result.simulations]})
        return "\n".join(lines) + f"\n({self.budget.tries - self.tries} try simulation(s) left)"

    def next_step(self) -> str:
        """The step of SYSTEM's procedure the conversation has not reached yet, as one concrete call."""
        used = self.tools_used
        if not used.get("read_trajectory"):
            return "Next: call read_trajectory with the task of a failure (list_failures names them)."
        if not used.get("read_file"):
            return "Next: call read_file (path agent/agent.py, start and end around the code that caused it; search_code finds it)."
        if not self.scratch.changed():
            return "Next: call replace_in_file (or write_file, set_layer) to fix it."
        if not used.get("try_agent") and self.request.try_agent is not None and self.tries < self.budget.tries:
            return "Next: call try_agent with a failing task to see if your edit helps."
        return "Next: call submit with a title and a rationale."

    def patch_in_text(self, text: str) -> str:
        """A model that answers with a whole patch in the guide's format instead of calling tools: its edits
        go through the same checks, one by one, and a clean result is its submission ("" when the text holds no patch)."""
        try:
            proposal = parse_proposal(text)
        except ParseError:
            return ""
        answers = [self.edited(self.scratch.apply(edit)) for edit in proposal.edits]
        refused = [a for a in answers if not a.startswith("applied")]
        if refused:
            return f"Your patch was not applied in full: {refused[0]} Fix it with the tools (read_file, replace_in_file), then submit."
        self.tools_used["patch_in_text"] = self.tools_used.get("patch_in_text", 0) + 1
        answer = self.submit(proposal.title, proposal.rationale)
        return "" if answer == "submitted" else f"Your patch was applied but {answer}. Fix it with the tools, then submit."

    def submit(self, title: str, rationale: str) -> str:
        problem = self.scratch.problem()
        if problem:
            return f"not submitted: {problem}"
        if not title.strip():
            return "not submitted: give a one-line title"
        self.submitted = Proposal(title=title.strip().splitlines()[0][:200], rationale=rationale.strip()[:4000], edits=self.scratch.edits())
        return "submitted"

    # -- the result -------------------------------------------------------------------------
    def outcome(self, stop: str | None) -> Outcome:
        stats = {"turns": self.turns, "tools": dict(self.tools_used), "edits": self.scratch.edits_made, "rejected_edits": self.rejected_edits,
                 "tries": self.tried, "try_simulations": self.tries, "seconds": round(self.elapsed(), 1), "tokens": self.usage.tokens,
                 "stopped": stop or "submitted", "transcript": str(self.transcript_file)}
        if self.submitted is None:
            return Outcome(proposal=None, errors=[f"no candidate submitted: {stop}"], usage=self.usage, stats=stats)
        return Outcome(proposal=self.submitted, usage=self.usage, stats=stats)

    @property
    def transcript_file(self) -> Path:
        return self.request.workdir / "transcript.json"

    def log(self, role: str, content: str, **extra) -> None:
        self.transcript.append({"turn": self.turns, "at": round(self.elapsed(), 2), "role": role, "content": content, **extra})
        self.save()

    def save(self) -> None:
        write_json_atomic(self.transcript_file, {"label": self.request.label, "usage": self.usage.model_dump(), "turns": self.turns,
                                                 "messages": self.transcript})


def written_call(text: str):
    """The first tool call written in a reply's text instead of made, as a tool call; None if there is none.
    Small models write `{"name": ..., "arguments": {...}}` with raw line breaks inside its strings (not JSON,
    so the serving path's parser misses it), a tag `<function name="x" arguments='{...}'/>`, or Python:
    `list_failures()`, `read_file(path="a")`. Parsed as data (json, or ast with literal values only):
    nothing is evaluated."""
    import ast
    import re

    names = {name: list(params) for name, _, params in TOOLS}
    decoder = json.JSONDecoder(strict=False)  # strict=False: control characters inside strings
    # <function name="x" arguments='{..}'/>, the JSON quoted or bare
    tagged = re.search(r"""name\s*=\s*["'](\w+)["'][^>]*?arguments\s*=\s*['"]?(?=\{)""", text, re.S)
    if tagged and tagged.group(1) in names:
        try:
            args, _ = decoder.raw_decode(text, tagged.end())
        except ValueError:
            args = None
        if isinstance(args, dict):
            return SimpleNamespace(id=f"written_{tagged.start()}", function=SimpleNamespace(name=tagged.group(1), arguments=json.dumps(args)))
    for match in re.finditer(r"\{", text):
        try:
            found, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("name") in names and isinstance(found.get("arguments", {}), dict):
            function = SimpleNamespace(name=found["name"], arguments=json.dumps(found.get("arguments", {})))
            return SimpleNamespace(id=f"written_{match.start()}", function=function)
    for match in re.finditer(r"\b(" + "|".join(names) + r")\(", text):
        line = text[match.start():].split("\n", 1)[0]
        for end in range(len(line), len(match.group(0)), -1):  # the longest piece of the line that parses as one call
            try:
                node = parse_python(line[:end].strip(), mode="eval").body
            except SyntaxError:
                continue
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.func.id not in names:
                break
            try:
                args = dict(zip(names[node.func.id], (ast.literal_eval(a) for a in node.args)))
                args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg})
            except (ValueError, SyntaxError, TypeError):
                break
            function = SimpleNamespace(name=node.func.id, arguments=json.dumps(args))
            return SimpleNamespace(id=f"written_{abs(hash(line)) % 10**8}", function=function)
    return None


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
