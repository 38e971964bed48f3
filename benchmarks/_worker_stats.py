"""What a worker process says about its ordered section, read from its Prometheus
endpoint (``python -m streamnb_workers.worker --metrics-port``) at the start and the end of
a measured window.

The worker times, per labelled batch, the wait for other workers' earlier labelled
batches (``streamnb_order_wait_seconds``, observed when a batch had to wait) and the
ordered section after it (``streamnb_ordered_section_seconds``: from the end of the wait
to the commit sent or committed), with ``time.perf_counter()`` around code that runs
anyway: two clock reads a batch.

>>> a = OrderingStats(wait_s=0.5, section_s=1.0, batches=10, apply_s=0.25)
>>> b = OrderingStats(wait_s=0.75, section_s=1.5, batches=20, apply_s=0.5)
>>> d = b - a
>>> d.batches, d.section_ms, d.wait_ms, d.apply_ms
(10, 50.0, 25.0, 25.0)
>>> (OrderingStats() + d).batches
10
>>> OrderingStats().section_ms
nan
"""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Iterable
from dataclasses import astuple, dataclass

__all__ = ["OrderingStats", "metrics_port", "parse_ordering", "scrape"]

FLAG = "--metrics-port"


@dataclass(frozen=True)
class OrderingStats:
    """Cumulative seconds of one or more workers: waiting for earlier batches, inside the
    ordered section, applying the log; and the labelled batches that took the section."""

    wait_s: float = 0.0
    section_s: float = 0.0
    batches: int = 0
    apply_s: float = 0.0
    #: The CPU time of the worker's thread inside the section (less descheduled time).
    section_cpu_s: float = 0.0
    #: The CPU time of the worker's thread in its waits (polls, deltas applied).
    wait_cpu_s: float = 0.0

    def __add__(self, other: OrderingStats) -> OrderingStats:
        return OrderingStats(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __sub__(self, other: OrderingStats) -> OrderingStats:
        return OrderingStats(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def _per_batch_ms(self, seconds: float) -> float:
        return 1e3 * seconds / self.batches if self.batches > 0 else float("nan")

    @property
    def section_ms(self) -> float:
        """Milliseconds per labelled batch inside the ordered section (wait excluded)."""
        return self._per_batch_ms(self.section_s)

    @property
    def section_cpu_ms(self) -> float:
        """Milliseconds of CPU per labelled batch inside the ordered section."""
        return self._per_batch_ms(self.section_cpu_s)

    @property
    def wait_ms(self) -> float:
        """Milliseconds per labelled batch waiting for other workers' earlier batches."""
        return self._per_batch_ms(self.wait_s)

    @property
    def apply_ms(self) -> float:
        """Milliseconds per labelled batch applying the log (inside the wait or not)."""
        return self._per_batch_ms(self.apply_s)


def metrics_port(proc: subprocess.Popen) -> int | None:
    """The ``--metrics-port`` a worker process was started with (None: none)."""
    args = [str(a) for a in proc.args] if isinstance(proc.args, list | tuple) else []
    if FLAG in args[:-1]:
        port = int(args[args.index(FLAG) + 1])
        return port or None
    return None


def parse_ordering(text: str) -> OrderingStats:
    """The sums of a Prometheus text exposition's ordering families, over every label set.

    >>> parse_ordering('''
    ... streamnb_order_wait_seconds_sum{model="m",worker="a"} 0.5
    ... streamnb_ordered_section_seconds_sum{model="m",worker="a"} 2.0
    ... streamnb_ordered_section_seconds_count{model="m",worker="a"} 8.0
    ... streamnb_stage_duration_seconds_sum{model="m",stage="apply",worker="a"} 0.25
    ... streamnb_stage_duration_seconds_sum{model="m",stage="predict",worker="a"} 9.0
    ... streamnb_ordered_section_cpu_seconds_total{model="m",worker="a"} 1.5
    ... streamnb_order_wait_cpu_seconds_total{model="m",worker="a"} 0.125
    ... ''')  # doctest: +NORMALIZE_WHITESPACE
    OrderingStats(wait_s=0.5, section_s=2.0, batches=8, apply_s=0.25, section_cpu_s=1.5,
                  wait_cpu_s=0.125)
    """
    from prometheus_client.parser import text_string_to_metric_families

    sums = {"wait": 0.0, "section": 0.0, "batches": 0.0, "apply": 0.0, "cpu": 0.0,
            "wait_cpu": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "streamnb_order_wait_seconds_sum":
                sums["wait"] += s.value
            elif s.name == "streamnb_ordered_section_seconds_sum":
                sums["section"] += s.value
            elif s.name == "streamnb_ordered_section_seconds_count":
                sums["batches"] += s.value
            elif s.name == "streamnb_ordered_section_cpu_seconds_total":
                sums["cpu"] += s.value
            elif s.name == "streamnb_order_wait_cpu_seconds_total":
                sums["wait_cpu"] += s.value
            elif (s.name == "streamnb_stage_duration_seconds_sum"
                  and s.labels.get("stage") == "apply"):
                sums["apply"] += s.value
    return OrderingStats(sums["wait"], sums["section"], int(sums["batches"]), sums["apply"],
                         sums["cpu"], sums["wait_cpu"])


def scrape(procs: Iterable[subprocess.Popen], timeout_s: float = 5.0) -> OrderingStats | None:
    """The workers' :class:`OrderingStats` added up; None if one has no endpoint or does
    not answer (the columns then read nan)."""
    total = OrderingStats()
    for proc in procs:
        port = metrics_port(proc)
        if port is None:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                        timeout=timeout_s) as resp:
                total = total + parse_ordering(resp.read().decode())
        except OSError:
            return None
    return total

