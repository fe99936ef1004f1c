"""When a run stops: its stop conditions, checked before each iteration, and StopRun, raised when one is met."""

from __future__ import annotations

from evolver.evolution.loop.context import RunContext


class StopRun(Exception):
    """A stop condition was met; the reason is recorded in state.json."""


class StopConditions:
    """The run's stop conditions: iterations, stall, budget, tokens, wall clock."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def check(self) -> None:
        """Raise StopRun when a stop condition is met, before the next iteration starts."""
        s, cfg = self.ctx.state, self.ctx.cfg
        if s.next_iteration > s.iterations_target:
            raise StopRun(f"completed {s.iterations_target} iteration(s)")
        if cfg.stall and s.consecutive_rejections >= cfg.stall:
            raise StopRun(f"{s.consecutive_rejections} consecutive candidates were not kept (stall limit {cfg.stall})")
        cost = sum(u.cost for u in s.usage.values())
        tokens = sum(u.prompt_tokens + u.completion_tokens for u in s.usage.values())
        if cfg.budget_usd and cost >= cfg.budget_usd:
            raise StopRun(f"budget reached: ${cost:.2f} of ${cfg.budget_usd:.2f}")
        if cfg.budget_tokens and tokens >= cfg.budget_tokens:
            raise StopRun(f"token budget reached: {tokens:,} of {cfg.budget_tokens:,}")
        if cfg.max_hours and self.ctx.elapsed() >= cfg.max_hours * 3600:
            raise StopRun(f"wall-clock limit of {cfg.max_hours:g} h reached")
