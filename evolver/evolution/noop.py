"""Does a candidate change anything the agent does? Refuse it before it costs a simulation if not.

A layer that is off does nothing (Harness.md), so a patch whose edits all lie
inside layers left off in the candidate's agent/harness.toml cannot change a
single simulation, and neither can a patch that only adds comments: both are
what a weak meta-LLM writes when it pastes a Harness.md example or has no fix.
(A tree identical to an earlier candidate's is caught by git, in the loop.)
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Optional

from evolver.evaluation.backends.results import read_switches
from evolver.evaluation.scan import in_baseline, parse_python

# The layers, as harness.toml switches them (Harness.md, "The four layers").
LAYER_NAMES = ("h2_action_realization", "h3_environment_contract", "h4_trajectory_regulation", "h5_procedural_skills")
# What tau2 calls on the agent (and runs at import): the code that is on whatever the switches say.
ENTRY_POINTS = ("generate_next_message", "get_init_state", "is_stop", "stop", "set_seed", "system_prompt", "__init__", "call_llm")
SKILLS = "h5_procedural_skills"
UNCHANGED = "leaves agent/ as it was"  # said of a patch the loop refuses unmeasured, and the one-shot proposer sends back


def inert_edit_reason(parent: Path, candidate: Path) -> Optional[str]:
    """Why the candidate's agent/ cannot behave differently from its parent's, or None if it can."""
    switches = read_switches(candidate)
    if switches is None:
        return None  # the candidate itself says how it fails; not this module's business
    if switches != (read_switches(parent) or {}):
        return None  # a layer was switched: that changes behaviour
    on = {layer for layer in LAYER_NAMES if switches.get(layer, False)}
    needs: list[set[frozenset]] = []  # per changed name or file: the ways it can act, each the layers it needs
    changed = _changed_files(parent, candidate)
    for rel in changed:
        if rel == "agent/agent.py":
            names = _changed_names(parent / rel, candidate / rel)
            layers = [_layers(root / rel) for root in (candidate, parent)]
            if names is None or None in layers:
                return None
            # a removed name acts where the parent had it; a name no entry point reaches cannot act at all
            needs += [layers[0].get(name) or layers[1].get(name) or {frozenset({"unreachable"})} for name in names]
        elif rel.startswith("agent/skills/") and rel.endswith(".md"):
            needs.append({frozenset({SKILLS})})
        else:
            return None  # another file: assume it matters
    if changed and not needs:  # agent.py changed, but not as the parser sees it (a member's docstring is not a member)
        return "its edits change only comments, layout or a docstring, not code: they cannot change a simulation"
    if any(way <= on for ways in needs for way in ways):
        return None
    off = sorted({layer for ways in needs for way in ways for layer in way - on if layer in LAYER_NAMES})
    if not off:
        return "its edits change only code that nothing calls: they cannot change a simulation"
    return (
        f"its edits lie only in harness layers that are off ({', '.join(off)}): they cannot change a simulation; "
        "switch the layer on in agent/harness.toml in the same patch"
    )


def agent_files(root: Path) -> dict[str, bytes]:
    """agent/'s files a candidate may change, by path (agent/templates/ is the pristine baseline)."""
    base = root / "agent"
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in base.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not in_baseline(p.relative_to(root).as_posix())
    }


