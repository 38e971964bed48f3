"""How far one model scales with workers and Redis shards, projected from measured costs.

The measure is CPU time per message, which a shared host does not move as it moves msg/s
(docs/performance.md, "Scaling past 2 cores"). For 1, 2 and 3 workers on one model
(:func:`benchmarks.end_to_end.run_e2e`, a private redis-server, the daemon's defaults)
it measures, from the first output on: the workers' CPU per message (all of them:
``/proc/PID/stat``), redis-server's (``INFO cpu``) and the CPU per message inside the
ordered section (``streamnb_ordered_section_cpu_seconds_total``). Each grows about
linearly with the number of workers N (every worker applies every other's deltas and
reads the log), so each is fitted as ``c(N) = c1 + (N - 1) d`` on N = 1 and N = 3,
and the figures for N = 2 are a prediction checked against the run.

Throughput of one model is then the least of three bounds (a bottleneck, or Amdahl,
model; the workers' bound is the Universal Scalability Law's contention form, sigma =
d / c1 and kappa = 0)::

    workers           N / w(N)         N cores, one worker each
    Redis             K / r(N)         K shards, one core each (messages split K ways)
    ordered section   K / s(N)         ordered predictions only: one batch at a time per
                                       shard (a shard orders its own stream only;
                                       docs/architecture.md, "Past one shard")

On this host the measured msg/s are set by the 2 shared cores; the check there is the
accounting: the msg/s the fitted costs give for the cores the run was given (its workers'
and redis-server's CPU cores) against the msg/s measured.

    python -m benchmarks.projection [--payloads tokens,raw] [--repeat 2] [--shards 3]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
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


@dataclass(frozen=True)
class Linear:
    """``c(N) = at1 + (N - 1) * per_worker``: a cost per message against workers N.

    >>> c = Linear.fit(80.0, 90.0)  # 80 us with 1 worker, 90 with 3
    >>> c.per_worker, c(2), c(64)
    (5.0, 85.0, 395.0)
    """

    at1: float
    per_worker: float

    @classmethod
    def fit(cls, at1: float, at3: float) -> Linear:
        """Through the costs measured with 1 and 3 workers; a cost that fell is flat
        (noise, not a saving to project)."""
        return cls(at1, max(0.0, (at3 - at1) / 2.0))

    def __call__(self, n: int) -> float:
        return self.at1 + (n - 1) * self.per_worker


@dataclass(frozen=True)
class Costs:
    """Per-message costs of one model in us, fitted on 1 and 3 workers: the workers' CPU
    (all of them), redis-server's CPU and the CPU inside the ordered section."""

    worker: Linear
    redis: Linear
    serial: Linear

    @classmethod
    def fit(cls, one: E2EResult, three: E2EResult) -> Costs:
        return cls(Linear.fit(one.window_worker_cpu_us, three.window_worker_cpu_us),
                   Linear.fit(one.window_redis_cpu_us, three.window_redis_cpu_us),
                   Linear.fit(one.serial_cpu_us, three.serial_cpu_us))


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


def check_rows(payload: str, c: Costs, runs: dict[int, E2EResult]) -> list[list[object]]:
    """Measured against fitted, per number of workers: the three costs, and msg/s for the
    cores the run was given."""
    rows: list[list[object]] = []
    for n, r in sorted(runs.items()):
        given = throughput(c, n, worker_cores=r.worker_cores)
        host = min(given.per_second, 1e6 * r.redis_cores / c.redis(n)
                   if r.redis_cores > 0 and c.redis(n) > 0 else math.inf)
        rows.append([payload, n, r.window_worker_cpu_us, c.worker(n),
                     within(c.worker(n), r.window_worker_cpu_us),
                     r.window_redis_cpu_us, c.redis(n), within(c.redis(n), r.window_redis_cpu_us),
                     r.serial_cpu_us, c.serial(n), within(c.serial(n), r.serial_cpu_us),
                     f"{r.worker_cores:.2f}", r.per_second, host, within(host, r.per_second)])
    return rows


CHECK_HEADER = ["payload", "workers", "workers' CPU us/msg", "fitted", "diff",
                "redis-server us/msg", "fitted", "diff", "section CPU us/msg", "fitted", "diff",
                "worker cores given", "msg/s measured", "msg/s from the costs", "diff"]


