"""Benchmark 2: GaussianNB, LDA and QDA test-then-train vectors/s next to River's GaussianNB.

Synthetic data (three classes, Gaussian clusters with different covariances) at
d = 10, 30, 100, and scikit-learn's bundled breast_cancer (d = 30, 569 rows, replayed
with a little noise up to ``--n`` rows). streamnb models predict a batch, then learn
it (batches of 1 and 100); River's ``GaussianNB`` does ``predict_one`` + ``learn_one``
on ``{index: value}`` dicts in the same run. Each run stops after ``--cap`` seconds. The
process runs with one BLAS thread, as a worker does (it restarts itself with the
variables of :func:`streamnb_workers.cli.launch.blas_env` where they are not set).

    python -m benchmarks.gaussian_throughput [--n 20000] [--dims 10,30,100] [--cap 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

import numpy as np

from benchmarks._common import format_table, print_header, rate
from streamnb_workers.cli.launch import blas_env

KINDS = ("gaussian", "lda", "qda")


def synthetic(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """Three classes with distinct means and random full covariances."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, size=n)
    X = np.empty((n, d))
    for c in range(3):
        A = rng.normal(size=(d, d)) / np.sqrt(d) * (1.0 + 0.5 * c)
        mean = rng.normal(scale=1.5 / np.sqrt(d) * 3, size=d)
        idx = np.flatnonzero(labels == c)
        X[idx] = mean + rng.normal(size=(idx.size, d)) @ A.T
    return X, [f"c{c}" for c in labels]


def breast_cancer(n: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """scikit-learn's breast_cancer (shuffled), repeated with 1% noise up to ``n`` rows."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    rng = np.random.default_rng(seed)
    reps = max(1, -(-n // len(data.target)))
    idx = np.concatenate([rng.permutation(len(data.target)) for _ in range(reps)])[:n]
    X = data.data[idx] * (1 + 0.01 * rng.normal(size=(idx.size, data.data.shape[1])))
    return X, [str(data.target_names[t]) for t in data.target[idx]]


def make(kind: str) -> Any:
    from streamnb.models import make_model

    return make_model(kind)


def run_streamnb(
    kind: str, X: np.ndarray, y: list[str], batch: int, cap: float
) -> tuple[int, float, float]:
    """Test-then-train: (vectors done, seconds, accuracy)."""
    model = make(kind)
    correct = scored = done = 0
    seen: set[str] = set()  # (the classes learnt: kept as it grows, not made again a batch)
    t0 = time.perf_counter()
    for i in range(0, len(y), batch):
        Xb, yb = X[i : i + batch], y[i : i + batch]
        if len(seen) >= 2:  # LDA/QDA need two classes to predict
            pred = model.predict(Xb)
            correct += int(sum(p == t for p, t in zip(pred.tolist(), yb, strict=True)))
            scored += len(yb)
        model.partial_fit(Xb, yb)
        seen.update(yb)
        done += len(yb)
        if time.perf_counter() - t0 > cap:
            break
    return done, time.perf_counter() - t0, correct / scored if scored else float("nan")


def run_river(X: np.ndarray, y: list[str], cap: float) -> tuple[int, float, float]:
    from river.naive_bayes import GaussianNB as RiverGNB

    model = RiverGNB()
    dicts = [dict(enumerate(row.tolist())) for row in X]
    correct = scored = done = 0
    t0 = time.perf_counter()
    for x, label in zip(dicts, y, strict=True):
        p = model.predict_one(x)
        if p is not None:
            correct += p == label
            scored += 1
        model.learn_one(x, label)
        done += 1
        if time.perf_counter() - t0 > cap:
            break
    return done, time.perf_counter() - t0, correct / scored if scored else float("nan")


def benchmark(
    datasets: list[tuple[str, np.ndarray, list[str]]],
    batches: tuple[int, ...] = (1, 100),
    cap: float = 10.0,
    river: bool = True,
) -> list[list[Any]]:
    """Rows ``[data, d, library, model, batch, vectors, vectors/s, accuracy, x River]``."""
    rows: list[list[Any]] = []
    _, X0, y0 = datasets[0]
    for kind in KINDS:  # warm-up: imports (scipy.linalg) and first-call costs, not timed
        make(kind).partial_fit(X0[:50], y0[:50]).predict(X0[:5])
    for name, X, y in datasets:
        d = X.shape[1]
        river_rate = float("nan")
        if river:
            n, s, acc = run_river(X, y, cap)
            river_rate = rate(n, s)
            rows.append([name, d, "river", "gaussian", 1, n, river_rate, acc, 1.0])
        for kind in KINDS:
            for b in batches:
                n, s, acc = run_streamnb(kind, X, y, b, cap)
                r = rate(n, s)
                rows.append([name, d, "streamnb", kind, b, n, r, acc, r / river_rate])
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000, help="vectors per data set")
    ap.add_argument("--dims", default="10,30,100")
    ap.add_argument("--cap", type=float, default=10.0, help="seconds per run at most")
    args = ap.parse_args(argv)
    if os.environ != blas_env(os.environ):  # BLAS reads its thread count once, at import
        env = blas_env(os.environ)
        os.execve(
            sys.executable, [sys.executable, "-m", "benchmarks.gaussian_throughput", *argv], env
        )
    print_header(
        "benchmark 2: GaussianNB / LDA / QDA test-then-train vectors/s",
        "benchmarks.gaussian_throughput",
        argv,
    )
    datasets = [("synthetic", *synthetic(args.n, int(d))) for d in args.dims.split(",")]
    datasets.append(("breast_cancer", *breast_cancer(args.n)))
    # Early tiny batches trip the (correct, expected) singular-covariance warnings.
    warnings.filterwarnings("ignore", message=".*singular.*")
    rows = benchmark(datasets, cap=args.cap)
    print(
        format_table(
            [
                "data",
                "d",
                "library",
                "model",
                "batch",
                "vectors",
                "vectors/s",
                "accuracy",
                "x River",
            ],
            rows,
        )
    )
    print(
        "(x River: vectors/s over River GaussianNB's on the same data; accuracy is test-then-train)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
