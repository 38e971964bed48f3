"""One model's series in the worker's metric families (:class:`MetricSeries`), and the
timer of one stage of a batch (:class:`StageTimer`); the families themselves are defined
in workers/observe/metrics.py.
"""

from __future__ import annotations

import time
from typing import Any

from streamnb_workers.observe.metrics import Metrics

__all__ = ["MetricSeries", "StageTimer"]


class MetricSeries:
    """The series of one model served by one worker (labels ``model`` and ``worker``) in
    the families of ``metrics``: ``series(metrics.commits).inc()``. Each child is looked
    up once and kept (``family.labels()`` takes microseconds; a batch asks for about
    twenty).

    >>> m = Metrics(CollectorRegistry())
    >>> series = MetricSeries(m, "mail", "w1")
    >>> series(m.dead_letters, reason="poison").inc()
    >>> with series.stage("read"):
    ...     pass
    >>> series(m.dead_letters, reason="poison") is m.dead_letters.labels(
    ...     model="mail", worker="w1", reason="poison")
    True
    """

    __slots__ = ("metrics", "model", "worker", "_children")

    def __init__(self, metrics: Metrics, model: str, worker: str) -> None:
        self.metrics, self.model, self.worker = metrics, model, worker
        self._children: dict[Any, Any] = {}

    def __call__(self, family: Any, **labels: str) -> Any:
        """The child of ``family`` for this model and worker (and ``labels``)."""
        key = (family, *labels.items()) if labels else family
        child = self._children.get(key)
        if child is None:
            child = family.labels(model=self.model, worker=self.worker, **labels)
            self._children[key] = child
        return child

    def stage(self, stage: str, summed: bool = False) -> StageTimer:
        """A timer of ``stage`` in the stage histogram (:data:`STAGES`); see
        :class:`StageTimer`."""
        return StageTimer(self(self.metrics.stage_seconds, stage=stage), summed)


class StageTimer:
    """Times one stage of a batch for its histogram child: ``with timer:`` adds the time
    spent inside (not when it raised); :meth:`add` adds seconds timed elsewhere. A timer
    observes its sum when the ``with`` ends, or, ``summed``, the sum of every ``with``
    when :meth:`observe` is called; :meth:`cancel` drops what the current ``with`` would
    observe.

    >>> from prometheus_client import Histogram
    >>> reg = CollectorRegistry()
    >>> t = StageTimer(Histogram("h", "demo", buckets=(1.0,), registry=reg), summed=True)
    >>> for _ in range(2):
    ...     with t: pass
    >>> t.add(2.0); t.observe()
    >>> reg.get_sample_value("h_count"), reg.get_sample_value("h_sum") > 2.0
    (1.0, True)
    """

    __slots__ = ("child", "summed", "seconds", "started", "cancelled")

    def __init__(self, child: Any, summed: bool = False) -> None:
        self.child, self.summed = child, summed
        self.seconds = 0.0
        self.started = 0.0
        self.cancelled = False

    def __enter__(self) -> StageTimer:
        self.started = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            return
        self.seconds += time.perf_counter() - self.started
        if not self.summed:
            self.observe()

    def add(self, seconds: float) -> None:
        """Add ``seconds`` (timed elsewhere, or negative: time not the stage's)."""
        self.seconds += seconds

    def cancel(self) -> None:
        """Observe nothing for this stage (e.g. a read that read nothing)."""
        self.cancelled = True

    def observe(self) -> None:
        """Observe the sum once (unless cancelled), and start again from zero."""
        if not self.cancelled:
            self.child.observe(self.seconds)
        self.seconds, self.cancelled = 0.0, False
