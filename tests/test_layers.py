"""The folders under evolver/ are its layers, and imports only go down.

    shared      evolver/*.py: config, data, errors, events, llm, memo, models, scripted, toolcalls; evolver/ratelimit/
    local       evolver/local/: the embedded model    store  evolver/store/: the run directory and git lineage
                (side by side: neither imports the other)
    evaluation  evolver/evaluation/
    evolution   evolver/evolution/
    cli         evolver/cli/, and evolver/__main__.py (`python -m evolver`, which only calls cli.launch)

The store sits below the evaluation side because the worker and the backends write an
evaluation's folder through it (store.evaldir.EvalDir), as the loop and the command line read
the run through it: one owner of every run-directory name. It imports only the shared layer.

A module may import its own layer and the layers below it, never a layer above or beside
it. Every import counts, the lazy ones inside functions too, and so does a string that is
exactly a module's name (`python -m evolver.x`, an entry handed to the zygote). And no modules
import each other in a circle, lazy imports included (a string is not an import: the zygote's
client starts `python -m evolver.evaluation.zygote`, which imports the client); the one
pattern let through is a package's __init__ importing its own submodules inside a function
(evaluation.backends' make_backend, cli.runreport's write_report): importing a submodule runs
its package first anyway, and the deferred import back does not run at import time.

Parsed with ast, nothing imported: offline, instant.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RANK = {"shared": 0, "local": 1, "store": 1, "evaluation": 2, "evolution": 3, "cli": 4}
# The bottom layer, all of it: a new top-level module is a new shared module, so add it here on purpose. A package
# here (evolver.ratelimit) is shared with every module in it.
SHARED = {
    "evolver",
    "evolver.config",
    "evolver.data",
    "evolver.errors",
    "evolver.events",
    "evolver.llm",
    "evolver.memo",
    "evolver.models",
    "evolver.ratelimit",
    "evolver.scripted",
    "evolver.toolcalls",
    "evolver.kinds",
    "evolver.config_load",
    "evolver.config_requests",
    "evolver.config_tables",
}
ENTRY = "evolver.__main__"


def modules(package: Path) -> dict[str, Path]:
    """Module name -> file, for every .py under ``package`` (a folder named evolver)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def layer(name: str) -> str | None:
    if name == ENTRY:
        return "cli"
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in RANK and parts[1] != "shared":
        return parts[1]
    if len(parts) <= 2 or ".".join(parts[:2]) in SHARED:  # a top-level module, or one in a shared package
        return "shared"
    return None  # a module deeper in a folder that is no layer


def _resolve(target: str, known: dict[str, Path]) -> str | None:
    """The module an import reaches: ``target`` itself, or the nearest package or module above it
    (``evolver.__version__`` is the package ``evolver``); None outside evolver."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int, str]]:
    """(module, line, how) for every evolver module one module imports or names; how: "import"
    (at import time), "lazy" (inside a function) or "named" (a string: a process it starts, an
    entry point; it counts for the layers, not for circles: it is not an import)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int, str]] = []

    def add(target: str | None, node: ast.AST, how: str) -> None:
        module = _resolve(target, known) if target else None
        if module and module != name:
            found.append((module, node.lineno, how))

    def visit(node: ast.AST, lazy: bool) -> None:
        how = "lazy" if lazy else "import"
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node, how)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x, from ..cli import commands
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:  # from evolver.evaluation import worker: the module worker
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base, node, how)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.partition(":")[0]  # "evolver.x:main", an entry point
            if text in known:
                add(text, node, "named")
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def graph(package: Path) -> dict[str, list[tuple[str, int, str]]]:
    known = modules(package)
    return {name: imports(name, path, known) for name, path in known.items()}


def unplaced(edges: dict) -> list[str]:
    """Modules in no layer (a new folder under evolver/), and top-level modules not in SHARED."""
    return sorted(m for m in edges if layer(m) is None or (layer(m) == "shared" and ".".join(m.split(".")[:2]) not in SHARED))


def violations(edges: dict) -> list[str]:
    """Every import of a layer above or beside the importer's, as 'a:line -> b (from -> to)'."""
    out = []
    for src, targets in edges.items():
        for dst, line, _ in targets:
            a, b = layer(src), layer(dst)
            if a is None or b is None or a == b:
                continue
            if RANK[b] >= RANK[a]:
                out.append(f"{src}:{line} -> {dst} ({a} -> {b})")
    return sorted(set(out))


