"""Page-Hinkley test (Page, 1954): a cumulative-sum test for a change in the mean.

With ``m_t`` the running mean, the test accumulates ``U_t = sum (x_i - m_i - delta)`` and
alarms when ``U_t - min U > threshold`` (a rise; mirrored for a fall). ``delta`` is the
size of change that is ignored, ``threshold`` (lambda) trades delay for false alarms. After
an alarm the test restarts from the new regime. ``alpha`` < 1 fades old deviations
(River's default 1 - 1e-4). Used on the per-message log-loss, capped at
``clip`` so one confidently wrong prediction cannot raise an alarm on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from streamnb._cmodules import optional_c_module
from streamnb.drift.base import DRIFT_COOLDOWN_SAMPLES, DriftDetector

#: ``streamnb._kernels.page_hinkley_run``: :meth:`PageHinkley.update_many`'s loop up to
#: the first alarm in C, the same float operations in the same order; None: not built,
#: or turned off (``STREAMNB_PURE_PYTHON``).
PAGE_HINKLEY_RUN = getattr(optional_c_module("streamnb._kernels"), "page_hinkley_run", None)


class PageHinkley(DriftDetector):
    """Page-Hinkley change detector on the mean of a stream.

    >>> d = PageHinkley(delta=0.005, threshold=20.0)
    >>> alarms = [i for i in range(600) if d.update(0.1 if i < 300 else 1.1)]
    >>> alarms[0] - 300 < 30
    True
    >>> d.last_change["direction"]
    'increase'
    """

    name = "page_hinkley"

    def __init__(self, delta: float = 0.005, threshold: float = 50.0, min_instances: int = 30,
                 alpha: float = 1 - 1e-4, mode: Literal["up", "down", "both"] = "up",
                 clip: float | None = None, cooldown: int = DRIFT_COOLDOWN_SAMPLES) -> None:
        super().__init__(cooldown)
        if threshold <= 0 or delta < 0 or not 0 < alpha <= 1:
            raise ValueError(f"need threshold > 0, delta >= 0, 0 < alpha <= 1; got {threshold}, "
                             f"{delta}, {alpha}")
        if mode not in ("up", "down", "both"):
            raise ValueError(f"mode must be up, down or both, got {mode!r}")
        self.delta, self.threshold, self.min_instances = delta, threshold, min_instances
        self.alpha, self.mode, self.clip = alpha, mode, clip
        self._restart()

    def _restart(self) -> None:
        self.n = 0
        self.mean = 0.0
        self._up = 0.0
        self._up_min = 0.0
        self._down = 0.0
        self._down_max = 0.0

    @property
    def statistic(self) -> float:
        """The larger of the monitored excursions (compared with ``threshold``)."""
        up = self._up - self._up_min if self.mode != "down" else 0.0
        down = self._down_max - self._down if self.mode != "up" else 0.0
        return max(up, down)

    def update(self, x: float) -> bool:
        """Add one value; True on an alarm."""
        self.drift_detected = False
        self.n_seen += 1
        x = float(x)
        if self.clip is not None:
            x = min(x, self.clip)
        self.n += 1
        self.mean += (x - self.mean) / self.n
        dev = x - self.mean
        self._up = self.alpha * self._up + dev - self.delta
        self._down = self.alpha * self._down + dev + self.delta
        self._up_min = min(self._up_min, self._up)
        self._down_max = max(self._down_max, self._down)
        if self.n < self.min_instances:
            return False
        up = self._up - self._up_min if self.mode != "down" else 0.0
        down = self._down_max - self._down if self.mode != "up" else 0.0
        if max(up, down) <= self.threshold:
            return False
        change = {"direction": "increase" if up >= down else "decrease", "mean_before": self.mean,
                  "statistic": max(up, down), "samples": self.n}
        self._restart()
        return self._alarm(change)

    def update_many(self, values: Iterable[float]) -> list[tuple[int, dict[str, Any]]]:
        """:meth:`update` with each value in turn, in one loop: the same state and alarms.
        Returns ``(position in values, last_change)`` of every update that alarmed.

        >>> xs = [0.1 if i < 300 else 1.1 for i in range(600)]
        >>> one, many = PageHinkley(delta=0.005, threshold=20.0), PageHinkley(delta=0.005, threshold=20.0)
        >>> [i for i, x in enumerate(xs) if one.update(x)] == [i for i, _ in many.update_many(xs)]
        True
        >>> one.statistic == many.statistic and one.mean == many.mean
        True
        """
        xs = list(map(float, values))
        if not xs:
            return []
        if PAGE_HINKLEY_RUN is not None:
            return self._update_many_c(xs)
        if self.clip is not None:
            clip = self.clip
            xs = [min(x, clip) for x in xs]
        alarms: list[tuple[int, dict[str, Any]]] = []
        alpha, delta, threshold = self.alpha, self.delta, self.threshold
        min_instances = self.min_instances
        watch_up, watch_down = self.mode != "down", self.mode != "up"
        n, mean, up, up_min = self.n, self.mean, self._up, self._up_min
        down, down_max, n_seen = self._down, self._down_max, self.n_seen
        for i, x in enumerate(xs):  # as update, operation for operation (bit-identical state)
            n += 1
            mean += (x - mean) / n
            dev = x - mean
            up = alpha * up + dev - delta
            down = alpha * down + dev + delta
            if up < up_min:          # min(up_min, up) and max(down_max, down), NaN and all
                up_min = up
            if down > down_max:
                down_max = down
            if n < min_instances:
                continue
            u = up - up_min if watch_up else 0.0
            d = down_max - down if watch_down else 0.0
            if (d if d > u else u) <= threshold:     # max(u, d), as the builtin picks it
                continue
            change = {"direction": "increase" if u >= d else "decrease", "mean_before": mean,
                      "statistic": max(u, d), "samples": n}
            self._restart()
            n, mean, up, up_min = self.n, self.mean, self._up, self._up_min
            down, down_max = self._down, self._down_max
            self.n_seen = n_seen + i + 1
            if self._alarm(change):
                alarms.append((i, change))
        self.n, self.mean, self._up, self._up_min = n, mean, up, up_min
        self._down, self._down_max, self.n_seen = down, down_max, n_seen + len(xs)
        self.drift_detected = bool(alarms) and alarms[-1][0] == len(xs) - 1
        return alarms

    def _update_many_c(self, xs: list[float]) -> list[tuple[int, dict[str, Any]]]:
        """:meth:`update_many` with the loop in C (``PAGE_HINKLEY_RUN``), run by run up to
        each alarm."""
        alarms: list[tuple[int, dict[str, Any]]] = []
        watch_up, watch_down = self.mode != "down", self.mode != "up"
        n_seen, start = self.n_seen, 0
        while True:
            i, n, mean, up, up_min, down, down_max, u, d = PAGE_HINKLEY_RUN(
                xs, start, self.clip, self.alpha, self.delta, self.threshold,
                self.min_instances, watch_up, watch_down, self.n, self.mean, self._up,
                self._up_min, self._down, self._down_max)
            if i < 0:
                self.n, self.mean, self._up, self._up_min = n, mean, up, up_min
                self._down, self._down_max = down, down_max
                break
            change = {"direction": "increase" if u >= d else "decrease", "mean_before": mean,
                      "statistic": max(u, d), "samples": n}
            self._restart()
            self.n_seen = n_seen + i + 1
            if self._alarm(change):
                alarms.append((i, change))
            start = i + 1
        self.n_seen = n_seen + len(xs)
        self.drift_detected = bool(alarms) and alarms[-1][0] == len(xs) - 1
        return alarms

    def _state(self) -> dict[str, Any]:
        return {"mean": self.mean, "statistic": self.statistic, "threshold": self.threshold}
