"""A lane's request rate learnt from 429s (the rule is in evolver.ratelimit's docstring): cut on a 429,
grown while calls wait and none is refused."""

from __future__ import annotations

import math
from typing import Optional

HOLD = 2.0  # seconds after a cut in which further 429s (calls already in flight) cut no more
CUT = 0.5  # a cut: this share of the rate (the first: of what the provider let through lately)
GROWTH = 0.05  # share of the rate added per second of answers without a 429
FLOOR = 1.0 / 60  # requests per second a learnt rate never goes below: one a minute


class Learner:
    """A lane's learnt request rate (per second; None: nothing learnt, no limit). See evolver.ratelimit's
    docstring; ``measured`` cuts every time from what got through (the rule it was measured against)."""

    def __init__(self, cut: float = CUT, growth: float = GROWTH, hold: float = HOLD, measured: bool = False):
        self.cut, self.growth, self.hold, self.measured = cut, growth, hold, measured
        self.rate: Optional[float] = None
        self.cut_at = -math.inf
        self.grown_at = 0.0
        self.pressed = False  # whether calls were waiting at the last answer

    def limited(self, now: float, through: float) -> bool:
        """A 429 at ``now``, the provider having let ``through`` calls a second through lately; True when it cut."""
        if now - self.cut_at < self.hold:
            return False
        if self.rate is None:
            base = through  # the first 429: what got through is all that is known
        else:  # measured: what got through, never more than the rate; plain AIMD: the rate
            base = min(self.rate, through) if self.measured else self.rate
        self.rate = max(FLOOR, base * self.cut)
        self.cut_at = self.grown_at = now
        return True

    def answered(self, now: float, pressed: bool = True) -> None:
        """An answer without a 429: the rate grows over the time since the last answer, once the hold after the last
        cut has passed, if calls were waiting for their turn (``pressed``) at both answers. A rate nobody presses on
        is not raised: it would be untested, and the next burst of demand (a run's next evaluation, after a quiet
        stretch) would meet the provider's limit all at once."""
        if self.rate is not None and pressed and self.pressed:
            self.rate *= (1 + self.growth) ** max(0.0, now - max(self.grown_at, self.cut_at + self.hold))
        self.grown_at, self.pressed = now, pressed
