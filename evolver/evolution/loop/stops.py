"""When a run stops: its stop conditions, checked before each iteration, and StopRun, raised when one is met."""

from __future__ import annotations


class StopRun(Exception):
    """A stop condition was met; the reason is recorded in state.json."""


class StopConditions:
    """Loop's stop conditions: iterations, stall, budget, tokens, wall clock (a part of evolver.evolution.loop.Loop,
    which holds the run, its state and settings)."""

    def check_stop(self) -> None:
        s = self.state
        if s.next_iteration > s.iterations_target:
            raise StopRun(f"completed {s.iterations_target} iteration(s)")
        if self.cfg.stall and s.consecutive_rejections >= self.cfg.stall:
            raise StopRun(f"{s.consecutive_rejections} consecutive candidates were not kept (stall limit {self.cfg.stall})")
        cost = sum(u.cost for u in s.usage.values())
        tokens = sum(u.prompt_tokens + u.completion_tokens for u in s.usage.values())
        if self.cfg.budget_usd and cost >= self.cfg.budget_usd:
            raise StopRun(f"budget reached: ${cost:.2f} of ${self.cfg.budget_usd:.2f}")
        if self.cfg.budget_tokens and tokens >= self.cfg.budget_tokens:
            raise StopRun(f"token budget reached: {tokens:,} of {self.cfg.budget_tokens:,}")
        if self.cfg.max_hours and self.elapsed() >= self.cfg.max_hours * 3600:
            raise StopRun(f"wall-clock limit of {self.cfg.max_hours:g} h reached")
