"""Benchmark 4: latency from XADD to the prediction in ``:out`` at a steady rate.

A private redis-server, a model with the daemon's defaults, trained first on the corpus
(labelled, pre-filled). Then, with 1 and then 2 worker processes running (default
options), a producer XADDs unlabelled messages one by one at a steady rate (100 and
1,000 messages/s) for ``--seconds``. The latency of a message is the id of its
prediction in ``:out`` minus the id of its ``:in`` entry: both stamped by Redis's clock
when written, so no clock skew, with a resolution of 1 ms.

    python -m benchmarks.latency [--rates 100,1000] [--workers 1,2] [--seconds 10] [--payload tokens]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks._common import (
    DEFAULT_CORPUS,
    Corpus,
    RedisServer,
    corpus_or_synthetic,
    format_table,
    percentiles,
    print_header,
)
from benchmarks.end_to_end import (
    corpus_tokens,
    default_spec,
    encode_messages,
    id_ms,
    keys,
    prefill,
    wait_for,
    workers,
)

TARGET_P99_MS = 25.0


def produce_steady(client: Any, key: str, messages: Sequence[bytes], per_second: float,
                   seconds: float) -> tuple[int, float]:
    """XADD one message at a time on a fixed schedule; returns (sent, achieved rate)."""
    n = int(per_second * seconds)
    t0 = time.perf_counter()
    for i in range(n):
        due = t0 + i / per_second
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        client.xadd(key, {"data": messages[i % len(messages)]})
    elapsed = time.perf_counter() - t0
    return n, n / elapsed if elapsed > 0 else float("nan")


def latencies_ms(client: Any, out_key: str, after_id: str) -> list[float]:
    """``:out`` id minus ``:in`` entry id (ms) for predictions of entries after ``after_id``."""
    from streamnb_workers.wire.outputs import decode_output

    after = _id_tuple(after_id)
    out = []
    for out_id, fields in client.xrange(out_key, min=f"{after[0]}-0"):
        entry = decode_output(fields[b"data"])["entry"]
        if _id_tuple(entry) > after:
            out.append(float(id_ms(out_id) - id_ms(entry)))
    return out


def _id_tuple(entry_id: str | bytes) -> tuple[int, int]:
    s = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = s.partition("-")
    return int(ms), int(seq or 0)


def benchmark(corpus: Corpus, rates: Sequence[float] = (100, 1000), worker_counts: Sequence[int] = (1, 2),
              seconds: float = 10.0, payload: str = "tokens") -> list[list[Any]]:
    """Rows ``[workers, target rate, achieved rate, messages, p50, p99, max]`` (ms)."""
    tokens = corpus_tokens(corpus) if payload == "tokens" else None
    train = encode_messages(corpus, payload, labelled=True, tokens=tokens)
    probe = encode_messages(corpus, payload, labelled=False, tokens=tokens)
    rows: list[list[Any]] = []
    with RedisServer() as server:
        client = server.client()
        for n_workers in worker_counts:
            name = f"latency-{n_workers}w"
            k = keys(name)
            prefill(client, name, train)
            with workers(server.url, default_spec(name), n_workers) as procs:
                if not wait_for(client, k["out"], len(train), 600, procs, k["dead"]):
                    raise RuntimeError("the workers did not finish the training messages")
                for r in rates:
                    last = client.xinfo_stream(k["in"])["last-generated-id"].decode()  # (:in is trimmed)
                    before = client.xlen(k["out"]) + client.xlen(k["dead"])
                    sent, achieved = produce_steady(client, k["in"], probe, r, seconds)
                    wait_for(client, k["out"], before + sent, 120, procs, k["dead"])
                    lat = latencies_ms(client, k["out"], last)
                    p50, p99, pmax = percentiles(lat, (50, 99, 100))
                    rows.append([n_workers, float(r), achieved, len(lat), p50, p99, pmax])
            client.flushdb()
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--rates", default="100,1000")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--payload", choices=("tokens", "raw"), default="tokens")
    args = ap.parse_args(argv)
    print_header("benchmark 4: latency XADD -> prediction in :out", "benchmarks.latency", argv)
    corpus = corpus_or_synthetic(args.corpus)
    rows = benchmark(corpus, [float(r) for r in args.rates.split(",")],
                     [int(w) for w in args.workers.split(",")], args.seconds, args.payload)
    print(f"payload: {args.payload}; latency = :out id - :in id (Redis clock, 1 ms resolution)")
    print(format_table(["workers", "rate", "achieved/s", "messages", "p50 ms", "p99 ms", "max ms"], rows))
    for row in rows:
        if row[1] >= 1000:
            verdict = "met" if row[5] <= TARGET_P99_MS else "NOT met"
            print(f"{row[0]} worker(s) at {row[1]:,.0f}/s: p99 {row[5]:.0f} ms, "
                  f"target <= {TARGET_P99_MS:.0f} ms {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
