"""No module outside evolver/store/ builds a path into the run directory: the store's objects
(store.rundir.RunDir for a run, store.evaldir.EvalDir for one evaluation) own every name in it,
so the on-disk contract (docs/run-directory.md) is written in one place.

A module elsewhere that joins one of the run directory's names into a path fails here:
`out / "sims.jsonl"`, `run.path / "holdout.json"`, `Path(repo, "runs")`, `folder.glob("status-*.json")`,
`f"result-{trials}.json"` in a join, or anything joined onto a run's own `run.path`. A name in a
message or a docstring ("see worker.log") is no path and passes.

Parsed with ast, nothing imported: offline, instant.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORE = "store"
# The names in a run directory and in each evaluation's folder (docs/run-directory.md).
NAMES = {
    "runs",
    "evals",
    "iterations",
    "proposals",
    "worktrees",
    "run.json",
    "state.json",
    "log.jsonl",
    "holdout.json",
    "scan-identifiers.json",
    "lock",
    "report.html",
    "rate_limits.json",
    "request.json",
    "sims.jsonl",
    "trajectories",
    "claims",
    "worker.log",
    "result.json",
}
PREFIXES = ("result-", "status-", "request-")  # result-<T>.json, status-<i>.json, request-<i>.json
JOINS = {"glob", "rglob", "joinpath", "with_name", "Path", "PurePath", "join"}  # calls that make a path of their arguments


def names_a_run_file(node: ast.AST) -> bool:
    """A string (or an f-string's literal parts) with a run directory's name as one of its path components."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        texts = [node.value]
    elif isinstance(node, ast.JoinedStr):
        texts = [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    else:
        return False
    return any(part in NAMES or part.startswith(PREFIXES) for text in texts for part in text.split("/"))


def is_run_path(node: ast.AST) -> bool:
    """`run.path` or `self.run.path`: a run's own folder, into which only the store joins."""
    if not (isinstance(node, ast.Attribute) and node.attr == "path"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "run") or (isinstance(owner, ast.Attribute) and owner.attr == "run")


def path_joins(path: Path) -> list[tuple[int, str]]:
    """(line, source) of every place in a module that joins a run directory's name into a path."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            hit = names_a_run_file(node.left) or names_a_run_file(node.right) or is_run_path(node.left)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            hit = name in JOINS and (
                any(names_a_run_file(a) for a in node.args) or (isinstance(func, ast.Attribute) and is_run_path(func.value))
            )
        else:
            continue
        if hit:
            found.append((node.lineno, ast.get_source_segment(source, node) or ""))
    return sorted(found)


def outside_the_store(package: Path) -> list[str]:
    """'module:line: source' for every run-directory path built by a module outside evolver/store/."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent)
        if rel.parts[1] == STORE:
            continue
        out += [f"{rel}:{line}: {text}" for line, text in path_joins(path)]
    return out


def test_only_the_store_builds_run_directory_paths():
    modules = list((ROOT / "evolver").rglob("*.py"))
    assert len(modules) > 40  # it read the package, not an empty folder
    assert outside_the_store(ROOT / "evolver") == []


def test_the_check_finds_what_it_should(tmp_path):
    package = tmp_path / "evolver"
    files = {
        "store/runstate.py": 'def f(run):\n    return run.path / "state.json"\n',  # the store's own: allowed
        "evaluation/worker.py": (
            "from pathlib import Path\n"
            "def f(out, req, n):\n"
            '    a = out / "sims.jsonl"\n'  # 3
            '    b = Path(req.out_dir) / f"status-{n}.json"\n'  # 4
            '    c = list(out.glob("result-*.json"))\n'  # 5
            '    d = out / "trajectories" / "x.json"\n'  # 6: the inner join
            "    print(f\"see {out / 'worker.log'}\")\n"  # 7: inside a message, still a join
            '    e = f"trajectories/{n}"\n'  # an f-string alone is no join
            '    return out / "agent", "see worker.log", (out / "checkout")\n'  # not run-directory names; a message
        ),
        "cli/history.py": (
            "import os\nfrom pathlib import Path\n"
            "def g(run, repo):\n"
            '    x = Path(repo, "runs")\n'  # 4
            '    y = run.path / "anything"\n'  # 5: a run's folder
            '    z = run.path.glob("evals/*/sims.jsonl")\n'  # 6
            '    w = os.path.join(repo, "runs", "x")\n'  # 7
            '    return run.evaluation("x").path, run.log_file\n'  # through the store: allowed
        ),
        "evolution/loop.py": 'def h(self):\n    return self.run.path / "holdout.json"\n',  # 2
    }
    for rel, text in files.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert [line.split(": ")[0] for line in outside_the_store(package)] == [
        "evolver/cli/history.py:4",
        "evolver/cli/history.py:5",
        "evolver/cli/history.py:6",
        "evolver/cli/history.py:7",
        "evolver/evaluation/worker.py:3",
        "evolver/evaluation/worker.py:4",
        "evolver/evaluation/worker.py:5",
        "evolver/evaluation/worker.py:6",
        "evolver/evaluation/worker.py:7",
        "evolver/evolution/loop.py:2",
    ]
