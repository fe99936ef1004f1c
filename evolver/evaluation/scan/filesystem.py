"""The filesystem rule: files only under agent/, through paths built from HERE or __file__, never climbing
above agent/, and no change to the file system's shape."""

from __future__ import annotations

import ast
import re

from evolver.evaluation.scan.syntax import mentions, name_chain

# Path methods that leave agent/ or change the file system's shape.
FORBIDDEN_METHODS = set("home cwd symlink_to hardlink_to unlink rmdir rename chmod lchmod".split())

# Calls whose path argument must be built from HERE or __file__.
PATH_TAKERS = set(
    "open io.open os.open codecs.open pathlib.Path pathlib.PosixPath os.listdir os.scandir os.walk glob.glob glob.iglob".split()
)
PATH_KEYWORDS = ("file", "path", "pathname", "top")
ANCHORS = ("HERE", "__file__")

PATH_PATTERNS = [
    # the whole literal: "/".join(...) and a prompt starting "/no_think\n..." are no paths
    (re.compile(r"^(/\S+|~([A-Za-z_/]\S*)?)\Z"), "an absolute or home path"),
    (re.compile(r"(^|/)\.\.(/|$)"), "a '..' path component"),
    (re.compile(r"/proc\b|\.git\b|\bruns/|site-packages|tasks\.json|\.env\b"), "a path outside agent/"),
]


def _climb_target(node: ast.AST) -> ast.AST | None:
    """What .parent or os.path.dirname(...) climbs from, or None if node is no climb."""
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        return node.value
    if isinstance(node, ast.Call) and (name_chain(node.func) or [""])[-1] == "dirname" and node.args:
        return node.args[0]
    return None


def leaves_agent(node: ast.AST) -> bool:
    """A climb above agent/: from HERE (agent/ already), or a second climb from __file__."""
    inner = _climb_target(node)
    if inner is None:
        return False
    if mentions(inner, ("HERE",)):
        return True
    return any(_climb_target(n) is not None and mentions(_climb_target(n), ("__file__",)) for n in ast.walk(inner))
