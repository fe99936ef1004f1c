"""The evaluation requests a configuration makes: one evaluation's (the worker's EvalRequest, every role
resolved by Config.role), and one that only lists tasks and splits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from evolver.config import Config
from evolver.data import EvalRequest


def eval_request(
    cfg: Config, checkout: Path, out_dir: Path, *, local_api_base: Optional[str], timeout: Optional[float] = None, **fields
) -> EvalRequest:
    """The request for one evaluation under this configuration; ``fields`` set the tasks and trials.
    ``local_api_base`` is required (None when nothing is served): a request for a `local` role built
    before the embedded server is up is refused by EvalRequest itself, before any simulation."""
    timeout = timeout or cfg.worker_timeout
    base = dict(
        checkout=str(checkout),
        out_dir=str(out_dir),
        domain=cfg.domain,
        split=cfg.split or None,
        trials=cfg.trials,
        concurrency=cfg.concurrency,
        seed=cfg.seed,
        max_steps=cfg.max_steps,
        llm_retries=cfg.llm_retries,
        plugins=cfg.plugins,
        sandbox=not cfg.unsafe_no_sandbox,
        agent_timeout=min(cfg.agent_timeout, timeout),
        agent_memory_mb=cfg.agent_memory_mb,
        agent=cfg.role("agent", local_api_base),
        user=cfg.role("user", local_api_base),
        judge=cfg.role("judge", local_api_base),
    )
    return EvalRequest(**{**base, **fields})


def listing_request(cfg: Config, checkout: Path, out_dir: Path, **fields) -> EvalRequest:
    """A request that only resolves tasks and splits: no simulation, so no model is called and the
    embedded server need not be up yet (a misspelt split fails before minutes of model start-up)."""
    return eval_request(cfg, checkout, out_dir, local_api_base=None, list_only=True, **fields)
