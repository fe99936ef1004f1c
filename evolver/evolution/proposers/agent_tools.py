"""The investigating proposer's tools (evolver.evolution.proposers.agent): what the meta-LLM may call
and their schemas (as prompts/agent/tools.toml declares them), how a call's arguments are checked, the
functions that answer each call, and a call a small model wrote as text instead of making it.

Every tool is one of evolver's own functions over the session's data (evolver.evolution.evidence,
evolver.evolution.scratch): a tool name or argument from the meta-LLM selects among them and is
checked, never run. A bad call gets a one-line refusal as its result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

from evolver.evaluation.scan import parse_python
from evolver.evolution.digest import describe, load_messages
from evolver.evolution.evidence import compile_pattern, paged, same_as_earlier
from evolver.evolution.noop import agent_files
from evolver.evolution.patch import ParseError, Proposal, parse_proposal
from evolver.evolution.proposers import Request
from evolver.evolution.proposers.prompts import Prompts, sentences
from evolver.evolution.scratch import Scratch

MAX_TRY_TASKS = 3
TRY_LINES = 8  # the end of a failed try's conversation, shown with its result
MAX_RESULT_CHARS = 4000  # a tool result the model reads in full: longer ones are cut (the tools page their output)

CHANGING = ("replace_in_file", "remove_lines", "write_file", "set_layer", "try_agent")  # tools whose next step is "submit"
# What the meta-LLM is offered, by tool name: its description, its arguments, its usual next step (prompts/agent/tools.toml).
# Read from the installed prompts, for the preflight shapes a request with them before any proposal is asked for.
TOOLS: dict[str, dict] = Prompts("agent").data("tools")


def tool_schemas() -> list[dict]:
    out = []
    for name, tool in TOOLS.items():
        params = tool.get("arguments", {})
        properties = {}
        for pname, arg in params.items():
            properties[pname] = {
                "type": arg["type"],
                "description": arg["description"],
                **({"items": {"type": "string"}} if arg["type"] == "array" else {}),
            }
        required = [p for p, arg in params.items() if arg["required"]]
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": tool["description"],
                    "parameters": {"type": "object", "properties": properties, "required": required},
                },
            }
        )
    return out


PYTHON_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list}


def check_arguments(name: str, raw) -> dict | str:
    """The arguments of a call the meta-LLM made, checked against the tool's schema; or why not."""
    tool = TOOLS.get(name) if isinstance(name, str) else None
    if tool is None:
        return f"there is no tool '{str(name)[:60]}'; the tools are: {', '.join(TOOLS)}"
    spec = tool.get("arguments", {})
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
    for pname, arg in spec.items():
        kind = arg["type"]
        if pname not in raw:
            if arg["required"]:
                return f"{name} needs the argument {pname!r}"
            continue
        value = raw[pname]
        if kind == "integer" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            raw[pname] = value = int(value)  # small models quote numbers
        if not isinstance(value, PYTHON_TYPES[kind]) or (kind == "integer" and isinstance(value, bool)):
            return f"the argument {pname!r} of {name} must be a{'n' if kind[0] in 'aei' else ''} {kind}"
    return raw


@dataclass
class Tally:
    """What the tools did in one proposal: the toolbox counts, the session reads it for its next step and its stats."""

    used: dict[str, int] = field(default_factory=dict)  # calls by tool name
    rejected_edits: int = 0
    tries: int = 0  # try simulations spent
    tried: list[dict] = field(default_factory=list)  # each try_agent call: its tasks and their rewards

    def count(self, name: str) -> None:
        self.used[name] = self.used.get(name, 0) + 1


