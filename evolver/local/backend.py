"""Serve the embedded model for the length of a command, when a role needs it."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator, Optional

from rich.console import Console

from evolver.config import Config


@contextmanager
def serve_local(
    cfg: Config, console: Console, roles: tuple[str, ...] = ("agent", "user", "meta")
) -> Iterator[tuple[Config, Optional[str]]]:
    """Start the llama.cpp server if one of ``roles`` is "local" without a server of its own, yield the
    settings as served (cap_concurrency's) and its address (None when nothing is served) for the requests
    built inside, and stop it on exit, errors and Ctrl-C alike. The address is passed on explicitly
    (config.eval_request, Config.role), so a request cannot be built for it before it exists."""
    if not cfg.uses_local_server(roles):
        yield cfg, None
        return
    from evolver.local.provision import resolve_model
    from evolver.local.server import LocalServer

    path = resolve_model(cfg.local_size, cfg.local_model or None)
    console.print(f"starting the embedded model server ({path.name}) ...")
    served = cap_concurrency(cfg, console, roles)
    with LocalServer(path) as server:
        console.print(f"embedded model ready at {server.api_base}")
        yield served, server.api_base


def cap_concurrency(cfg: Config, console: Console, roles: tuple[str, ...] = ("agent", "user", "meta")) -> Config:
    """``cfg`` with its concurrency lowered to the simulations the embedded server can hold, when it will serve ``roles``.
    Called before the run's estimate too, so that the estimate counts the simulations that really run at once."""
    from evolver.local.server import PARALLEL

    # Only the roles inside a simulation hold server slots; a local meta-LLM is called between evaluations.
    simulated = tuple(r for r in roles if r in ("agent", "user"))
    if not (cfg.uses_local_server(simulated) and cfg.concurrency > PARALLEL // 2):
        return cfg
    # Each simulation's agent and user keep a server slot (and its prompt cache) each.
    console.print(
        f"concurrency {cfg.concurrency} -> {PARALLEL // 2}: the embedded server has {PARALLEL} slots, one per role of a simulation"
    )
    return replace(cfg, concurrency=PARALLEL // 2)
