"""Bounded exponential backoff with full jitter, for reconnecting to Redis.

The n-th delay is uniform in ``[0, min(cap, base * factor**n)]`` ("full jitter"), so many
workers that lost the same server do not reconnect in lockstep; it never exceeds ``cap``.

>>> import random
>>> b = Backoff(base=0.1, cap=1.0, rng=random.Random(0))
>>> delays = [b.next_delay() for _ in range(10)]
>>> all(0.0 <= d <= 1.0 for d in delays), b.attempts
(True, 10)
>>> b.reset(); b.attempts
0
"""

from __future__ import annotations

import random


class Backoff:
    """Capped exponential backoff with full jitter (see the module docstring)."""

    def __init__(self, base: float = 0.05, cap: float = 5.0, factor: float = 2.0,
                 rng: random.Random | None = None) -> None:
        if base <= 0 or cap < base or factor < 1:
            raise ValueError(f"need 0 < base <= cap and factor >= 1, got {base}, {cap}, {factor}")
        self.base = base
        self.cap = cap
        self.factor = factor
        self.attempts = 0
        self._rng = rng or random.Random()

    def ceiling(self) -> float:
        """The upper bound of the next delay."""
        return min(self.cap, self.base * self.factor ** min(self.attempts, 60))

    def next_delay(self) -> float:
        """The next delay in seconds; counts one attempt."""
        d = self._rng.uniform(0.0, self.ceiling())
        self.attempts += 1
        return d

    def reset(self) -> None:
        """Back to the first delay (after a success)."""
        self.attempts = 0