class Toolbox:
    """The tools' answers in one proposal. They read the request's evidence, edit the scratch copy, spend the request's
    budget of try simulations through its try_agent and count what they do in the tally; a submit that is taken leaves
    the proposal in ``submitted``. What they add to an answer for the meta-LLM is in the session's prompts."""

    def __init__(self, request: Request, scratch: Scratch, tally: Tally, prompts: Prompts):
        self.request, self.budget, self.scratch, self.tally, self.prompts = request, request.budget, scratch, tally, prompts
        self.broken: tuple[int, str] | None = None  # (the scratch's edit count, what broke) after a try the edit broke
        self.submitted: Proposal | None = None
        self.handlers: dict[str, Callable] = self._handlers()

    def call(self, name, raw_arguments, turn: int) -> str:
        """The answer to one call the meta-LLM made at ``turn``: the tool's result, with what usually comes next."""
        args = check_arguments(name, raw_arguments)
        self.tally.count(str(name)[:40])
        self.request.progress(turn, self.budget.turns, str(name)[:40])
        if isinstance(args, str):
            return args
        try:
            result = self.handlers[name](**args)
        except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's to read, never the run's
            result = f"{name} failed: {type(exc).__name__}: {str(exc)[:200]}"
        if len(result) > MAX_RESULT_CHARS:
            result = result[:MAX_RESULT_CHARS] + self.prompts.short("cut")
        hint = TOOLS[name].get("next")
        if name in CHANGING and (why := self.refusal()[0]):  # "then submit" would be refused: say what would not
            hint = sentences(self.prompts.short("refused_edit", why=why[:160]), self.layer_step())
        refused = result.startswith(("not ", "no ", "cannot ", "there is no"))
        return self.prompts.short("hinted", result=result, hint=hint) if hint and not refused else result

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
            "remove_lines": lambda path, start, end: self.edited(s.remove_lines(path, start, end)),
            "write_file": lambda path, content: self.edited(s.write(path, content)),
            "set_layer": lambda layer, on: self.edited(s.set_layer(layer, on)),
            "try_agent": self.try_agent,
            "submit": self.submit,
        }

    def edited(self, answer: str) -> str:
        if not answer.startswith("applied"):
            self.tally.rejected_edits += 1
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
        left = self.budget.tries - self.tally.tries
        if left <= 0:
            return f"no try simulations left (the budget is {self.budget.tries}); submit or keep editing"
        ids = self.request.evidence.labelled_trials(tasks[:MAX_TRY_TASKS])
        if isinstance(ids, str):
            return ids
        problem = self.scratch.problem()
        if problem:
            return f"nothing to try: {problem}"
        ids = ids[:left]
        self.tally.tries += len(ids)
        result, result_dir = self.request.try_agent(self.scratch.root, ids)
        e = self.request.evidence
        parent = {r.task_id: r for r in e.analysis.simulations if r.trial == 0}
        lines, first_failure = [], ""
        for sim in sorted(result.simulations, key=lambda r: e.labels[r.task_id]):
            before = parent.get(sim.task_id)
            was = "n/a" if before is None or before.reward is None else f"{before.reward:.2f}"
            now = "not measured" if sim.outcome == "infra_error" else f"{sim.reward or 0.0:.2f}"
            lines.append(
                f"{e.labels[sim.task_id]}: parent {was} -> yours {now}, ended by {sim.termination_reason} after {sim.steps} messages"
            )
            if sim.outcome != "infra_error" and (sim.reward or 0.0) < 1.0:  # the short form of what went wrong
                failure = describe(e.labels[sim.task_id], sim, load_messages(result_dir, sim))
                lines.append(f"  failed: {failure.signature}")
                first_failure = first_failure or f"{e.labels[sim.task_id]}: {failure.signature}"
                lines.extend(f"  | {line[:160]}" for line in failure.transcript[-TRY_LINES:])
        self.tally.tried.append({"tasks": [e.labels[t] for t in ids], "rewards": [s.reward for s in result.simulations]})
        # every try broken by the edit: the smoke test would fail the candidate the same way, so submit says so
        broke = bool(result.simulations) and all(sim.outcome == "failed" for sim in result.simulations)
        self.broken = (self.scratch.edits_made, first_failure) if broke else None
        return "\n".join(lines) + f"\n({self.budget.tries - self.tally.tries} try simulation(s) left)"

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
            return self.prompts.short("patch_not_applied", why=refused[0])
        self.tally.count("patch_in_text")
        answer = self.submit(proposal.title, proposal.rationale)
        return "" if answer == "submitted" else self.prompts.short("patch_refused", why=answer)

    def refusal(self) -> tuple[str, bool]:
        """Why submit would refuse the scratch copy as it stands ("" if it would take it), and whether that is because an
        earlier candidate had the same agent/: what submit says, and what the next step is worked out from."""
        problem = self.scratch.problem()
        if problem:
            return problem, False
        if self.broken and self.broken[0] == self.scratch.edits_made:
            return (
                f"your edited agent broke every task try_agent ran ({self.broken[1]}), and the candidate's smoke test would fail it "
                "the same way; change the edit, then try_agent again"
            ), False
        same = same_as_earlier(self.request.evidence.earlier, agent_files(self.scratch.root))
        if same is not None:  # the loop would refuse it unmeasured, and the proposal would be spent
            return f"your edited agent/ is the same as {same.verdict()}. Make a different change", True
        return "", False

    def submit(self, title: str, rationale: str) -> str:
        why, repeat = self.refusal()
        if repeat:  # undone, so that the next edit applies to the lines the model read (it went on editing the gone ones)
            self.scratch.reset()
            return f"not submitted: {why}; your edits are undone, agent/ is the parent's again"
        if why:
            return f"not submitted: {why}"
        if not title.strip():
            return "not submitted: give a one-line title"
        self.submitted = Proposal(title=title.strip().splitlines()[0][:200], rationale=rationale.strip()[:4000], edits=self.scratch.edits())
        return "submitted"

    def layer_step(self) -> str:
        """The experiment of switching off the layer that makes every change in the failures, while it is untried."""
        switch = self.request.evidence.layer_to_switch_off()
        return self.prompts.short("layer", layer=switch) if switch and not self.tally.used.get("set_layer") else ""


def written_call(text: str):
    """The first tool call written in a reply's text instead of made, as a tool call; None if there is none.
    Small models write `{"name": ..., "arguments": {...}}` with raw line breaks inside its strings (not JSON,
    so the serving path's parser misses it), a tag `<function name="x" arguments='{...}'/>`, or Python:
    `list_failures()`, `read_file(path="a")`. Parsed as data (json, or ast with literal values only):
    nothing is evaluated."""
    import ast
    import re

    names = {name: list(tool.get("arguments", {})) for name, tool in TOOLS.items()}
    decoder = json.JSONDecoder(strict=False)  # strict=False: control characters inside strings
    # <function name="x" arguments='{..}'/>, the JSON quoted or bare
    tagged = re.search(r"""name\s*=\s*["'](\w+)["'][^>]*?arguments\s*=\s*['"]?(?=\{)""", text, re.S)
    if tagged and tagged.group(1) in names:
        try:
            args, _ = decoder.raw_decode(text, tagged.end())
        except ValueError:
            args = None
        if isinstance(args, dict):
            return SimpleNamespace(
                id=f"written_{tagged.start()}", function=SimpleNamespace(name=tagged.group(1), arguments=json.dumps(args))
            )
    for match in re.finditer(r"\{", text):
        try:
            found, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("name") in names and isinstance(found.get("arguments", {}), dict):
            function = SimpleNamespace(name=found["name"], arguments=json.dumps(found.get("arguments", {})))
            return SimpleNamespace(id=f"written_{match.start()}", function=function)
    for match in re.finditer(r"\b(" + "|".join(names) + r")\(", text):
        line = text[match.start() :].split("\n", 1)[0]
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