def agent_digest(files: dict[str, bytes]) -> str:
    """One hash of the files agent_files keeps, from a folder's agent_files or a commit's: equal hashes, the same agent."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        if "__pycache__" not in rel.split("/") and not in_baseline(rel):
            digest.update(f"{len(rel)}:{rel}:{len(files[rel])}:".encode() + files[rel])
    return digest.hexdigest()


def _changed_files(parent: Path, candidate: Path) -> list[str]:
    before, after = agent_files(parent), agent_files(candidate)
    return sorted(rel for rel in before.keys() | after.keys() if before.get(rel) != after.get(rel))


def _layers(path: Path) -> Optional[dict[str, set[frozenset]]]:
    """Each top-level name and HarnessAgent member of an agent.py -> the switches it needs: one set of layers
    per way to it from the entry points, each the layers whose switch checks (`if self.switches.h2_...:`,
    `self.switches.h4_... and ...`, `if not self.switches.h3_...: return`) guard that way. Read from the code
    itself, so a helper keeps its layer when a patch renames it; an empty set: always on."""
    try:
        tree = parse_python(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    nodes: dict[str, ast.AST] = {}
    todo: list[tuple[str, frozenset]] = []  # (name, the layers the way to it needs)
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) and node.name == "HarnessAgent" else [node]
        for member in members:
            names = _names(member)
            nodes.update(dict.fromkeys(names, member))
            defines = isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            runs = (
                not names
                or (member is not node and (names[0] in ENTRY_POINTS or not defines))
                or (member is node and not defines and not _pure(getattr(member, "value", None)))
            )  # runs at import
            if runs:
                todo += [(ref, frozenset({guard}) - {None}) for ref, guard in _references(member)]
                todo += [(name, frozenset()) for name in names]
    todo += [(name, frozenset()) for name in ENTRY_POINTS if name in nodes]
    reached: dict[str, set[frozenset]] = {}
    while todo:
        name, needs = todo.pop()
        ways = reached.setdefault(name, set()) if name in nodes else None
        if ways is None or any(way <= needs for way in ways):  # an easier way to it is known already
            continue
        ways -= {way for way in ways if needs <= way}
        ways.add(needs)
        todo += [(ref, needs | ({guard} - {None})) for ref, guard in _references(nodes[name])]
    return reached


PURE_CALLS = ("set", "frozenset", "dict", "list", "tuple", "str", "int", "float")


def _pure(value: Optional[ast.AST]) -> bool:
    """Whether a module-level value is data only (literals, containers and arithmetic of them, string
    methods on literals): its statement does nothing at import but bind a name."""
    if value is None:
        return False
    if isinstance(value, ast.Constant):
        return True
    if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
        return all(_pure(v) for v in value.elts)
    if isinstance(value, ast.Dict):
        return all(_pure(v) for v in [*value.keys, *value.values] if v is not None)
    if isinstance(value, ast.BinOp):
        return _pure(value.left) and _pure(value.right)
    if isinstance(value, ast.UnaryOp):
        return _pure(value.operand)
    if isinstance(value, ast.Call) and not value.keywords and all(_pure(a) for a in value.args):
        func = value.func
        return (isinstance(func, ast.Name) and func.id in PURE_CALLS) or (isinstance(func, ast.Attribute) and _pure(func.value))
    return False


def _references(node: ast.AST, guard: Optional[str] = None) -> list[tuple[str, Optional[str]]]:
    """The names a definition uses (plain names and self.attributes), each with the layer whose switch check
    guards the use (None: unguarded)."""
    found: list[tuple[str, Optional[str]]] = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return _within(node.args, guard) + _body(node.body, guard)
    if isinstance(node, ast.If) and (layer := _switch(node.test)):
        return _references(node.test, guard) + _body(node.body, layer) + _body(node.orelse, guard)
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And) and (layer := _switch(node.values[0])):
        return [r for value in node.values[1:] for r in _references(value, layer)]
    if isinstance(node, ast.Name):
        found.append((node.id, guard))
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        found.append((node.attr, guard))
    for child in ast.iter_child_nodes(node):
        found += _references(child, guard)
    return found


def _within(node: ast.AST, guard: Optional[str]) -> list[tuple[str, Optional[str]]]:
    return [r for child in ast.iter_child_nodes(node) for r in _references(child, guard)]


def _body(statements: list, guard: Optional[str]) -> list[tuple[str, Optional[str]]]:
    """A block's references; after `if not self.switches.X: return ...`, the rest of the block is X's."""
    found: list[tuple[str, Optional[str]]] = []
    for statement in statements:
        found += _references(statement, guard)
        test = statement.test if isinstance(statement, ast.If) else None
        if (
            isinstance(test, ast.UnaryOp)
            and isinstance(test.op, ast.Not)
            and (layer := _switch(test.operand))
            and statement.body
            and isinstance(statement.body[-1], ast.Return)
            and not statement.orelse
        ):
            guard = layer
    return found


def _switch(test: ast.AST) -> Optional[str]:
    """The layer a test checks the switch of (`self.switches.h2_action_realization`), if it is one."""
    node = test.values[0] if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else test
    if (
        isinstance(node, ast.Attribute)
        and node.attr in LAYER_NAMES
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "switches"
    ):
        return node.attr
    return None


def _definitions(path: Path) -> Optional[dict[str, str]]:
    """Top-level names and HarnessAgent's members -> their source, as the parser sees it (comments aside)."""
    try:
        tree = parse_python(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "HarnessAgent":
            out["HarnessAgent"] = ast.dump(
                ast.ClassDef(name=node.name, bases=node.bases, keywords=node.keywords, body=[], decorator_list=node.decorator_list)
            )
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
