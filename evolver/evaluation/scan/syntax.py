"""Reading a parsed Python file: the dotted names its expressions stand for, through its imports, and the
line of a position in a literal."""

from __future__ import annotations

import ast


def aliases(tree: ast.AST) -> dict[str, str]:
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


def name_chain(node: ast.AST) -> list[str] | None:
    """a.b.c as ["a", "b", "c"]; None when the chain does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def mentions(node: ast.AST, names: tuple[str, ...]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def line_at(node: ast.AST, text: str, pos: int) -> int:
    """The source line of text[pos] in a literal that may span lines."""
    return min(node.lineno + text.count("\n", 0, pos), node.end_lineno or node.lineno)
