"""How far one model scales with workers and Redis shards, projected from measured costs.

The measure is CPU time per message, which a shared host does not move as it moves msg/s
(docs/performance.md, "Scaling past 2 cores"). For 1, 2 and 3 workers on one model
(:func:`benchmarks.end_to_end.run_e2e`, a private redis-server, the daemon's defaults),
``--trials`` rounds of the three interleaved, it measures over one window, from the first
output to the last: the workers' CPU per message (all of them: ``/proc/PID/stat``),
redis-server's (``INFO cpu``), the CPU per message inside the ordered section
(``streamnb_ordered_section_cpu_seconds_total``) and msg/s. Each figure of N workers is
the median of its trials (a run disturbed by the host's other processes moves a median
less than a mean or a least).

The forms, fitted by least squares on the medians of N = 1, 2 and 3 (each point's
residual printed, and checked within 20%):

- the workers' and redis-server's CPU grow linearly, ``c(N) = c1 + (N - 1) d``: every
  worker applies every other worker's deltas and reads them from the log;
- the ordered section's does not: from the end of a batch's wait to its commit sent it
  holds the batch's own work and, with other workers, the catch-up with what they
  committed since the wait last looked; a waiting worker applies the earlier batches'
  deltas during its wait, while their workers work, so 2 and 3 workers' sections are
  alike (as measured). So ``s(N) = s1 + a`` for any N >= 2, ``a`` the catch-up
  (:class:`Step`); a line through 1 and 3 would put 2 below the measured.

Throughput of one model is then the least of three bounds (a bottleneck, or Amdahl,
model; the workers' bound is the Universal Scalability Law's contention form, sigma =
d / c1 and kappa = 0)::

    workers           N / w(N)         N cores, one worker each
    Redis             K / r(N)         K shards, one core each (messages split K ways)
    ordered section   K / s(N)         ordered predictions only: one batch at a time per
                                       shard (a shard orders its own stream only;
                                       docs/architecture.md, "Past one shard")

The K-shard columns use the same forms fitted on a model in K shards
(``--shards K``, measured the same way on one redis-server: each worker applies every
shard's deltas and keeps their sum as well, so w(N) is higher; r(N) and s(N) are then
split K ways); ``--no-sharded-runs`` uses the one-shard costs there.

The ordered bound leaves out the commit's time in redis-server, which also lies between
two ordered batches: it is high by that much. On this host the measured msg/s are set by
the 2 shared cores; the check there is the accounting: the msg/s the fitted costs give
for the CPU the workers were given over the window, against the msg/s measured over the
same window (both of the run of median msg/s).

    python -m benchmarks.projection [--payloads tokens,raw] [--repeat 4] [--trials 3]
        [--shards 3] [--no-sharded-runs]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchmarks._common import (
    DEFAULT_CORPUS,
    Corpus,
    corpus_or_synthetic,
    format_table,
    print_header,
)
from benchmarks.end_to_end import E2EResult, RedisServer, repeated_messages, run_e2e

#: Cores (one worker each) of the projection table.
CORES = (4, 8, 16, 32, 64)
#: A fitted figure within this share of the measured one passes the check.
TOLERANCE = 0.20


def _least_squares(points: dict[int, float], x: Callable[[int], float]) -> tuple[float, float]:
    """(intercept, slope) of ``y = intercept + slope * x(N)`` by least squares.

    >>> _least_squares({1: 10.0, 2: 13.0, 3: 13.0}, lambda n: n - 1)
    (10.5, 1.5)
    """
    xs, ys = [x(n) for n in points], list(points.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((v - mx) ** 2 for v in xs)
    slope = sum((v - mx) * (y - my) for v, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - slope * mx, slope


@dataclass(frozen=True)
class Linear:
    """``c(N) = at1 + (N - 1) * per_worker``: a cost per message against workers N.

    >>> c = Linear.fit({1: 80.0, 2: 84.0, 3: 90.0})  # least squares: 5 us a worker
    >>> c.per_worker, round(c.at1, 2), round(c(2), 2), round(c(64), 2)
    (5.0, 79.67, 84.67, 394.67)
    """

    at1: float
    per_worker: float

    @classmethod
    def fit(cls, points: dict[int, float]) -> Linear:
        """By least squares through the costs measured with N workers (``{N: cost}``); a
        cost that fell is flat at their mean (noise, not a saving to project).

        >>> Linear.fit({1: 14.0, 2: 13.0, 3: 12.0})
        Linear(at1=13.0, per_worker=0.0)
        """
        at0, slope = _least_squares(points, lambda n: n - 1)
        if slope < 0:
            return cls(sum(points.values()) / len(points), 0.0)
        return cls(at0, slope)

    def __call__(self, n: int) -> float:
        return self.at1 + (n - 1) * self.per_worker


@dataclass(frozen=True)
class Step:
    """``s(N) = at1`` for one worker, ``at1 + catch_up`` for any more: the ordered
    section's CPU per message, whose only part that other workers add to is the catch-up
    with the delta committed last (module docstring).

    >>> s = Step.fit({1: 24.0, 2: 31.0, 3: 29.0})  # 24 alone; 30 with others, a mean
    >>> round(s.catch_up, 6), s(1), round(s(2), 6), round(s(64), 6)
    (6.0, 24.0, 30.0, 30.0)
    >>> Step.fit({1: 24.0, 2: 20.0, 3: 22.0})  # fell: flat at the mean
    Step(at1=22.0, catch_up=0.0)
    """

    at1: float
    catch_up: float

    @classmethod
    def fit(cls, points: dict[int, float]) -> Step:
        at1, step = _least_squares(points, lambda n: float(n > 1))
        if step < 0:
            return cls(sum(points.values()) / len(points), 0.0)
        return cls(at1, step)

    def __call__(self, n: int) -> float:
        return self.at1 + (self.catch_up if n > 1 else 0.0)


@dataclass(frozen=True)
class Costs:
    """Per-message costs of one model in us, fitted on 1, 2 and 3 workers: the workers'
    CPU (all of them), redis-server's CPU and the CPU inside the ordered section."""

    worker: Linear
    redis: Linear
    serial: Linear | Step

    @classmethod
    def fit(cls, measured: dict[int, Figures]) -> Costs:
        """From the figures measured with N workers (``{N: figures}``)."""
        return cls(Linear.fit({n: f.worker_us for n, f in measured.items()}),
                   Linear.fit({n: f.redis_us for n, f in measured.items()}),
                   Step.fit({n: f.section_us for n, f in measured.items()}))


