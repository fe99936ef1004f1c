"""The preflight: before a command spends anything, each configured role's model gets one short request
shaped like its real ones, all at once, and the command says per role: the model, ok, the seconds, and
what its requests leave out (evolver.models). A refusal stops the command in one line, exit 2, before
the first simulation (evolver.llm.configuration_line); a provider that does not answer through its
retries stops it too, exit 3. Roles on the embedded model are checked once its server is up.

The agent's request carries a tool, as the candidate's do; the user simulator's the seed tau2 gives it; the
meta-LLM's what its proposer's do (evolver.evolution.proposers.meta_shape: tools, the answer's room, the
sampling it varies). Roles whose requests would be the same share one. Each line names the model as litellm
places it, provider first, whether it was configured or the default.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional

from rich.console import Console

from evolver.config import Config
from evolver.errors import ProviderUnavailable, UsageError

SIMULATED = ("agent", "user", "judge")  # the roles a simulation calls (eval, compare, transfer)
RUN_ROLES = SIMULATED + ("meta",)


@dataclass
class Check:
    roles: list[str]
    model: str
    kwargs: dict
    left_out: list[str] = field(default_factory=list)
    seconds: float = 0.0
    failure: Optional[BaseException] = None

    def line(self) -> str:
        said = f"; left out: {'; '.join(self.left_out)}" if self.left_out else ""
        return f"preflight {', '.join(self.roles)}: {self.model} ok ({self.seconds:.1f} s){said}"


def checks(cfg: Config, local_api_base: Optional[str], roles: tuple[str, ...]) -> list[Check]:
    """One request per distinct configuration among ``roles``, as each role's real requests are made."""
    from evolver.evolution.proposers import meta_request, proposer_kind
    from evolver.llm import missing_key_line
    from evolver.models import PREFLIGHT_TOOL, placed_name, preflight_messages, shape

    out: dict[str, Check] = {}
    for name in roles:
        role = cfg.role(name, local_api_base)
        if missing := missing_key_line(name, role):
            raise UsageError(missing)
        if name == "meta":
            extra = proposer_kind(cfg.proposer).meta_shape(role)
            if extra is None:  # a command proposer brings its own model
                continue
            kwargs = meta_request(role, preflight_messages(), **extra)
        elif name == "agent":  # the proxy's request: the candidate's messages and tools, the configured model and arguments
            kwargs = {
                "model": role.model,
                "messages": preflight_messages(),
                "tools": [PREFLIGHT_TOOL],
                "tool_choice": "auto",
                **role.litellm_args(),
            }
        elif name == "user":  # tau2's user simulator: messages, the configured arguments and the seed tau2 gives it (set_seed)
            kwargs = {"model": role.model, "messages": preflight_messages(), **role.litellm_args(), "seed": cfg.seed}
        else:  # tau2's judge: messages and the configured arguments
            kwargs = {"model": role.model, "messages": preflight_messages(), **role.litellm_args()}
        key = json.dumps({k: v for k, v in kwargs.items() if k != "messages"}, sort_keys=True, default=str)
        if key in out:
            out[key].roles.append(name)
        else:
            out[key] = Check([name], placed_name(role.model, role.api_base), kwargs, shape(kwargs).rules.notes())
    return list(out.values())


def check_servers(cfg: Config, roles: tuple[str, ...]) -> None:
    """Each server configured for ``roles`` answers at all (evolver.llm.check_api_base), said with the roles it serves
    and the flag that set it, before the command asks anything else of it."""
    from evolver.llm import check_api_base

    servers: dict[tuple[str, str], list[str]] = {}
    for name in roles:
        own = "user" if name == "judge" else name  # the judge is served where the user simulator is
        base = cfg.role(name).api_base
        if base:
            servers.setdefault((base, f"--{own}-api-base" if getattr(cfg, f"{own}_api_base") else "--api-base"), []).append(name)
    for (base, flag), names in servers.items():
        check_api_base(base, names, flag)


def preflight(cfg: Config, local_api_base: Optional[str], roles: tuple[str, ...]) -> list[str]:
    """Check ``roles`` (see the module's docstring): the line per role to print once the command has no more
    input to refuse (bad input gets one line, this one's included); raises UsageError (a refusal: one line)
    or ProviderUnavailable. Nothing with the preflight off."""
    if not cfg.preflight:
        return []
    from evolver.llm import ConfigurationError, ProviderError, configuration_line, failure_words, retrying
    from evolver.local.providers import register_providers

    register_providers([cfg.role(name, local_api_base).model for name in roles])  # (evolver's own providers: before their rules are read)
    todo = checks(cfg, local_api_base, roles)
    import litellm

    def run(check: Check) -> Check:
        started = time.monotonic()
        try:
            retrying(litellm.completion, cfg.llm_retries, check.roles[0])(**check.kwargs)
        except Exception as exc:  # noqa: BLE001 - every failure is said, in one line
            check.failure = exc
        check.seconds = time.monotonic() - started
        return check

    with ThreadPoolExecutor(max_workers=max(1, len(todo)), thread_name_prefix="preflight") as pool:
        done = list(pool.map(run, todo))
    failed = [c for c in done if c.failure is not None]
    down = [c for c in failed if isinstance(c.failure, ProviderError) and not isinstance(c.failure, ConfigurationError)]
    for c in failed:
        if c not in down:  # refused: the configuration (or a request of evolver's own the provider will not take)
            raise UsageError(configuration_line(c.roles[0], c.model, c.failure))
    if down:
        c = down[0]
        raise ProviderUnavailable(
            f"the {c.roles[0]} model {c.model} did not answer evolver's first request through {cfg.llm_retries} "
            f"attempt(s) ({failure_words(c.failure)}); nothing was spent: try again once it answers, or skip this check "
            "with --no-preflight"
        )
    return [check.line() for check in done]


def say(console: Console, lines: list[str]) -> None:
    for line in lines:
        console.print(line, highlight=False, markup=False)


@contextmanager
def preflighted(
    cfg: Config, console: Console, roles: tuple[str, ...], said: Optional[list[str]] = None
) -> Iterator[tuple[Config, Optional[str]]]:
    """The embedded model's server when one of ``roles`` needs it (evolver.local.backend.serve_local), then the
    preflight of ``roles``; yields the settings as served and the server's address. Its lines are said here, or added to ``said`` for a
    caller that still has input to refuse (a run not yet created)."""
    from evolver.local.backend import serve_local

    with serve_local(cfg, console, roles) as (served, local_api_base):
        lines = preflight(served, local_api_base, roles)
        if said is None:
            say(console, lines)
        else:
            said.extend(lines)
        yield served, local_api_base
