"""``python -m benchmarks``: short versions of benchmarks 1, 3 and 6, then one summary table.

1 (model only, 3 s cap per run), 3 (end to end, one pass over the corpus, one trial) and
6 (accuracy through 2 workers) in a few minutes; the full scripts are
``python -m benchmarks.<model_throughput|end_to_end|daemon_accuracy>``.

    python -m benchmarks [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from benchmarks import daemon_accuracy, end_to_end, model_throughput
from benchmarks._common import (
    DEFAULT_CORPUS,
    corpus_or_synthetic,
    format_table,
    print_header,
)


def _verdict(value: float, target: float) -> str:
    return "met" if value >= target else "NOT met"


def run(corpus: Any, cap: float = 3.0) -> list[list[Any]]:
    """Run the three short benchmarks, printing each; return the summary rows."""
    summary: list[list[Any]] = []

    print("\n-- 1. model only (tokenized beforehand)")
    prep = model_throughput.prepare(corpus)
    results = model_throughput.benchmark(prep, cap=cap)
    model_throughput.print_results(results, len(corpus))
    r = model_throughput.ratios(results)
    for key, target in (("multinomial: streamnb b100 / river", 40.0),
                        ("multinomial: streamnb b100 / sklearn b100", 10.0)):
        if key in r:
            summary.append([f"1. {key}", f"{r[key]:.1f}x", f">= {target:.0f}x", _verdict(r[key], target)])

    print("\n-- 3. end to end (real redis-server, worker processes)")
    report = end_to_end.benchmark(corpus, repeat=1, trials=1)
    end_to_end.print_report(report)
    by = {(x.payload, x.workers): x.per_second for x in report["results"]}
    bare = report["refs"]["bare email.message_from_bytes"]
    if ("tokens", 1) in by:
        summary.append(["3. 1 worker, pre-tokenized msg/s", f"{by[('tokens', 1)]:,.0f}", ">= 5,000",
                        _verdict(by[("tokens", 1)], 5000)])
        # the same with --batch 500, the setting for a bulk backlog (docs/performance.md, 3)
        big = end_to_end.benchmark(corpus, repeat=1, worker_counts=(1,), payloads=("tokens",),
                                   options={"batch": 500})
        x = big["results"][0].per_second
        print(f"1 worker, pre-tokenized, --batch 500: {x:,.0f} msg/s")
        summary.append(["3. same, --batch 500", f"{x:,.0f}", ">= 5,000", _verdict(x, 5000)])
    runs = {(x.payload, x.workers): x for x in report["results"]}
    river = report["refs"].get(end_to_end.RIVER, 0.0)
    if ("tokens", 1) in by and river > 0:
        x = by[("tokens", 1)] / river
        summary.append(["3. 1 worker, pre-tokenized / River in-process", f"{x:.1f}x", ">= 10x",
                        _verdict(x, 10.0)])
    if ("tokens", 1) in runs:
        x = end_to_end.empty_share(report, runs[("tokens", 1)])
        summary.append(["3. 1 worker, pre-tokenized / empty consumer", f"{x:.0%}", ">= 30%",
                        _verdict(x, 0.3)])
    if ("raw", 1) in by:
        share = by[("raw", 1)] / bare
        summary.append(["3. raw mail / bare message_from_bytes", f"{share:.0%}", ">= 90%",
                        _verdict(share, 0.9)])
    for p in ("tokens", "raw"):
        if (p, 1) in by and (p, 2) in by:
            x = by[(p, 2)] / by[(p, 1)]
            summary.append([f"3. {p}: 2 workers / 1 worker", f"{x:.2f}x", ">= 1.6x", _verdict(x, 1.6)])

    print("\n-- 6. accuracy through 2 workers, index order")
    daemon = daemon_accuracy.through_daemon(corpus, 2)
    daemon_accuracy.print_scores([daemon, daemon_accuracy.river_reference(corpus)])
    summary.append(["6. daemon accuracy", f"{daemon.accuracy:.2%}", ">= 98.5%",
                    _verdict(daemon.accuracy, daemon_accuracy.TARGET_ACCURACY)])
    summary.append(["6. daemon ham false positives", f"{daemon.ham_fp:.2%}", "<= 0.5%",
                    _verdict(-daemon.ham_fp, -daemon_accuracy.TARGET_HAM_FP)])
    return summary


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None, help="first N corpus messages only")
    args = ap.parse_args(argv)
    print_header("streamnb bench: short benchmarks 1, 3, 6", "benchmarks", argv)
    corpus = corpus_or_synthetic(args.corpus, args.limit)
    t0 = time.perf_counter()
    summary = run(corpus)
    print(f"\n== summary ({time.perf_counter() - t0:.0f} s)")
    print(format_table(["figure", "measured", "target", "verdict"], summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
