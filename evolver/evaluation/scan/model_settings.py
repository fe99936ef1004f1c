"""The model-settings rule: the model and its sampling settings come from evolver's configuration, as tau2
passes them in (model=self.llm, **self.llm_args), never from the agent."""

from __future__ import annotations

import ast

from evolver.evaluation.scan.syntax import name_chain

MODEL_KEYWORDS = set("api_base base_url api_key temperature top_p top_k seed custom_llm_provider".split())
LLM_ATTRS = ("llm", "llm_args")
DICT_MUTATORS = set("update pop popitem setdefault clear __setitem__ __delitem__".split())


def is_llm_args(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "llm_args") or (isinstance(node, ast.Name) and node.id == "llm_args")


def _is_self_llm(node: ast.AST) -> bool:
    return name_chain(node) == ["self", "llm"]


def is_model_from_tau2(node: ast.AST) -> bool:
    """model=self.llm, or self.llm or FALLBACK (auto-harness's form: self.llm is always set, the fallback never runs)."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return _is_self_llm(node.values[0])
    return _is_self_llm(node)