def projection_rows(payload: str, c: Costs, shards: int,
                    cores: Sequence[int] = CORES) -> list[list[object]]:
    """Per number of cores (one worker each; Redis shards on cores of their own): msg/s
    and the binding bound, ordered and unordered, with 1 and ``shards`` shards."""
    rows: list[list[object]] = []
    for n in cores:
        row: list[object] = [payload, n]
        for ordered in (True, False):
            for k in (1, shards):
                b = throughput(c, n, k, ordered)
                row.append(f"{b.per_second:,.0f} ({b.binding})")
        rows.append(row)
    return rows


def projection_header(shards: int) -> list[str]:
    return ["payload", "cores", "ordered, 1 shard", f"ordered, {shards} shards",
            "unordered, 1 shard", f"unordered, {shards} shards"]


def measure(corpus: Corpus, payload: str, repeat: int, trials: int = 2,
            worker_counts: Sequence[int] = (1, 2, 3)) -> dict[int, E2EResult]:
    """End-to-end runs per number of workers (defaults: ordered predictions), ``trials``
    of each interleaved; of each number of workers the run with the least CPU per message
    is kept (the least disturbed by the host's other processes, which make a process's
    CPU per message grow: shared caches, a busier memory bus)."""
    msgs = repeated_messages(corpus, payload, repeat)
    runs: dict[int, E2EResult] = {}
    with RedisServer() as server:
        for t in range(trials):
            for n in worker_counts:
                r = run_e2e(server, f"proj-{payload}-{n}w-{t}", msgs, n, payload)
                server.client().flushdb()
                if n not in runs or r.window_worker_cpu_us < runs[n].window_worker_cpu_us:
                    runs[n] = r
    return runs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None, help="first N corpus messages only")
    ap.add_argument("--payloads", default="tokens,raw")
    ap.add_argument("--repeat", type=int, default=2, help="passes over the corpus (tokens)")
    ap.add_argument("--raw-repeat", type=int, default=1, help="passes over the corpus (raw)")
    ap.add_argument("--shards", type=int, default=3, help="K of the K-shard columns")
    ap.add_argument("--trials", type=int, default=2,
                    help="runs of each number of workers; the least CPU per message is kept")
    args = ap.parse_args(argv)
    if args.shards < 1 or args.trials < 1:
        print("--shards and --trials must be >= 1", file=sys.stderr)
        return 2
    print_header("projection: one model against workers and Redis shards, from measured costs",
                 "benchmarks.projection", argv)
    corpus = corpus_or_synthetic(args.corpus, args.limit)
    checks: list[list[object]] = []
    table: list[list[object]] = []
    fits = []
    peaks: list[str] = []
    for payload in args.payloads.split(","):
        runs = measure(corpus, payload, args.raw_repeat if payload == "raw" else args.repeat,
                       args.trials)
        c = Costs.fit(runs[1], runs[3])
        fits.append(f"{payload}: workers {c.worker.at1:.1f} + {c.worker.per_worker:.2f} (N-1) "
                    f"us/msg; redis-server {c.redis.at1:.1f} + {c.redis.per_worker:.2f} (N-1); "
                    f"ordered section {c.serial.at1:.1f} + {c.serial.per_worker:.2f} (N-1)")
        checks += check_rows(payload, c, runs)
        table += projection_rows(payload, c, args.shards)
        for ordered in (True, False):
            for k in (1, args.shards):
                n, b = peak(c, k, ordered)
                peaks.append(f"{payload}, {'ordered' if ordered else 'unordered'}, {k} shard(s): "
                             f"{b.per_second:,.0f} msg/s at {n} workers ({b.binding})")
    print("costs fitted on 1 and 3 workers (CPU us per message, N workers):")
    for line in fits:
        print("  " + line)
    print()
    print("measured (1-3 workers, this host) against the fit; msg/s from the costs for the "
          "worker and redis-server cores each run was given")
    print(format_table(CHECK_HEADER, checks))
    print()
    print("projected msg/s of one model, one worker per core, each Redis shard on a core of "
          "its own (the bound that sets it in brackets)")
    print(format_table(projection_header(args.shards), table))
    print()
    print("the most one model reaches, and with how many workers (1-64, a core each):")
    for line in peaks:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
