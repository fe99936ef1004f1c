"""The walk over a parsed Python file: every construct checked against the rules of forbidden,
filesystem, model_settings and taskdata."""

from __future__ import annotations

import ast

from evolver.evaluation.scan.filesystem import ANCHORS, FORBIDDEN_METHODS, PATH_KEYWORDS, PATH_PATTERNS, PATH_TAKERS, leaves_agent
from evolver.evaluation.scan.findings import short
from evolver.evaluation.scan.forbidden import (
    ENV_READERS,
    FORBIDDEN_ATTRS,
    FORBIDDEN_NAMES,
    REFLECTED_MODULES,
    REFLECTIVE,
    TAU2_IN_TEXT,
    agent_env_name,
    refusal,
    star_rule,
)
from evolver.evaluation.scan.model_settings import DICT_MUTATORS, LLM_ATTRS, MODEL_KEYWORDS, is_llm_args, is_model_from_tau2
from evolver.evaluation.scan.syntax import line_at, mentions, name_chain
from evolver.evaluation.scan.taskdata import data_hits


class Visitor(ast.NodeVisitor):
    """Collects (line, rule, detail) for every refused construct."""

    def __init__(self, identifiers: frozenset[str], aliases: dict[str, str]):
        self.identifiers, self.aliases = identifiers, aliases
        self.found: list[tuple[int, str, str]] = []
        self.env_reads: set[int] = set()  # ids of the os.environ / os.getenv nodes of an allowed read

    def add(self, line: int, rule: str, detail: str) -> None:
        self.found.append((line, rule, detail))

    def add_refusal(self, line: int, dotted: str, detail: str) -> None:
        if found := refusal(dotted):
            self.add(line, found[0], detail)

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name an expression stands for, through imports (Path -> pathlib.Path)."""
        chain = name_chain(node)
        if chain is None:
            return None
        return ".".join([self.aliases.get(chain[0], chain[0]), *chain[1:]])

    # imports

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.add_refusal(node.lineno, a.name, f"import {a.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return  # relative: another file under agent/, scanned on its own
        for a in node.names:
            detail = f"from {node.module} import {a.name}"
            if a.name != "*":
                self.add_refusal(node.lineno, f"{node.module}.{a.name}", detail)
            elif rule := star_rule(node.module):
                self.add(node.lineno, rule, detail)

    # names and attributes

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES and node.id not in self.aliases:
            self.add(node.lineno, FORBIDDEN_NAMES[node.id], node.id)

    def allow_env_read(self, reader: ast.AST) -> None:
        """os.environ.get / os.getenv / os.environ of a read of one of AGENT_ENV's names: not refused."""
        for n in ast.walk(reader):
            if isinstance(n, ast.Attribute):
                self.env_reads.add(id(n))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if id(node) in self.env_reads:
            self.generic_visit(node)
            return
        if found := self.refused_name(node):
            self.add(node.lineno, *found)
        elif node.attr in FORBIDDEN_ATTRS:
            self.add(node.lineno, FORBIDDEN_ATTRS[node.attr], f".{node.attr}")
        if isinstance(node.ctx, (ast.Store, ast.Del)) and node.attr in LLM_ATTRS:
            self.add(node.lineno, "model-settings", f"assignment to .{node.attr}")
        if leaves_agent(node):
            self.add(node.lineno, "filesystem", ".parent above agent/")
        self.generic_visit(node)

    def refused_name(self, node: ast.AST) -> tuple[str, str] | None:
        """Refusal of an attribute chain that starts at an import (a local variable may be called `code`)."""
        chain = name_chain(node)
        return refusal(self.resolve(node)) if chain and chain[0] in self.aliases else None

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load) and self.resolve(node.value) == "os.environ" and agent_env_name(node.slice):
            self.allow_env_read(node.value)
        if isinstance(node.ctx, (ast.Store, ast.Del)) and is_llm_args(node.value):
            self.add(node.lineno, "model-settings", "assignment into llm_args")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in LLM_ATTRS:
            self.add(node.lineno, "model-settings", f"def {node.name}")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    # calls

    def visit_Call(self, node: ast.Call) -> None:
        name = self.resolve(node.func)
        if name in ENV_READERS and node.args and agent_env_name(node.args[0]) and not any(isinstance(a, ast.Starred) for a in node.args):
            self.allow_env_read(node.func)
        if name in PATH_TAKERS:
            self.check_path_argument(node, name)
        if name in REFLECTIVE:
            self.check_reflection(node, name)
        if leaves_agent(node):
            self.add(node.lineno, "filesystem", "os.path.dirname above agent/")
        if isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN_METHODS and not self.refused_name(node.func):
            self.add(node.lineno, "filesystem", f".{node.func.attr}()")
        if isinstance(node.func, ast.Attribute) and node.func.attr in DICT_MUTATORS and is_llm_args(node.func.value):
            self.add(node.lineno, "model-settings", f"llm_args.{node.func.attr}()")
        for kw in node.keywords:
            if kw.arg in MODEL_KEYWORDS or (kw.arg == "model" and not is_model_from_tau2(kw.value)):
                self.add(kw.value.lineno, "model-settings", f"{kw.arg}=")
        self.generic_visit(node)

    def check_path_argument(self, node: ast.Call, name: str) -> None:
        path = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg in PATH_KEYWORDS), None)
        if path is None or not mentions(path, ANCHORS):
            self.add(node.lineno, "filesystem", f"{name}() of a path not built from HERE or __file__")

    def check_reflection(self, node: ast.Call, name: str) -> None:
        """getattr(os, ...) reaches what `os.` would; setattr(self, "llm", ...) is an assignment."""
        target = self.resolve(node.args[0]) if node.args else None
        if target in REFLECTED_MODULES:
            self.add(node.lineno, "interpreter", f"{name}({target}, ...)")
        attr = node.args[1] if len(node.args) > 1 else None
        if name != "getattr" and isinstance(attr, ast.Constant) and attr.value in LLM_ATTRS:
            self.add(node.lineno, "model-settings", f"{name}(..., {attr.value!r})")

    def visit_Dict(self, node: ast.Dict) -> None:
        for key in node.keys:
            if isinstance(key, ast.Constant) and key.value in MODEL_KEYWORDS:
                self.add(key.lineno, "model-settings", f"{key.value!r} key")
        self.generic_visit(node)

    # literals

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self.check_string(node, node.value)
        elif isinstance(node.value, int) and not isinstance(node.value, bool) and str(node.value) in self.identifiers:
            self.add(node.lineno, "task-data", repr(node.value))

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        """An f-string is checked as one text, "{}" for each field: f"{HERE}/x" does not start with "/"."""
        self.check_string(node, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
        for v in node.values:
            if not isinstance(v, ast.Constant):
                self.visit(v)

    def check_string(self, node: ast.AST, text: str) -> None:
        for pattern, what in PATH_PATTERNS:
            if m := pattern.search(text):
                self.add(line_at(node, text, m.start()), "filesystem", f"{what}: {short(text)}")
        for m in TAU2_IN_TEXT.finditer(text):
            self.add_refusal(line_at(node, text, m.start()), m.group().replace("/", "."), short(text))
        if text in FORBIDDEN_ATTRS:
            self.add(node.lineno, FORBIDDEN_ATTRS[text], repr(text))  # getattr(x, "__globals__")
        for pos, detail in data_hits(text, self.identifiers):
            self.add(line_at(node, text, pos), "task-data", detail)