def cycles(edges: dict) -> list[list[str]]:
    """Groups of modules that import each other in a circle (strongly connected components)."""

    def counted(src: str, dst: str, how: str) -> bool:
        # A package's own submodules are named after it: a lazy import of one from its __init__ is let through.
        return how == "import" or (how == "lazy" and not dst.startswith(src + "."))

    succ = {src: sorted({d for d, _, how in targets if counted(src, d, how)}) for src, targets in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(succ):
        if v not in index:
            connect(v)
    return sorted(found)


# ---- the real package ------------------------------------------------------------


def test_every_module_has_a_layer():
    edges = graph(ROOT / "evolver")
    assert len(edges) > 40  # it parsed the package, not an empty folder
    assert unplaced(edges) == []
    assert {layer(m) for m in edges} == set(RANK)  # every layer has modules


def test_no_layer_imports_one_above_or_beside_it():
    assert violations(graph(ROOT / "evolver")) == []


def test_no_import_circles():
    assert cycles(graph(ROOT / "evolver")) == []


def test_the_candidates_one_evolver_import_is_shared():
    """Candidate agents may import evolver.toolcalls and nothing else of evolver (the static
    scan's rule): it must stay a shared module, importing nothing of evolver."""
    edges = graph(ROOT / "evolver")
    assert layer("evolver.toolcalls") == "shared" and edges["evolver.toolcalls"] == []


# ---- the checker, on a made-up package ---------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "evolver" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "evolver"


def test_checker_finds_what_it_should(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "__main__.py": "from evolver.cli.launch import main\n",  # the entry: allowed
            "config.py": "from evolver.data import X\n\ndef f():\n    from evolver.cli.commands import y\n",  # lazy, upward
            "data.py": "",
            "stray.py": "",  # a top-level module that is not a shared one
            "local/__init__.py": "",
            "local/backend.py": "import evolver.config\nfrom evolver.evaluation import worker\n",  # upward
            "evaluation/__init__.py": "",
            "evaluation/worker.py": "from evolver.store.evaldir import EvalDir\n",  # downward: the store is below
            "evaluation/zygote.py": 'COMMAND = ["-m", "evolver.cli.commands"]\nfrom . import worker\nfrom .zygote_client import CMD\n',  # a string, upward
            "evaluation/zygote_client.py": 'CMD = ["-m", "evolver.evaluation.zygote"]\n',  # starts the zygote: no circle
            "evaluation/backends/__init__.py": "def make():\n    from evolver.evaluation.backends import local\n",
            "evaluation/backends/local.py": "from evolver.evaluation.backends import make\n",  # the let-through pattern
            "store/__init__.py": "",
            "store/runstate.py": "from ..data import X\nfrom evolver.local import backend\n",  # relative, downward; beside
            "store/evaldir.py": "def f():\n    from evolver.evaluation import zygote_client\n",  # lazy, upward
            "evolution/__init__.py": "",
            "evolution/a.py": "def f():\n    from evolver.evolution import b\n",
            "evolution/b.py": "from evolver.evolution.a import f\n",  # a circle with a
            "evolution/c.py": "from ..cli import commands\n",  # relative, upward
            "cli/__init__.py": "",
            "cli/commands.py": "from evolver.evolution import a\n",
            "cli/launch.py": 'ENTRY = "evolver.cli.commands:main"\n',
            "extra/__init__.py": "",  # a folder that is no layer
        },
    )
    edges = graph(package)
    assert unplaced(edges) == ["evolver.extra", "evolver.stray"]
    assert violations(edges) == [
        "evolver.config:4 -> evolver.cli.commands (shared -> cli)",
        "evolver.evaluation.zygote:1 -> evolver.cli.commands (evaluation -> cli)",
        "evolver.evolution.c:1 -> evolver.cli.commands (evolution -> cli)",
        "evolver.local.backend:2 -> evolver.evaluation.worker (local -> evaluation)",
        "evolver.store.evaldir:2 -> evolver.evaluation.zygote_client (store -> evaluation)",
        "evolver.store.runstate:2 -> evolver.local.backend (store -> local)",
    ]
    assert cycles(edges) == [["evolver.evolution.a", "evolver.evolution.b"]]
