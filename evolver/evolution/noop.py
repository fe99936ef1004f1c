"""Does a candidate change anything the agent does? Refuse it before it costs a simulation if not.

A layer that is off does nothing (Harness.md), so a patch whose edits all lie
inside layers left off in the candidate's agent/harness.toml cannot change a
single simulation: the embedded meta model was seen pasting a Harness.md
example into the H2 layer while H2 was off. (A tree identical to an earlier
candidate's is caught by git, in the loop.)
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from typing import Optional

from evolver.evaluation.scan import parse_python

# The template's names per layer (Harness.md, "The four layers"); a name not listed here
# (the prompt, the state, generate_next_message, helpers of several layers) counts as always on.
LAYER_NAMES = {
    "h2_action_realization": {"realize_action", "calls_from_text", "repair_call", "known_tool_name", "squash", "fit_value",
                              "convert", "charge_attempt", "JSON_TYPES"},
    "h3_environment_contract": {"TOOL_CONTRACTS", "tool_schemas"},
    "h4_trajectory_regulation": {"regulation_notes", "should_stop", "is_stop", "call_outcomes", "repeated_call_note",
                                 "error_streak_note", "stagnation_note", "budget_note", "H4_REPEAT_LIMIT", "H4_ERROR_STREAK",
                                 "H4_CALLS_WITHOUT_USER", "H4_STEP_BUDGET", "H4_BUDGET_WARNING", "H4_STOP_MESSAGE"},
    "h5_procedural_skills": {"skill_texts", "retrieve_skills", "tokens", "skill_trigger", "conversation_text", "STOPWORDS",
                             "H5_TOP_K", "H5_MIN_SCORE"},
}
SKILLS = "h5_procedural_skills"


def inert_edit_reason(parent: Path, candidate: Path) -> Optional[str]:
    """Why the candidate's agent/ cannot behave differently from its parent's, or None if it can."""
    try:
        switches = tomllib.loads((candidate / "agent" / "harness.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None  # the candidate itself says how it fails; not this module's business
    if switches != _switches(parent):
        return None  # a layer was switched: that changes behaviour
    touched: set[str] = set()
    for rel in _changed_files(parent, candidate):
        if rel == "agent/agent.py":
            names = _changed_names(parent / rel, candidate / rel)
            if names is None:
                return None
            touched |= {_layer_of(name) for name in names}
        elif rel.startswith("agent/skills/") and rel.endswith(".md"):
            touched.add(SKILLS)
        else:
            return None  # another file: assume it matters
    off = [layer for layer in touched if layer is not None and not switches.get(layer, False)]
    if touched and len(off) == len(touched):
        names = ", ".join(sorted(off))
        return f"its edits lie only in harness layers that are off ({names}): they cannot change a simulation; switch the layer on in agent/harness.toml in the same patch"
    return None


def _switches(root: Path) -> dict:
    try:
        return tomllib.loads((root / "agent" / "harness.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def agent_files(root: Path) -> dict[str, bytes]:
    """agent/'s files a candidate may change, by path (agent/templates/ is the pristine baseline)."""
    base = root / "agent"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in base.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and "templates" not in p.relative_to(base).parts}


def _changed_files(parent: Path, candidate: Path) -> list[str]:
    before, after = agent_files(parent), agent_files(candidate)
    return sorted(rel for rel in before.keys() | after.keys() if before.get(rel) != after.get(rel))


def _layer_of(name: str) -> Optional[str]:
    return next((layer for layer, names in LAYER_NAMES.items() if name in names), None)


def _definitions(path: Path) -> Optional[dict[str, str]]:
    """Top-level names and HarnessAgent's members -> their source, as the parser sees it (comments aside)."""
    try:
        tree = parse_python(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "HarnessAgent":
            out["HarnessAgent"] = ast.dump(ast.ClassDef(name=node.name, bases=node.bases, keywords=node.keywords, body=[], decorator_list=node.decorator_list))
            for member in node.body:
                for name in _names(member):
                    out[name] = ast.dump(member)
        else:
            names = _names(node) or [f"<statement {len(out)}>"]
            for name in names:
                out[name] = out.get(name, "") + ast.dump(node)
    return out


def _names(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [t.id for t in targets if isinstance(t, ast.Name)]
    return []


def _changed_names(before_path: Path, after_path: Path) -> Optional[set[str]]:
    before, after = _definitions(before_path), _definitions(after_path)
    if before is None or after is None:
        return None
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}
