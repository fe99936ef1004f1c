"""A static scan of a candidate's agent/ files: cheap refusals, each with a reason.

Defence in depth before any simulation: the OS sandbox is the real boundary.
A patch comes from an LLM and is hostile input, so this flags what a harness
never needs (processes, network, native code, environment variables, files
outside agent/, interpreter tampering, its own model settings, tau2's or
evolver's internals) and task data copied into the harness. It reads source
only; nothing it scans is imported or run.

What is accepted, so a refusal can be explained:
- tau2: only tau2.agent.*, tau2.data_model.message and tau2.utils.llm_utils
  (what the template uses); evolver: only evolver.toolcalls.
- files: open(), Path() and directory listings only with a path built from
  HERE or __file__ (agent/), never climbing above agent/.
- the model: generate(model=self.llm, ..., **self.llm_args) exactly as tau2
  passes them in (or `model=self.llm or FALLBACK`, auto-harness's form: evolver
  always sets self.llm, so the fallback never runs); no sampling keyword of the
  agent's own.
- the environment: only AGENT_MODEL and AGENT_REASONING_EFFORT, each read by its
  name written out (os.environ.get, os.getenv, os.environ[...]): the names the
  agent process is given (evolver.data.AGENT_ENV). The model the trusted side
  calls stays the configured one whatever the agent does with them.
"""

from __future__ import annotations

import ast
import io
import os
import re
import threading
import tokenize
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator

from evolver.data import AGENT_ENV

RULES: dict[str, str] = {
    "tau2-internals": "candidate code may use only tau2.agent, tau2.data_model.message and tau2.utils.llm_utils",
    "evolver-internals": "candidate code may use only evolver.toolcalls from evolver",
    "process": "candidate code may not start processes or send signals",
    "network": "candidate code may not open network connections",
    "native-code": "candidate code may not load native code or map memory",
    "environment": f"candidate code may not read environment variables (keys live there) but {' and '.join(AGENT_ENV)}, by name",
    "filesystem": "candidate code may touch only files under agent/, through paths built from HERE or __file__",
    "interpreter": "candidate code may not tamper with the interpreter, run code from strings or inspect frames",
    "model-settings": "the model and its sampling settings come from evolver's configuration, not from the agent",
    "task-data": "ids and values from tasks or the domain database may not be copied into the harness",
    "unreadable": "a file that is not UTF-8 text or not parseable Python cannot be checked",
}

SCANNED_SUFFIXES = (".py", ".md", ".toml", ".txt", ".json")
BASELINE = "agent/templates"  # the pristine template: never edited by a run, never a candidate's code


def in_baseline(rel: str) -> bool:
    """Whether a path from the checkout's root lies in agent/templates/: the one rule every part applies."""
    return rel == BASELINE or rel.startswith(BASELINE + "/")


@dataclass(frozen=True)
class Finding:
    rule: str  # a key of RULES
    path: str  # e.g. "agent/agent.py"
    line: int  # 1-based
    detail: str  # what was found, e.g. "import subprocess"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.detail} ({RULES[self.rule]})"


# ---- what is forbidden -----------------------------------------------------------