@dataclass(frozen=True)
class Figures:
    """What one run of N workers measured over its window (or the medians of several):
    CPU us per message of the workers, redis-server and the ordered section, the order
    waits' CPU (inside the workers'), msg/s, and the workers' CPU in cores."""

    worker_us: float
    redis_us: float
    section_us: float
    wait_us: float
    per_second: float
    worker_cores: float

    @classmethod
    def of(cls, r: E2EResult) -> Figures:
        """A run's figures, all over its window (first output to last).

        >>> r = E2EResult("tokens", 2, 9_750, 9_000.0, 0, window_worker_cpu_us=120.0,
        ...               window_redis_cpu_us=18.0, window_messages=9_600, window_s=1.2)
        >>> f = Figures.of(r)
        >>> f.per_second, round(f.worker_cores, 3), f.section_us
        (8000.0, 0.96, nan)
        """
        cores = (r.window_worker_cpu_us * r.window_messages / 1e6 / r.window_s
                 if r.window_s > 0 else float("nan"))
        return cls(r.window_worker_cpu_us, r.window_redis_cpu_us, r.serial_cpu_us,
                   r.wait_cpu_us, r.window_per_second, cores)

    @classmethod
    def median(cls, runs: Sequence[Figures]) -> Figures:
        """Each CPU figure's median over runs (of one number of workers); msg/s and the
        workers' cores both of the run of median msg/s (the lower of two), so that the
        msg/s check pairs a run's rate with the CPU it was given.

        >>> a, b, c = (Figures(w, 18.0, 25.0, 0.0, 1e8 / w, 1.0 - w / 1e3)
        ...            for w in (110.0, 160.0, 115.0))
        >>> m = Figures.median([a, b, c])
        >>> m.worker_us, round(m.per_second), m.worker_cores  # c's rate and cores
        (115.0, 869565, 0.885)
        """
        paired = sorted(runs, key=lambda f: f.per_second)[(len(runs) - 1) // 2]
        return cls(*(statistics.median(getattr(f, k) for f in runs) for k in FIELDS[:4]),
                   paired.per_second, paired.worker_cores)


FIELDS = ("worker_us", "redis_us", "section_us", "wait_us", "per_second", "worker_cores")


@dataclass(frozen=True)
class Bound:
    """Messages/s of one model, and which bound sets it."""

    per_second: float
    binding: str


def throughput(c: Costs, workers: int, shards: int = 1, ordered: bool = True,
               worker_cores: float | None = None) -> Bound:
    """The least of the bounds (module docstring) with ``workers`` workers on
    ``worker_cores`` cores (default: one each) and ``shards`` Redis shards of a core each.

    >>> c = Costs(Linear(80.0, 5.0), Linear(12.0, 1.0), Linear(20.0, 0.0))
    >>> throughput(c, 1)  # 1 / 80 us
    Bound(per_second=12500.0, binding='workers')
    >>> throughput(c, 8)  # 8 / 115 us = 69,565, Redis 1 / 19 us = 52,632, section 50,000
    Bound(per_second=50000.0, binding='ordered section')
    >>> throughput(c, 8, ordered=False)
    Bound(per_second=52631.57894736842, binding='Redis shard')
    >>> throughput(c, 8, shards=2, ordered=False).binding
    'workers'
    >>> throughput(c, 8, shards=2).binding  # 2 / 20 us: the sections of 2 shards overlap
    'workers'
    """
    cores = float(workers) if worker_cores is None else worker_cores
    bounds = {"workers": 1e6 * cores / c.worker(workers),
              "Redis shard": 1e6 * shards / c.redis(workers) if c.redis(workers) > 0 else math.inf}
    if ordered and c.serial(workers) > 0:
        bounds["ordered section"] = 1e6 * shards / c.serial(workers)
    binding = min(bounds, key=bounds.__getitem__)
    return Bound(bounds[binding], binding)


def peak(c: Costs, shards: int = 1, ordered: bool = True, most: int = 64) -> tuple[int, Bound]:
    """The number of workers (1 to ``most``, a core each) that gives one model the most
    msg/s, and that throughput: where adding workers stops paying.

    >>> c = Costs(Linear(80.0, 5.0), Linear(12.0, 1.0), Linear(20.0, 0.0))
    >>> peak(c, ordered=False)  # 6: 6 / 105 us < Redis 1 / 17 us; 7: Redis 1 / 18 us
    (6, Bound(per_second=57142.857142857145, binding='workers'))
    """
    best = max(range(1, most + 1), key=lambda n: throughput(c, n, shards, ordered).per_second)
    return best, throughput(c, best, shards, ordered)


def within(predicted: float, measured: float) -> str:
    """``predicted / measured`` as a percentage difference.

    >>> within(110.0, 100.0), within(80.0, 100.0)
    ('+10%', '-20%')
    """
    if not measured or math.isnan(measured) or math.isnan(predicted):
        return "nan"
    return f"{predicted / measured - 1:+.0%}"


def off(predicted: float, measured: float, tolerance: float = TOLERANCE) -> bool:
    """Whether ``predicted`` misses ``measured`` by more than ``tolerance`` (or either is
    unknown).

    >>> off(119.0, 100.0), off(79.0, 100.0), off(80.0, 100.0), off(float("nan"), 1.0)
    (False, True, False, True)
    """
    if not measured or math.isnan(measured) or math.isnan(predicted):
        return True
    return abs(predicted / measured - 1) > tolerance + 1e-9


def from_costs(c: Costs, n: int, worker_cores: float) -> float:
    """Msg/s the fitted costs give ``n`` workers on the CPU they were given (in cores),
    with a core for redis-server and the ordered section's bound.

    >>> c = Costs(Linear(100.0, 10.0), Linear(15.0, 1.0), Step(25.0, 5.0))
    >>> from_costs(c, 2, 1.1)  # 1.1 cores / 110 us
    10000.0
    """
    return throughput(c, n, worker_cores=worker_cores).per_second


def check_rows(payload: str, c: Costs, measured: dict[int, Figures],
               ) -> tuple[list[list[object]], list[str]]:
    """Measured (medians) against fitted, per number of workers: the three costs, and
    msg/s for the CPU the workers were given; and the figures off by more than
    :data:`TOLERANCE`.

    >>> m = {1: Figures(100.0, 15.0, 25.0, 0.0, 9_000.0, 0.9),
    ...      2: Figures(110.0, 16.0, 26.0, 1.0, 11_000.0, 1.2),
    ...      3: Figures(120.0, 17.0, 40.0, 2.0, 10_000.0, 1.2)}
    >>> rows, misses = check_rows("tokens", Costs.fit(m), m)  # section 25, then 33
    >>> rows[1][3:5], misses
    ([110.0, '+0%'], ['tokens 2w section CPU +27%'])
    """
    rows: list[list[object]] = []
    misses: list[str] = []
    for n, f in sorted(measured.items()):
        rate = from_costs(c, n, f.worker_cores)
        pairs = [("workers' CPU", f.worker_us, c.worker(n)), ("redis-server CPU", f.redis_us,
                 c.redis(n)), ("section CPU", f.section_us, c.serial(n)),
                 ("msg/s", f.per_second, rate)]
        row: list[object] = [payload, n]
        for name, got, fitted in pairs:
            row += [got, fitted, within(fitted, got)]
            if off(fitted, got):
                misses.append(f"{payload} {n}w {name} {within(fitted, got)}")
        rows.append(row[:11] + [f.wait_us, f"{f.worker_cores:.2f}"] + row[11:])
    return rows, misses


CHECK_HEADER = ["payload", "workers", "workers' CPU us/msg", "fitted", "diff",
                "redis-server us/msg", "fitted", "diff", "section CPU us/msg", "fitted", "diff",
                "wait CPU us/msg", "worker cores given", "msg/s measured",
                "msg/s from the costs", "diff"]


def holdout(payload: str, measured: dict[int, Figures]) -> str:
    """The costs fitted on 1 and 3 workers alone, against 2 workers' measured: the fit's
    forms checked out of sample (the section's step is then 3 workers' figure).

    >>> m = {1: Figures(100.0, 15.0, 25.0, 0.0, 9_000.0, 0.9),
    ...      2: Figures(110.0, 16.0, 30.0, 1.0, 11_000.0, 1.2),
    ...      3: Figures(124.0, 17.0, 33.0, 2.0, 10_000.0, 1.2)}
    >>> holdout("tokens", m)
    'tokens, fitted on 1 and 3 workers only, at 2: workers +2%, redis-server +0%, section +10%'
    """
    if not {1, 2, 3} <= measured.keys():
        return f"{payload}: no 1, 2 and 3 workers to check out of sample"
    c = Costs.fit({n: measured[n] for n in (1, 3)})
    two = measured[2]
    return (f"{payload}, fitted on 1 and 3 workers only, at 2: workers "
            f"{within(c.worker(2), two.worker_us)}, redis-server {within(c.redis(2), two.redis_us)}, "
            f"section {within(c.serial(2), two.section_us)}")


def verdict(misses: Sequence[str], checked: int, tolerance: float = TOLERANCE) -> str:
    """The last line: whether every checked figure is within ``tolerance``, which not.

    >>> verdict([], 24)
    'all 24 checked figures within 20% of the measured'
    >>> verdict(["raw 2w msg/s -25%"], 24)
    '1 of 24 checked figures not within 20%: raw 2w msg/s -25%'
    """
    if not misses:
        return f"all {checked} checked figures within {tolerance:.0%} of the measured"
    return (f"{len(misses)} of {checked} checked figures not within {tolerance:.0%}: "
            + ", ".join(misses))


def projection_rows(payload: str, c: Costs, shards: int, sharded: Costs | None = None,
                    cores: Sequence[int] = CORES) -> list[list[object]]:
    """Per number of cores (one worker each; Redis shards on cores of their own): msg/s
    and the binding bound, ordered and unordered, with 1 and ``shards`` shards (with the
    costs measured on a model in that many shards, ``sharded``, if given)."""
    rows: list[list[object]] = []
    for n in cores:
        row: list[object] = [payload, n]
        for ordered in (True, False):
            for k in (1, shards):
                b = throughput(c if k == 1 or sharded is None else sharded, n, k, ordered)
                row.append(f"{b.per_second:,.0f} ({b.binding})")
        rows.append(row)
    return rows


def projection_header(shards: int) -> list[str]:
    return ["payload", "cores", "ordered, 1 shard", f"ordered, {shards} shards",
            "unordered, 1 shard", f"unordered, {shards} shards"]


def measure(corpus: Corpus, payload: str, repeat: int, trials: int = 3,
            worker_counts: Sequence[int] = (1, 2, 3), shards: int = 1,
            ) -> dict[int, list[tuple[E2EResult, float]]]:
    """End-to-end runs per number of workers (defaults: ordered predictions), ``trials``
    rounds of 1, 2, 3 interleaved; every run, with the host's 1-minute load average when
    it started. ``shards``: the model in that many statistics shards."""
    msgs = repeated_messages(corpus, payload, repeat)
    runs: dict[int, list[tuple[E2EResult, float]]] = {}
    with RedisServer() as server:
        for t in range(trials):
            for n in worker_counts:
                load = os.getloadavg()[0]
                r = run_e2e(server, f"proj-{payload}-{n}w-{t}-k{shards}", msgs, n, payload,
                            shards=shards)
                server.client().flushdb()
                runs.setdefault(n, []).append((r, load))
    return runs


def trial_rows(payload: str, runs: dict[int, list[tuple[E2EResult, float]]]) -> list[list[object]]:
    """Every run's figures, trial by trial: the spread behind the medians.

    >>> r = E2EResult("raw", 2, 9_750, 9_000.0, 0, window_worker_cpu_us=120.0,
    ...               window_redis_cpu_us=18.0, window_messages=9_600, window_s=1.2)
    >>> trial_rows("raw", {2: [(r, 2.5)]})[0][:8]
    ['raw', 2, 0, '2.5', 9600, '1.20', 120.0, 18.0]
    """
    rows: list[list[object]] = []
    for n, rs in sorted(runs.items()):
        for t, (r, load) in enumerate(rs):
            f = Figures.of(r)
            rows.append([payload, n, t, f"{load:.1f}", r.window_messages, f"{r.window_s:.2f}",
                         f.worker_us, f.redis_us, f.section_us, f.wait_us,
                         f"{f.worker_cores:.2f}", f.per_second, r.per_second,
                         f"{r.worker_runqueue:.0%}",
                         f"{r.host_idle:.0%}"])
    return rows


TRIAL_HEADER = ["payload", "workers", "trial", "load", "messages in window", "window s",
                "workers' CPU us/msg", "redis-server", "section CPU", "wait CPU",
                "worker cores", "msg/s", "msg/s, steady window", "run-queue wait", "host idle"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None, help="first N corpus messages only")
    ap.add_argument("--payloads", default="tokens,raw")
    ap.add_argument("--repeat", type=int, default=4, help="passes over the corpus (tokens)")
    ap.add_argument("--raw-repeat", type=int, default=3, help="passes over the corpus (raw)")
    ap.add_argument("--shards", type=int, default=3, help="K of the K-shard columns")
    ap.add_argument("--sharded-runs", action=argparse.BooleanOptionalAction, default=True,
                    help="measure the K-shard columns' costs on a model in K shards (else "
                    "they use the one-shard costs)")
    ap.add_argument("--trials", type=int, default=3,
                    help="rounds of 1, 2, 3 workers; each figure is the median of its runs")
    args = ap.parse_args(argv)
    if args.shards < 1 or args.trials < 1:
        print("--shards and --trials must be >= 1", file=sys.stderr)
        return 2
    print_header("projection: one model against workers and Redis shards, from measured costs",
                 "benchmarks.projection", argv)
    corpus = corpus_or_synthetic(args.corpus, args.limit)
    trials: list[list[object]] = []
    checks: list[list[object]] = []
    misses: list[str] = []
    table: list[list[object]] = []
    fits = []
    outside: list[str] = []
    peaks: list[str] = []
    loads = [os.getloadavg()]
    for payload in args.payloads.split(","):
        repeat = args.raw_repeat if payload == "raw" else args.repeat
        costs: dict[int, Costs] = {}
        for k in (1, args.shards) if args.sharded_runs and args.shards > 1 else (1,):
            runs = measure(corpus, payload, repeat, args.trials, shards=k)
            loads.append(os.getloadavg())
            measured = {n: Figures.median([Figures.of(r) for r, _ in rs])
                        for n, rs in runs.items()}
            label = payload if k == 1 else f"{payload}, {k} shards"
            c = costs[k] = Costs.fit(measured)
            outside.append(holdout(label, measured))
            fits.append(f"{label}: workers {c.worker.at1:.1f} + {c.worker.per_worker:.2f} "
                        f"(N-1) us/msg; redis-server {c.redis.at1:.1f} + "
                        f"{c.redis.per_worker:.2f} (N-1); ordered section {c.serial(1):.1f}, "
                        f"{c.serial(2):.1f} from 2 workers on")
            trials += trial_rows(label, runs)
            rows, missed = check_rows(label, c, measured)
            checks += rows
            misses += missed
        table += projection_rows(payload, costs[1], args.shards, costs.get(args.shards))
        for ordered in (True, False):
            for k in (1, args.shards):
                n, b = peak(costs.get(k, costs[1]), k, ordered)
                peaks.append(f"{payload}, {'ordered' if ordered else 'unordered'}, {k} shard(s): "
                             f"{b.per_second:,.0f} msg/s at {n} workers ({b.binding})")
    print("host load (1, 5, 15 min) at the start and after each payload: "
          + "; ".join(" ".join(f"{x:.2f}" for x in la) for la in loads))
    print()
    print("every run, over its window (first output to last; CPU us a message)")
    print(format_table(TRIAL_HEADER, trials))
    print()
    print("costs fitted by least squares on the medians of 1, 2 and 3 workers (CPU us per "
          "message, N workers):")
    for line in fits:
        print("  " + line)
    print()
    print("measured (medians of the runs above) against the fit; msg/s from the costs for the "
          "CPU the workers were given over the same window")
    print(format_table(CHECK_HEADER, checks))
    for line in outside:
        print(line)
    print()
    print("projected msg/s of one model, one worker per core, each Redis shard on a core of "
          "its own (the bound that sets it in brackets)")
    print(format_table(projection_header(args.shards), table))
    print()
    print("the most one model reaches, and with how many workers (1-64, a core each):")
    for line in peaks:
        print("  " + line)
    print()
    print(verdict(misses, 4 * len(checks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
