"""Names an edit leaves dangling: still used in a Python file, no longer defined in it.

A small model removes a helper, a method or the line that sets a local and leaves their uses; the
candidate then fails its smoke test with NameError or AttributeError and the proposal is lost.
Read statically (symtable for names, the tree for `self.` attributes), nothing is run. Only names
the file defined before the edit count, so a name the file never defined (tau2's, a base class's)
is never blamed on the edit.
"""

from __future__ import annotations

import ast
import builtins
import symtable

from evolver.evaluation.scan import parse_python, symbol_table

BUILTINS = frozenset(dir(builtins))


def _unbound_names(text: str) -> set[str]:
    """Names some scope reads that neither it, an enclosing scope, the module nor builtins bind."""
    module = symbol_table(text, "<edit>")
    bound = {s.get_name() for s in module.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    unbound: set[str] = set()

    def visit(scope: symtable.SymbolTable) -> None:
        for sym in scope.get_symbols():
            name = sym.get_name()
            reads_global = sym.is_global() or (scope is module and not (sym.is_assigned() or sym.is_imported()))
            if sym.is_referenced() and reads_global and name not in bound and name not in BUILTINS:
                unbound.add(name)
        for child in scope.get_children():
            visit(child)

    visit(module)
    return unbound


def _self_attributes(tree: ast.AST) -> tuple[set[str], dict[str, int]]:
    """(attributes the file's classes define, {attribute read through `self`: its first line})."""
    defined: set[str] = set()
    read: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    defined.add(item.name)
                targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
                defined.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            else:
                read.setdefault(node.attr, node.lineno)
    return defined, read


def _first_read(tree: ast.AST, name: str) -> int:
    return min((n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)), default=0)


def dangling(before: str, after: str) -> list[tuple[str, int]]:
    """[(name as the code reads it, its first line in ``after``)] for each name ``before`` defined that
    ``after`` still reads and no longer defines. Both texts must parse; a star import reads nothing."""
    try:
        old_tree, new_tree = parse_python(before), parse_python(after)
        if any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in ast.walk(new_tree)):
            return []
        lost = sorted(_unbound_names(after) - _unbound_names(before))
    except (SyntaxError, ValueError, RecursionError):
        return []
    found = [(name, _first_read(new_tree, name)) for name in lost]
    old_defined, _ = _self_attributes(old_tree)
    new_defined, new_read = _self_attributes(new_tree)
    found += [(f"self.{attr}", line) for attr, line in sorted(new_read.items()) if attr in old_defined - new_defined]
    return found
