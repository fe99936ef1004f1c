"""What the scan says: its rules, each with the reason a refusal gives, and one finding."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Finding:
    rule: str  # a key of RULES
    path: str  # e.g. "agent/agent.py"
    line: int  # 1-based
    detail: str  # what was found, e.g. "import subprocess"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.detail} ({RULES[self.rule]})"


def short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")