# Dotted names (a module, or a module's attribute) -> rule; a name matches when it
# or one of its prefixes is listed.
FORBIDDEN: dict[str, str] = {
    name: rule
    for rule, names in {
        "process": "subprocess multiprocessing pty signal _posixsubprocess posix nt concurrent.futures.process "
                   "concurrent.futures.ProcessPoolExecutor os.system os.popen os.fork os.forkpty os.kill "
                   "os.killpg os.setsid os._exit os.abort",
        "network": "socket _socket ssl http urllib urllib3 requests httpx aiohttp websockets websocket ftplib "
                   "smtplib poplib imaplib nntplib telnetlib xmlrpc socketserver asyncio webbrowser",
        "native-code": "ctypes _ctypes cffi mmap",
        "environment": "os.environ os.environb os.getenv os.getenvb os.putenv os.unsetenv dotenv",
        "filesystem": "shutil os.chdir os.fchdir os.remove os.unlink os.rename os.renames os.replace os.rmdir "
                      "os.removedirs os.makedirs os.mkdir os.symlink os.link os.chmod os.chown os.lchown "
                      "os.truncate os.getcwd os.getcwdb os.path.expanduser pathlib.Path.home pathlib.Path.cwd",
        "interpreter": "importlib builtins gc inspect pickle _pickle marshal shelve dill copyreg atexit runpy code "
                       "codeop pkgutil zipimport imp sys.modules sys.path sys.meta_path sys.path_hooks "
                       "sys.path_importer_cache sys.settrace sys.setprofile sys._getframe sys.addaudithook "
                       "threading.settrace threading.setprofile types.CodeType types.FunctionType",
        "model-settings": "litellm openai anthropic",
    }.items()
    for name in names.split()
}
FORBIDDEN_PATTERNS = [(re.compile(r"os\.(exec|spawn|posix_spawn)\w*"), "process")]

# Packages where only a few modules are allowed: root -> (rule, allowed modules).
ALLOWLISTS = {
    "tau2": ("tau2-internals", ("tau2.agent", "tau2.data_model.message", "tau2.utils.llm_utils")),
    "evolver": ("evolver-internals", ("evolver.toolcalls",)),
}

# Builtin names that run code, reach the builtins or open the debugger.
FORBIDDEN_NAMES = {name: "interpreter" for name in "exec eval compile __import__ __builtins__ globals breakpoint".split()}
FORBIDDEN_NAMES["environ"] = "environment"

# Attributes refused on any object: frames, code objects, the class graph, the environment.
FORBIDDEN_ATTRS = {name: "interpreter" for name in (
    "__subclasses__ __globals__ __code__ __closure__ __builtins__ __bases__ __mro__ __loader__ __spec__ "
    "__import__ f_back f_globals f_locals f_code f_builtins tb_frame gi_frame cr_frame ag_frame"
).split()}
FORBIDDEN_ATTRS.update(environ="environment", parents="filesystem")
# Path methods that leave agent/ or change the file system's shape.
FORBIDDEN_METHODS = set("home cwd symlink_to hardlink_to unlink rmdir rename chmod lchmod".split())

# Calls whose path argument must be built from HERE or __file__.
PATH_TAKERS = set("open io.open os.open codecs.open pathlib.Path pathlib.PosixPath "
                  "os.listdir os.scandir os.walk glob.glob glob.iglob".split())
PATH_KEYWORDS = ("file", "path", "pathname", "top")
ANCHORS = ("HERE", "__file__")

MODEL_KEYWORDS = set("api_base base_url api_key temperature top_p top_k seed custom_llm_provider".split())
LLM_ATTRS = ("llm", "llm_args")
ENV_READERS = ("os.environ.get", "os.getenv")  # with one of AGENT_ENV's names written out: allowed
DICT_MUTATORS = set("update pop popitem setdefault clear __setitem__ __delitem__".split())
REFLECTIVE = ("getattr", "setattr", "delattr")
REFLECTED_MODULES = ("os", "sys", "posix", "io", "builtins", "importlib", "pathlib", "shutil")

PATH_PATTERNS = [
    # the whole literal: "/".join(...) and a prompt starting "/no_think\n..." are no paths
    (re.compile(r"^(/\S+|~([A-Za-z_/]\S*)?)\Z"), "an absolute or home path"),
    (re.compile(r"(^|/)\.\.(/|$)"), "a '..' path component"),
    (re.compile(r"/proc\b|\.git\b|\bruns/|site-packages|tasks\.json|\.env\b"), "a path outside agent/"),
]
TAU2_IN_TEXT = re.compile(r"\btau2(?:[./]\w+)+")

TOKEN = re.compile(r"[A-Za-z0-9_#.@-]+")


# ---- public API ------------------------------------------------------------------


