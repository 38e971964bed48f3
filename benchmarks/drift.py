"""Drift detectors on synthetic streams with a known change point, next to River's.

For each stream: mean detection delay (samples from the change to the first alarm, over
``--runs`` seeded runs; a run with no alarm within ``--after`` samples counts as missed) and
false alarms per 100,000 stable samples (one long stable stream per detector, no cool-down).

Streams (the issue's): 0/1 error rate 5% -> 25%; Gaussian mean shift of one standard
deviation N(0, 1) -> N(1, 1); class share 15% -> 50% (the indicator of the minority class).

Reproduce: ``python benchmarks/drift.py`` (about a minute; ``--runs 50`` for tighter figures);
``--cost-only`` prints only what updates cost (per detector in bulk, and the observer).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np

from streamnb.drift import ADWIN, GaussianDrift, PageHinkley, PriorShift

try:
    from river import drift as river_drift
except ImportError:  # pragma: no cover
    river_drift = None

Factory = Callable[[], Callable[[float], bool]]


def ours(det) -> Callable[[float], bool]:
    return det.update


def river(det) -> Callable[[float], bool]:
    def step(x: float) -> bool:
        det.update(x)
        return det.drift_detected
    return step


def run_delay(make: Factory, draw: Callable[[np.random.Generator, int, bool], np.ndarray],
              runs: int, before: int, after: int) -> tuple[float, int, int]:
    """Mean delay over detected runs, missed runs, alarms before the change (all runs)."""
    delays, missed, early = [], 0, 0
    for seed in range(runs):
        rng = np.random.default_rng(1000 + seed)
        xs = np.concatenate([draw(rng, before, False), draw(rng, after, True)])
        step = make()
        first = None
        for i, x in enumerate(xs.tolist()):
            if step(x):
                if i < before:
                    early += 1
                elif first is None:
                    first = i - before
                    break
        if first is None:
            missed += 1
        else:
            delays.append(first)
    return (float(np.mean(delays)) if delays else float("nan")), missed, early


def run_false_alarms(make: Factory, draw, n: int) -> tuple[float, float]:
    """False alarms per 100,000 stable samples, and microseconds per update."""
    xs = draw(np.random.default_rng(7), n, False).tolist()
    step = make()
    t0 = time.perf_counter()
    alarms = sum(1 for x in xs if step(x))
    us = (time.perf_counter() - t0) / n * 1e6
    return alarms * 100_000 / n, us


def error_stream(rng, n, changed):
    return (rng.random(n) < (0.25 if changed else 0.05)).astype(float)


def gaussian_stream(rng, n, changed):
    return rng.normal(1.0 if changed else 0.0, 1.0, n)


def share_stream(rng, n, changed):
    return (rng.random(n) < (0.5 if changed else 0.15)).astype(float)


def observer_cost(batches: int = 300) -> float:
    """Microseconds per labelled message of ModelObserver's two per-batch hooks."""
    from prometheus_client import CollectorRegistry

    from streamnb_workers.observe.metrics import Metrics
    from streamnb_workers.observe.observer import ModelObserver

    obs = ModelObserver(Metrics(CollectorRegistry()), "bench", "w1")
    rng = np.random.default_rng(0)
    p = rng.uniform(0.01, 0.99, (100, 1))
    lp = np.log(np.hstack([p, 1 - p]))
    truth = np.where(rng.random(100) < 0.3, "spam", "ham").tolist()
    oov, ages, unsure = rng.uniform(0, 0.2, 100), rng.uniform(0, 1, 100), rng.random(100) < 0.05
    t0 = time.perf_counter()
    for _ in range(batches):
        obs.observe_predictions(["ham", "spam"], lp, oov, ages, unsure)
        obs.score_labelled(["ham", "spam"], lp, truth)
    return (time.perf_counter() - t0) / (batches * 100) * 1e6


