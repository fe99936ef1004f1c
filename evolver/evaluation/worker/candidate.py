"""The candidate, made ready for the agent processes: a private copy of its agent/, imported once in a
sandboxed agent process before any simulation."""

from __future__ import annotations

import shutil
from pathlib import Path

from evolver.evaluation.worker.stop import EXIT_CANDIDATE, EXIT_USAGE, Stop


def stage_candidate(checkout: Path, staging: Path) -> Path:
    """A private copy of the checkout's agent/ for the agent processes to read: they see neither
    the rest of the checkout (inside the run directory) nor its .git. Links are copied as
    links, never followed, so the copy reads nothing outside agent/."""
    import compileall

    source = staging / "src"
    shutil.copytree(checkout / "agent", source / "agent", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    # Bytecode compiled here (compiling runs none of it) spares every agent process the compile.
    compileall.compile_dir(source, quiet=2)
    return source


def check_candidate(s):
    """Import the candidate in a sandboxed agent process before any simulation: a broken
    candidate fails fast and clearly. Returns that process, ready: it serves the first simulation."""
    from evolver.evaluation import proxy_agent

    context, process = proxy_agent.SimContext(), proxy_agent.AgentProcess(s)
    try:
        return process.attach(context)
    except proxy_agent.SandboxFailure as exc:
        context.close()
        raise Stop("usage_error", f"{exc}; fix the system, or pass --unsafe-no-sandbox to run candidates unconfined", EXIT_USAGE) from None
    except proxy_agent.AgentFault as exc:
        context.close()
        message = str(exc)
        if "did not answer within" in message:
            message = f"agent/agent.py did not finish importing within {s.turn_timeout:g} s"
        raise Stop("candidate_error", message, EXIT_CANDIDATE, isolation=process.isolation) from None