def scan_text(rel_path: str, text: str, identifiers: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings for one file's text, sorted by line; Python is parsed, other text is tokenized."""
    if rel_path.endswith(".py"):
        found = _scan_python(text, identifiers)
    else:
        found = [(n, "task-data", d) for n, line in enumerate(text.splitlines(), 1) for _, d in _data_hits(line, identifiers)]
    return sorted({Finding(rule, rel_path, line, detail) for line, rule, detail in found}, key=_order)


def scan_tree(root: Path, identifiers: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings for every scanned file under root/agent, except agent/templates/ (the pristine baseline)."""
    found = []
    for path in _candidate_files(root / "agent"):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found.append(Finding("filesystem", rel, 1, f"symlink to {_short(os.readlink(path))}"))
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            found.append(Finding("unreadable", rel, 1, type(exc).__name__))
            continue
        found += scan_text(rel, text, identifiers)
    return sorted(found, key=_order)


def task_data_identifiers(tasks: list[dict], db: dict | None, exclude: Iterable[str] = ()) -> frozenset[str]:
    """What would be a leak if found in the harness: task ids, and what looks like a record identifier
    among the tasks' evaluation criteria and user scenarios and the domain database (keys and values)."""
    found = {str(t["id"]) for t in tasks if "id" in t and not _generic_number(str(t["id"]))}
    for task in tasks:
        found.update(_identifiers_in([task.get("evaluation_criteria"), task.get("user_scenario")]))
    found.update(_identifiers_in(db))
    return frozenset(found - set(exclude))


# ---- task data -------------------------------------------------------------------


def _generic_number(text: str) -> bool:
    """A short number ("7", "113") is in every program: as a task id it would block harmless constants."""
    return text.isdigit() and len(text) < 5


def _looks_like_identifier(token: str) -> bool:
    """user_1, task_12, #W2378156, mia_garcia_4516; 555-123-4567, 19122; not HATHAT, not 2024."""
    digits = sum(c.isdigit() for c in token)
    letters = any(c.isalpha() for c in token)
    if letters:
        return digits > 0 and len(token) >= 4
    return digits >= 5 and set(token) <= set("0123456789-")


def _tokens(text: str) -> Iterator[tuple[int, str]]:
    """(offset, token), trailing sentence punctuation dropped: "user_1." is user_1."""
    for m in TOKEN.finditer(text):
        token = m.group().strip(".-")
        if token:
            yield m.start() + m.group().index(token), token


def _identifiers_in(data: object) -> set[str]:
    """Identifier-like tokens of every string, key and integer in nested data (iterative: the db is large)."""
    found, stack = set(), [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, (list, tuple)):
            stack += item
        elif isinstance(item, str):
            for _, token in _tokens(item):
                if _looks_like_identifier(token):
                    found.add(token)
                    if token.startswith("#"):
                        found.add(token[1:])  # "#W2378156" is also written "W2378156"
        elif isinstance(item, int) and not isinstance(item, bool) and len(str(abs(item))) >= 5:
            found.add(str(item))
    return found


@lru_cache(maxsize=8)
def _untokenizable(identifiers: frozenset[str]) -> tuple[str, ...]:
    """Task ids that are not one token (telecom's "[mobile_data_issue]...") are searched as substrings."""
    return tuple(i for i in identifiers if not TOKEN.fullmatch(i) or i != i.strip(".-"))


def _data_hits(text: str, identifiers: frozenset[str]) -> Iterator[tuple[int, str]]:
    """(offset, detail) for each identifier in text; the offset finds the line in a multi-line literal."""
    if not identifiers:
        return
    hits = [(pos, token) for pos, token in _tokens(text) if token in identifiers]
    hits += [(text.find(i), i) for i in _untokenizable(identifiers) if i in text]
    shown = _short(text.strip())
    for pos, hit in hits:
        yield pos, repr(hit) if shown == repr(hit) else f"{hit!r} in {shown}"


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


# ---- Python ----------------------------------------------------------------------

# CPython 3.11's ast.parse is not safe in two threads at once (its recursion-depth check can raise
# "SystemError: AST constructor recursion depth mismatch", gh-106905): the candidates of an iteration
# are proposed, checked and scanned in threads, so every parse of candidate code goes through one lock.
_PARSING = threading.Lock()


def parse_python(text: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """ast.parse, one thread at a time (see _PARSING)."""
    with _PARSING:
        return ast.parse(text, filename=filename, mode=mode)



def _scan_python(text: str, identifiers: frozenset[str]) -> list[tuple[int, str, str]]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like: the code is refused or not, never run
            tree = parse_python(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return [(getattr(exc, "lineno", None) or 1, "unreadable", f"does not parse: {type(exc).__name__}")]
    visitor = _Visitor(identifiers, _aliases(tree))
    try:
        visitor.visit(tree)
    except RecursionError:
        return [(1, "unreadable", "nested too deeply to check")]
    return visitor.found + _comment_hits(text, identifiers)


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (import os.path as p: p -> os.path)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _comment_hits(text: str, identifiers: frozenset[str]) -> list[tuple[int, str, str]]:
    """Comments count too: code can read its own source."""
    if not identifiers:
        return []  # tokenizing for nothing to look for
    try:
        comments = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return []  # ast accepted it, so this is a tokenizer corner; the code itself was scanned
    return [(t.start[0], "task-data", d) for t in comments for _, d in _data_hits(t.string, identifiers)]


def _refusal(dotted: str) -> tuple[str, str] | None:
    """(rule, the shortest refused prefix) for a dotted module or attribute name, or None if allowed."""
    parts = dotted.split(".")
    for prefix in (".".join(parts[:n]) for n in range(1, len(parts) + 1)):
        if rule := _refused(prefix):
            return rule, prefix
    return None


def _refused(name: str) -> str | None:
    root = name.split(".")[0]
    if root in ALLOWLISTS:
        rule, allowed = ALLOWLISTS[root]
        ok = name == root or any(name == a or name.startswith(a + ".") or a.startswith(name + ".") for a in allowed)
        return None if ok else rule
    return FORBIDDEN.get(name) or next((rule for pattern, rule in FORBIDDEN_PATTERNS if pattern.fullmatch(name)), None)


def _chain(node: ast.AST) -> list[str] | None:
    """a.b.c as ["a", "b", "c"]; None when the chain does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _mentions(node: ast.AST, names: tuple[str, ...]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _climb_target(node: ast.AST) -> ast.AST | None:
    """What .parent or os.path.dirname(...) climbs from, or None if node is no climb."""
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        return node.value
    if isinstance(node, ast.Call) and (_chain(node.func) or [""])[-1] == "dirname" and node.args:
        return node.args[0]
    return None


def _leaves_agent(node: ast.AST) -> bool:
    """A climb above agent/: from HERE (agent/ already), or a second climb from __file__."""
    inner = _climb_target(node)
    if inner is None:
        return False
    if _mentions(inner, ("HERE",)):
        return True
    return any(_climb_target(n) is not None and _mentions(_climb_target(n), ("__file__",)) for n in ast.walk(inner))


def _is_llm_args(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "llm_args") or (isinstance(node, ast.Name) and node.id == "llm_args")


def _is_self_llm(node: ast.AST) -> bool:
    return _chain(node) == ["self", "llm"]


def _is_model_from_tau2(node: ast.AST) -> bool:
    """model=self.llm, or self.llm or FALLBACK (auto-harness's form: self.llm is always set, the fallback never runs)."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return _is_self_llm(node.values[0])
    return _is_self_llm(node)


def _agent_env_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in AGENT_ENV


class _Visitor(ast.NodeVisitor):
    """Collects (line, rule, detail) for every refused construct."""

    def __init__(self, identifiers: frozenset[str], aliases: dict[str, str]):
        self.identifiers, self.aliases = identifiers, aliases
        self.found: list[tuple[int, str, str]] = []
        self.env_reads: set[int] = set()  # ids of the os.environ / os.getenv nodes of an allowed read

    def add(self, line: int, rule: str, detail: str) -> None:
        self.found.append((line, rule, detail))

    def add_refusal(self, line: int, dotted: str, detail: str) -> None:
        if found := _refusal(dotted):
            self.add(line, found[0], detail)

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name an expression stands for, through imports (Path -> pathlib.Path)."""
        chain = _chain(node)
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
            elif rule := _star_rule(node.module):
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
        if _leaves_agent(node):
            self.add(node.lineno, "filesystem", ".parent above agent/")
        self.generic_visit(node)

    def refused_name(self, node: ast.AST) -> tuple[str, str] | None:
        """Refusal of an attribute chain that starts at an import (a local variable may be called `code`)."""
        chain = _chain(node)
        return _refusal(self.resolve(node)) if chain and chain[0] in self.aliases else None

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load) and self.resolve(node.value) == "os.environ" and _agent_env_name(node.slice):
            self.allow_env_read(node.value)
        if isinstance(node.ctx, (ast.Store, ast.Del)) and _is_llm_args(node.value):
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
        if name in ENV_READERS and node.args and _agent_env_name(node.args[0]) and not any(isinstance(a, ast.Starred) for a in node.args):
            self.allow_env_read(node.func)
        if name in PATH_TAKERS:
            self.check_path_argument(node, name)
        if name in REFLECTIVE:
            self.check_reflection(node, name)
        if _leaves_agent(node):
            self.add(node.lineno, "filesystem", "os.path.dirname above agent/")
        if isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN_METHODS and not self.refused_name(node.func):
            self.add(node.lineno, "filesystem", f".{node.func.attr}()")
        if isinstance(node.func, ast.Attribute) and node.func.attr in DICT_MUTATORS and _is_llm_args(node.func.value):
            self.add(node.lineno, "model-settings", f"llm_args.{node.func.attr}()")
        for kw in node.keywords:
            if kw.arg in MODEL_KEYWORDS or (kw.arg == "model" and not _is_model_from_tau2(kw.value)):
                self.add(kw.value.lineno, "model-settings", f"{kw.arg}=")
        self.generic_visit(node)

    def check_path_argument(self, node: ast.Call, name: str) -> None:
        path = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg in PATH_KEYWORDS), None)
        if path is None or not _mentions(path, ANCHORS):
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
                self.add(_line_at(node, text, m.start()), "filesystem", f"{what}: {_short(text)}")
        for m in TAU2_IN_TEXT.finditer(text):
            self.add_refusal(_line_at(node, text, m.start()), m.group().replace("/", "."), _short(text))
        if text in FORBIDDEN_ATTRS:
            self.add(node.lineno, FORBIDDEN_ATTRS[text], repr(text))  # getattr(x, "__globals__")
        for pos, detail in _data_hits(text, self.identifiers):
            self.add(_line_at(node, text, pos), "task-data", detail)


def _star_rule(module: str) -> str | None:
    """A star import hides which names it brings in: refused if the module has any refused member."""
    if found := _refusal(module):
        return found[0]
    return next((rule for name, rule in FORBIDDEN.items() if name.startswith(module + ".")), None)


def _line_at(node: ast.AST, text: str, pos: int) -> int:
    """The source line of text[pos] in a literal that may span lines."""
    return min(node.lineno + text.count("\n", 0, pos), node.end_lineno or node.lineno)


# ---- files -----------------------------------------------------------------------


def _candidate_files(agent: Path) -> Iterator[Path]:
    """Scanned files under agent/, and every symlink (refused, never followed)."""
    if agent.is_symlink():
        yield agent
        return
    for folder, dirs, files in os.walk(agent):
        here = Path(folder)
        links = [here / d for d in dirs if (here / d).is_symlink()]
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not in_baseline((here / d).relative_to(agent.parent).as_posix()))
        yield from links
        yield from (here / f for f in sorted(files) if (here / f).is_symlink() or PurePosixPath(f).suffix in SCANNED_SUFFIXES)


def _order(f: Finding) -> tuple:
    return (f.path, f.line, f.rule, f.detail)
