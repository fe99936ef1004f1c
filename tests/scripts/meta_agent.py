"""A scripted meta-agent for the investigating proposer: it follows a read-the-trace strategy with
the proposer's tools, deterministically, so the plumbing can be tested (and benchmarked) offline.

    list_failures -> read_trajectory (the first failure) -> read_file (where the fix goes)
    -> replace_in_file -> try_agent (the failing task) -> submit

Which fix it makes comes from what it read: the first Fix whose symptom (a regular expression) matches
the failures list or the trajectory; when that edit is refused (its old text is not in the file: two
faults can look alike), the next Fix that matches. Shared by tests/test_proposer.py and benchmarks/planted_faults.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from evolver.scripted import Reply


@dataclass(frozen=True)
class Fix:
    symptom: str  # a regular expression over the failures list and the trajectory read
    path: str
    old: str
    new: str
    title: str
    more: tuple[tuple[str, str], ...] = ()  # further (old, new) replacements in the same file


def _calls(messages: list[dict]) -> list[tuple[str, dict, str]]:
    """(tool, arguments, its result) for every call made so far, in order."""
    results = {m.get("tool_call_id"): str(m.get("content") or "") for m in messages if m.get("role") == "tool"}
    out = []
    for m in messages:
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                args = {}
            out.append((fn.get("name"), args, results.get(call.get("id"), "")))
    return out


def _call(name: str, **args) -> Reply:
    return Reply(tool_calls=[(name, args)])


def investigate(messages: list[dict], fixes: list[Fix]) -> Reply:
    done = _calls(messages)
    seen = "\n".join(result for _, _, result in done)
    last = done[-1] if done else None
    if last is None:
        return _call("list_failures")
    name, args, result = last
    if name == "list_failures":
        first = re.search(r"\b(T\d+) trial (\d+)", result)
        if not first:
            return Reply("Nothing fails: nothing to fix.")
        return _call("read_trajectory", task=first.group(1), trial=int(first.group(2)))
    # Every Fix whose symptom it read is a hypothesis, tried in order: an edit whose old text is not in the
    # file was the wrong one (two faults can look alike: both lose the conversation), so the next is tried.
    hypotheses = [f for f in fixes if re.search(f.symptom, seen)]
    refused = sum(1 for tool, _, answer in done if tool == "replace_in_file" and not answer.startswith("applied"))
    if refused >= len(hypotheses):
        return Reply("I cannot tell what is wrong from this trajectory." if not refused else f"My edit was refused: {result}")
    fix = hypotheses[refused]
    if name == "read_trajectory":
        return _call("read_file", path=fix.path)
    replacements = [(fix.old, fix.new), *fix.more]
    if name == "read_file" or (name == "replace_in_file" and not result.startswith("applied")):
        return _call("replace_in_file", path=fix.path, old=fix.old, new=fix.new)
    if name == "replace_in_file":
        made = sum(1 for tool, _, answer in done if tool == "replace_in_file" and answer.startswith("applied"))
        if made < len(replacements):
            old, new = replacements[made]
            return _call("replace_in_file", path=fix.path, old=old, new=new)
        task = re.search(r"\b(T\d+) trial", seen)
        return _call("try_agent", tasks=[task.group(1)])
    if name == "try_agent":
        return _call("submit", title=fix.title, rationale=f"The trajectory shows {fix.symptom!r}; {fix.title.lower()}.")
    return Reply("Done.")
