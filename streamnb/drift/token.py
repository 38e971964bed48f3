"""Token drift: a rise in the share of each message's features the model never saw.

The out-of-vocabulary (OOV) share falls while a model learns its vocabulary and rises when
the mail changes (new campaigns, a new language, a broken tokenizer upstream). This is ADWIN
(:mod:`streamnb.drift.adwin`, false cuts per check <= delta) on the per-message OOV share,
alarming on increases only, after a warm-up of ``warmup`` messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streamnb.drift.adwin import ADWIN, ADWIN_CLOCK, ADWIN_DELTA
from streamnb.drift.base import DRIFT_COOLDOWN_SAMPLES, DriftDetector


class TokenDrift(DriftDetector):
    """Alarm when the recent out-of-vocabulary share rises; ``rate`` is ADWIN's window mean.

    >>> import random
    >>> rng = random.Random(3)
    >>> d = TokenDrift(warmup=100)
    >>> shares = [rng.uniform(0.0, 0.1) for _ in range(1500)] + [rng.uniform(0.2, 0.5) for _ in range(300)]
    >>> alarms = [i for i, s in enumerate(shares) if d.update(s)]
    >>> len(alarms) >= 1 and 1500 <= alarms[0] < 1600
    True
    """

    name = "token"

    def __init__(self, delta: float = ADWIN_DELTA, clock: int = ADWIN_CLOCK, warmup: int = 1000,
                 cooldown: int = DRIFT_COOLDOWN_SAMPLES) -> None:
        super().__init__(cooldown)
        self.warmup = warmup
        self._adwin = ADWIN(delta=delta, clock=clock, direction="increase", cooldown=0)

    @property
    def rate(self) -> float:
        """Mean OOV share over ADWIN's current window."""
        return self._adwin.mean

    def update(self, oov_share: float) -> bool:
        """Add one message's OOV share (in [0, 1]); True on an alarm."""
        self.drift_detected = False
        self.n_seen += 1
        if not self._adwin.update(oov_share) or self.n_seen <= self.warmup:
            return False
        return self._alarm({"old_rate": self._adwin.last_change["old_mean"],
                            "new_rate": self._adwin.last_change["new_mean"]})

    def update_many(self, shares: Iterable[float]) -> list[tuple[int, dict[str, Any]]]:
        """:meth:`update` with each share in turn: the same state and alarms, returned as
        ``(position in shares, last_change)``.

        >>> import random
        >>> rng = random.Random(3)
        >>> xs = [rng.uniform(0.0, 0.1) for _ in range(1500)] + [rng.uniform(0.2, 0.5) for _ in range(300)]
        >>> one, many = TokenDrift(warmup=100), TokenDrift(warmup=100)
        >>> [i for i, x in enumerate(xs) if one.update(x)] == [i for i, _ in many.update_many(xs)]
        True
        """
        shares = list(shares)
        if not shares:
            return []
        start = self.n_seen
        alarms: list[tuple[int, dict[str, Any]]] = []
        for i, change in self._adwin.update_many(shares):
            self.n_seen = start + i + 1
            if self.n_seen > self.warmup and self._alarm(
                    {"old_rate": change["old_mean"], "new_rate": change["new_mean"]}):
                alarms.append((i, self.last_change))
        self.n_seen = start + len(shares)
        self.drift_detected = bool(alarms) and alarms[-1][0] == len(shares) - 1
        return alarms

    def _state(self) -> dict[str, Any]:
        return {"rate": self.rate, "window": self._adwin.width}
