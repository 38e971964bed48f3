"""ADWIN: adaptive windowing with exponential-histogram buckets (Bifet & Gavaldà, 2007).

The window W of recent values is kept as buckets of 2**i values (at most ``max_buckets``
per size), so memory and a cut check are O(log W). Every ``clock`` updates every split of W
into an older part W0 and a newer part W1 is tested; when their means differ by more than

    eps = sqrt(2 m v ln(2/d')) + 2/3 m ln(2/d'),   m = 1/n0' + 1/n1',  d' = delta / ln(n)

(``v`` the window variance, ``n0' = n0 - min_window + 1``) the older buckets are dropped.
ADWIN's theorem bounds the probability that a check cuts a window whose mean did not change
by ``delta``: at most ``delta`` false cuts per check, so at most ``delta * N / clock`` expected
false alarms over N stable samples (before the cool-down removes duplicates).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

from streamnb._cmodules import optional_c_module
from streamnb.drift.base import DRIFT_COOLDOWN_SAMPLES, DriftDetector

#: ADWIN confidence: the probability of a false cut per check is at most this.
ADWIN_DELTA = 0.002

#: Samples between two ADWIN cut checks (River's ``clock``).
ADWIN_CLOCK = 32

Direction = Literal["both", "increase", "decrease"]

_KERNELS = optional_c_module("streamnb._kernels")
#: ``streamnb._kernels.adwin_sums`` (the window sums after a run of inserts),
#: ``adwin_insert`` (:meth:`ADWIN._insert_many`'s buckets) and ``adwin_find_cut``
#: (:meth:`ADWIN._find_cut`'s walk of the buckets), C loops doing the float operations of
#: the Python below in its order; None: not built, or turned off.
ADWIN_SUMS = getattr(_KERNELS, "adwin_sums", None)
ADWIN_INSERT = getattr(_KERNELS, "adwin_insert", None)
ADWIN_FIND_CUT = getattr(_KERNELS, "adwin_find_cut", None)


class ADWIN(DriftDetector):
    """Adaptive window over a stream of numbers, alarming when its mean changes.

    ``direction`` restricts alarms to a rise (``"increase"``) or a fall of the mean; the
    window adapts (drops its stale part) either way.

    >>> import random
    >>> rng = random.Random(1)
    >>> d = ADWIN()
    >>> stream = [rng.random() < 0.05 for _ in range(2000)] + [rng.random() < 0.5 for _ in range(500)]
    >>> alarms = [i for i, e in enumerate(stream) if d.update(e)]
    >>> len(alarms) >= 1 and 2000 <= alarms[0] < 2200
    True
    >>> d.last_change["new_mean"] > d.last_change["old_mean"]
    True
    """

    name = "adwin"

    def __init__(self, delta: float = ADWIN_DELTA, clock: int = ADWIN_CLOCK, max_buckets: int = 5,
                 min_window: int = 5, grace_period: int = 10, direction: Direction = "both",
                 cooldown: int = DRIFT_COOLDOWN_SAMPLES) -> None:
        super().__init__(cooldown)
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if clock < 1 or max_buckets < 2 or min_window < 1:
            raise ValueError("clock >= 1, max_buckets >= 2 and min_window >= 1 are required, got "
                             f"{clock}, {max_buckets}, {min_window}")
        if direction not in ("both", "increase", "decrease"):
            raise ValueError(f"direction must be both, increase or decrease, got {direction!r}")
        self.delta = delta
        self.clock = clock
        self.max_buckets = max_buckets
        self.min_window = min_window
        self.grace_period = grace_period
        self.direction = direction
        # rows[i]: buckets of 2**i values, oldest first, each [sum, M2 (sum of sq. deviations)]
        self._rows: list[list[list[float]]] = [[]]
        self.width = 0
        self.total = 0.0
        self._m2 = 0.0

    # ------------------------------------------------------------------ window
    @property
    def mean(self) -> float:
        """Mean of the current window (0 when empty)."""
        return self.total / self.width if self.width else 0.0

    @property
    def variance(self) -> float:
        return self._m2 / self.width if self.width else 0.0

    def _insert(self, x: float) -> None:
        if self.width:
            self._m2 += self.width * (x - self.mean) ** 2 / (self.width + 1)
        self.width += 1
        self.total += x
        self._rows[0].append([x, 0.0])
        if len(self._rows[0]) > self.max_buckets:
            self._merge_full_rows()

    def _merge_full_rows(self, level: int = 0) -> None:
        """Merge the oldest buckets of every row from ``level`` on that holds more than
        ``max_buckets``, two by two, until it holds at most that many. A row is a queue merged
        pairwise from its old end, so merging once after several inserts gives the very
        buckets that merging after each insert gives."""
        rows, max_buckets = self._rows, self.max_buckets
        for i in range(level, len(rows)):
            row = rows[i]
            over = len(row) - max_buckets
            if over <= 0:
                break
            size = 1 << i
            sq, twice = size * size, 2 * size
            if i == 0:       # buckets [x, 0.0]: the formula below with size 1, exactly
                pairs = row[:over + over % 2]
                merged = [[s1 + s2, (s1 - s2) ** 2 / 2]
                          for (s1, _), (s2, _) in zip(pairs[::2], pairs[1::2], strict=True)]
            elif over <= 2:  # one pair (most rows)
                (s1, v1), (s2, v2) = row[0], row[1]
                merged = [[s1 + s2, v1 + v2 + sq * (s1 / size - s2 / size) ** 2 / twice]]
            else:            # size * size * d ** 2 / (2 * size), evaluated left to right
                pairs = row[:over + over % 2]
                merged = [[s1 + s2, v1 + v2 + sq * (s1 / size - s2 / size) ** 2 / twice]
                          for (s1, v1), (s2, v2) in zip(pairs[::2], pairs[1::2], strict=True)]
            del row[:over + over % 2]
            if i + 1 == len(rows):
                rows.append(merged)
            else:
                rows[i + 1] += merged

    def _insert_many(self, xs: list[float]) -> None:
        """The buckets of :meth:`_insert` with each of ``xs`` (sums aside): row 0's oldest
        values are merged in pairs straight from the values, as ``_merge_full_rows`` would,
        then the rows above from level 1 (a row 1 created here may already be over full,
        which one ``_merge_full_rows()`` pass would not revisit)."""
        rows, max_buckets = self._rows, self.max_buckets
        if ADWIN_INSERT is not None:
            ADWIN_INSERT(rows, xs, max_buckets)
            return
        row0 = rows[0]
        if len(row0) + len(xs) <= max_buckets:
            row0 += [[x, 0.0] for x in xs]
            return
        values = [s for s, _ in row0] + xs
        k = 2 * ((len(values) - max_buckets + 1) // 2)
        merged = [[a + b, (a - b) ** 2 / 2]
                  for a, b in zip(values[0:k:2], values[1:k:2], strict=True)]
        row0[:] = [[x, 0.0] for x in values[k:]]
        if len(rows) == 1:
            rows.append(merged)
        else:
            rows[1] += merged
        if len(rows[1]) > max_buckets:
            self._merge_full_rows(1)

    def _drop_oldest(self) -> tuple[int, float]:
        """Remove the oldest bucket; return its size and sum."""
        level = len(self._rows) - 1
        while not self._rows[level]:
            level -= 1
        s, v = self._rows[level].pop(0)
        n = 1 << level
        self.width -= n
        self.total -= s
        if self.width:
            self._m2 -= v + n * self.width * (s / n - self.mean) ** 2 / (n + self.width)
            self._m2 = max(self._m2, 0.0)
        else:
            self._m2 = 0.0
        while len(self._rows) > 1 and not self._rows[-1]:
            self._rows.pop()
        return n, s

    def _find_cut(self) -> bool:
        """True if some split of the window has significantly different means."""
        n, total, min_window, sqrt = self.width, self.total, self.min_window, math.sqrt
        v = self.variance
        log_term = math.log(2.0 * math.log(n) / self.delta)
        linear = 2.0 / 3.0 * log_term        # eps's second term is linear * m, as written
        if ADWIN_FIND_CUT is not None:
            return ADWIN_FIND_CUT(self._rows, n, total, v, log_term, linear, min_window)
        shift = min_window - 1
        n0, s0 = 0, 0.0
        for level in range(len(self._rows) - 1, -1, -1):
            size = 1 << level
            for s, _ in self._rows[level]:
                n0 += size
                s0 += s
                n1 = n - n0
                if n1 < min_window:
                    return False
                if n0 < min_window:
                    continue
                m = 1.0 / (n0 - shift) + 1.0 / (n1 - shift)
                diff = abs(s0 / n0 - (total - s0) / n1)
                # eps = sqrt(...) + linear * m >= linear * m: no cut without passing that first
                if diff > linear * m and diff > sqrt(2.0 * m * v * log_term) + linear * m:
                    return True
        return False

    # ------------------------------------------------------------------ update
    def update(self, x: float) -> bool:
        """Add one value; True if the window was cut and that is an alarm."""
        self.drift_detected = False
        self.n_seen += 1
        self._insert(float(x))
        if self.n_seen % self.clock or self.width <= max(self.grace_period, 2 * self.min_window):
            return False
        return self._cut()

    def update_many(self, values: Iterable[float]) -> list[tuple[int, dict[str, Any]]]:
        """:meth:`update` with each value in turn: the same state, bit for bit, and alarms.
        Returns ``(position in values, last_change)`` of every update that alarmed.

        Between two clock ticks only the sums are updated value by value; the new buckets are
        merged once before the tick's cut check (the same buckets, see ``_merge_full_rows``).

        >>> import random
        >>> rng = random.Random(2)
        >>> xs = [float(rng.random() < (0.05 if i < 1500 else 0.6)) for i in range(2000)]
        >>> one, many = ADWIN(), ADWIN()
        >>> [i for i, x in enumerate(xs) if one.update(x)] == [i for i, _ in many.update_many(xs)]
        True
        >>> (one.width, one.total, one.variance) == (many.width, many.total, many.variance)
        True
        """
        xs = list(map(float, values))
        if not xs:
            return []
        warm = max(self.grace_period, 2 * self.min_window)
        alarms: list[tuple[int, dict[str, Any]]] = []
        clock = self.clock
        width, total, m2, n_seen = self.width, self.total, self._m2, self.n_seen
        start, n = 0, len(xs)
        while start < n:
            stop = min(n, start + clock - n_seen % clock)   # up to the next clock tick
            chunk = xs[start:stop]
            if ADWIN_SUMS is not None:
                width, total, m2 = ADWIN_SUMS(chunk, width, total, m2)
            else:
                for x in chunk:  # as _insert, operation for operation (bit-identical state)
                    if width:
                        m2 += width * (x - total / width) ** 2 / (width + 1)
                    width += 1
                    total += x
            n_seen += stop - start
            start = stop
            self._insert_many(chunk)
            if n_seen % clock or width <= warm:
                continue
            self.width, self.total, self._m2, self.n_seen = width, total, m2, n_seen
            if self._cut():
                alarms.append((stop - 1, self.last_change))
            width, total, m2 = self.width, self.total, self._m2
        self.width, self.total, self._m2, self.n_seen = width, total, m2, n_seen
        self.drift_detected = bool(alarms) and alarms[-1][0] == n - 1
        return alarms

    def _judge(self, dropped_n: int, dropped_s: float, new_mean: float, window: int) -> bool:
        """A cut that dropped ``dropped_n`` values summing to ``dropped_s``, leaving
        ``window`` values of mean ``new_mean``: an alarm in the watched direction?"""
        old_mean = dropped_s / dropped_n
        if (self.direction == "increase" and new_mean <= old_mean) or (
                self.direction == "decrease" and new_mean >= old_mean):
            return False
        return self._alarm({"old_mean": old_mean, "new_mean": new_mean, "dropped": dropped_n,
                            "window": window})

    def _cut(self) -> bool:
        """Drop the stale part of the window if it differs; True if that is an alarm."""
        dropped_n, dropped_s = 0, 0.0
        while self.width > 2 * self.min_window and self._find_cut():
            n, s = self._drop_oldest()
            dropped_n += n
            dropped_s += s
        if not dropped_n:
            return False
        return self._judge(dropped_n, dropped_s, self.mean, self.width)

    def _state(self) -> dict[str, Any]:
        return {"mean": self.mean, "width": self.width, "variance": self.variance}