def bulk_update_cost(n: int = 100_000, batch: int = 100, repeats: int = 5) -> dict[str, float]:
    """Microseconds per value of each detector's ``update_many`` as the worker calls it
    (batches of ``batch``), best of ``repeats``, on streams like the worker's: 0/1 errors
    at 3% (ADWIN), clipped log-losses (PageHinkley, the observer's settings), ham/spam labels
    at 15% spam (PriorShift), unseen-token shares in [0, 0.3] (TokenDrift)."""
    from streamnb.drift import TokenDrift

    rng = np.random.default_rng(0)
    streams = {
        "ADWIN": (lambda: ADWIN(direction="increase"), (rng.random(n) < 0.03).astype(float).tolist()),
        "PageHinkley": (lambda: PageHinkley(delta=0.05, threshold=100.0, clip=4.6, alpha=1.0),
                        np.minimum(rng.exponential(0.3, n), 30.0).tolist()),
        "PriorShift": (PriorShift, np.where(rng.random(n) < 0.15, "spam", "ham").tolist()),
        "TokenDrift": (TokenDrift, rng.uniform(0.0, 0.3, n).tolist()),
    }
    out = {}
    for name, (make, values) in streams.items():
        best = float("inf")
        for _ in range(repeats):
            det = make()
            t0 = time.perf_counter()
            for i in range(0, n, batch):
                det.update_many(values[i:i + batch])
            best = min(best, time.perf_counter() - t0)
        out[name] = best / n * 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--before", type=int, default=5000, help="stable samples before the change")
    ap.add_argument("--after", type=int, default=3000, help="samples after the change")
    ap.add_argument("--stable", type=int, default=100_000, help="stable samples for false alarms")
    ap.add_argument("--cost-only", action="store_true",
                    help="only the update costs (bulk updates per detector, the observer)")
    args = ap.parse_args(argv)
    if args.cost_only:
        for name, us in bulk_update_cost().items():
            print(f"{name} update_many, batches of 100: {us:.2f} us per value")
        print(f"ModelObserver (all five detectors + metrics), batches of 100 labelled messages: "
              f"{observer_cost():.1f} us per message")
        return 0
    if river_drift is None:
        print("river is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 1

    cases: list[tuple[str, Callable, list[tuple[str, Factory]]]] = [
        ("error 5% -> 25%", error_stream, [
            ("streamnb ADWIN", lambda: ours(ADWIN(cooldown=0))),
            ("streamnb PageHinkley", lambda: ours(PageHinkley(cooldown=0))),
            ("river ADWIN", lambda: river(river_drift.ADWIN())),
            ("river PageHinkley", lambda: river(river_drift.PageHinkley())),
        ]),
        ("gaussian mean +1 sd", gaussian_stream, [
            ("streamnb GaussianDrift", lambda: (lambda d: lambda x: d.update((x,), 0))(
                GaussianDrift(cooldown=0))),
            ("streamnb ADWIN", lambda: ours(ADWIN(cooldown=0))),
            ("streamnb PageHinkley", lambda: ours(PageHinkley(cooldown=0))),
            ("river ADWIN", lambda: river(river_drift.ADWIN())),
            ("river PageHinkley", lambda: river(river_drift.PageHinkley())),
        ]),
        ("class share 15% -> 50%", share_stream, [
            ("streamnb PriorShift", lambda: ours(PriorShift(cooldown=0))),
            ("streamnb ADWIN", lambda: ours(ADWIN(cooldown=0))),
            ("river ADWIN", lambda: river(river_drift.ADWIN())),
            ("river PageHinkley", lambda: river(river_drift.PageHinkley())),
        ]),
    ]
    print(f"# python benchmarks/drift.py --runs {args.runs} --before {args.before} "
          f"--after {args.after} --stable {args.stable}")
    print(f"{'stream':<24} {'detector':<24} {'delay':>8} {'missed':>7} {'early':>6} "
          f"{'FA/100k':>8} {'us/upd':>7}")
    for stream, draw, detectors in cases:
        for name, make in detectors:
            delay, missed, early = run_delay(make, draw, args.runs, args.before, args.after)
            fa, us = run_false_alarms(make, draw, args.stable)
            print(f"{stream:<24} {name:<24} {delay:8.1f} {missed:7d} {early:6d} {fa:8.1f} {us:7.2f}")
    print(f"ModelObserver (all five detectors + metrics), batches of 100 labelled messages: "
          f"{observer_cost():.1f} us per message")
    print("delay: mean samples from the change to the first alarm over the runs that detected it;"
          f" missed: runs without an alarm within {args.after} samples; early: alarms before the "
          "change (all runs); FA/100k: alarms on a stable stream, per 100,000 samples.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
