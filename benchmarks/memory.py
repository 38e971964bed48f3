"""Benchmark 5: worker RSS after 10k, 100k, 1M messages, and bytes per model.

One worker process (default options except ``cache_ttl_s``, see below) serves a model
with the daemon's defaults (multinomial, 2**20 buckets). The producer feeds it, chunk
by chunk, the corpus's pre-tokenized messages (labelled), each with ``--noise`` random
tokens drawn from 10 million made-up words, so the hashed tables fill up as a long
real stream would. After each checkpoint the worker's RSS (``/proc/PID/status``) and
Redis's used memory are read. ``:in`` and ``:out`` are trimmed between chunks so Redis
holds only the model's keys.

The per-message feature cache (for delayed labels, ``cache_ttl_s``, 2 days by default)
lives in Redis, not in the worker; here it gets a 30 s TTL so a 1M-message run fits,
and its cost is measured on the first chunk (Redis bytes per cached message).

Bytes per model: the numpy arrays of a fitted model in this process (statistics +
derived tables) and the encoded snapshot size.

A long run (``--messages N``) instead feeds the worker continuously, never trims a
stream itself (the worker's own bounds do: the lease holder trims ``:in`` of what the group
acknowledged, ``:out`` and ``:dead`` keep about ``out_maxlen`` / ``dead_maxlen``, ``:log``
is trimmed behind each snapshot) and every ``--report-s`` seconds prints redis-server's
memory (``used_memory``, its RSS) and the length of every stream of the model: what a
production Redis would hold after N messages.

    python -m benchmarks.memory [--checkpoints 10000,100000,1000000] [--noise 20]
    python -m benchmarks.memory --messages 1000000 [--report-s 10] [--out-maxlen 20000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from benchmarks._common import (
    DEFAULT_CORPUS,
    RedisServer,
    corpus_or_synthetic,
    format_table,
    print_header,
    rss_bytes,
)
from benchmarks.end_to_end import corpus_tokens, default_spec, keys, prefill, wait_for, workers
from streamnb_workers.defaults import DEFAULT_LABEL_CACHE_TTL_S

MB = 1024 * 1024
#: Feature-cache TTL for this benchmark (the default, days, would keep every message in Redis).
CACHE_TTL_S = 30.0


def noisy_messages(tokens: list[list[str]], labels: list[str], start: int, n: int, noise: int,
                   rng: np.random.Generator) -> list[bytes]:
    """Messages ``start .. start + n`` of the corpus cycled, each with ``noise`` random tokens."""
    from streamnb_workers.wire.codec import encode_input

    out = []
    for i in range(start, start + n):
        j = i % len(tokens)
        extra = [f"noise{v}" for v in rng.integers(0, 10_000_000, size=noise)]
        out.append(encode_input("tokens", tokens[j] + extra, id=f"m{i}", label=labels[j]))
    return out


def model_bytes(kind: str = "multinomial") -> dict[str, int]:
    """A default model after one batch and one prediction: bytes allocated (tracemalloc,
    which sees numpy's buffers) for the statistics alone and for the whole model, and
    the encoded size."""
    import tracemalloc

    from streamnb.features import Featurizer, Payload
    from streamnb.models import dumps, make_model

    f = Featurizer()
    rows = [f.featurize(Payload("tokens", t)) for t in (["cheap", "meds"], ["lunch", "notes"])]
    X = f.stack(rows)
    tracemalloc.start()
    model = make_model(kind, n_features=f.n_columns, smoothing_m="seen")
    model.partial_fit(X, ["spam", "ham"])
    stats_only = tracemalloc.get_traced_memory()[0]
    model.predict(X)
    total = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"statistics": stats_only, "statistics + derived tables": total,
            "encoded (2 messages learnt)": len(dumps(model))}


def benchmark(tokens: list[list[str]], labels: list[str], checkpoints: list[int], noise: int = 20,
              chunk: int = 10_000, seed: int = 0, options: dict[str, Any] | None = None,
              ) -> tuple[list[list[Any]], dict[str, float]]:
    """Rows ``[messages, worker RSS MB, Redis used MB, snapshot MB, seconds]`` and cache
    figures."""
    rng = np.random.default_rng(seed)
    name = "memory"
    k = keys(name)
    rows: list[list[Any]] = []
    extra: dict[str, float] = {}
    with RedisServer() as server:
        client = server.client()
        with workers(server.url, default_spec(name), 1,
                     {"cache_ttl_s": CACHE_TTL_S, **(options or {})}) as procs:
            pid = procs[0].pid
            done = 0
            t0 = time.perf_counter()
            time.sleep(1.0)
            rows.append([0, rss_bytes(pid) / MB, client.info("memory")["used_memory"] / MB, 0.0, 0.0])
            for target in checkpoints:
                while done < target:
                    n = min(chunk, target - done)
                    used0 = client.info("memory")["used_memory"]
                    prefill(client, name, noisy_messages(tokens, labels, done, n, noise, rng))
                    if not wait_for(client, k["out"], n, 600, procs, k["dead"]):
                        raise RuntimeError(f"worker stopped or stalled after {done} messages")
                    if done == 0:  # cache keys of this chunk are all alive (TTL 30 s)
                        client.xtrim(k["in"], maxlen=0)
                        client.xtrim(k["out"], maxlen=0)
                        extra["redis bytes per cached message"] = (
                            client.info("memory")["used_memory"] - used0) / n
                    done += n
                    client.xtrim(k["in"], maxlen=0)
                    client.xtrim(k["out"], maxlen=0)
                    client.xtrim(k["dead"], maxlen=0)
                rows.append([done, rss_bytes(pid) / MB, client.info("memory")["used_memory"] / MB,
                             client.hstrlen(k["snapshot"], "data") / MB, time.perf_counter() - t0])
                print(f"  {done:>9,} messages: worker RSS {rows[-1][1]:.0f} MB", flush=True)
    return rows, extra


#: Streams of a model reported by the long run.
STREAMS = ("in", "out", "dead", "log", "events")
#: The producer keeps at most this many entries unread by the group (a steady backlog).
BACKLOG = 20_000


def _stream_lengths(client: Any, name: str) -> dict[str, int]:
    pipe = client.pipeline(transaction=False)
    for s in STREAMS:
        pipe.xlen(f"streamnb:{{{name}}}:{s}")
    return dict(zip(STREAMS, pipe.execute(), strict=True))


def _entries_read(client: Any, key: str) -> int:
    from streamnb_workers.store.keys import GROUP

    for g in client.xinfo_groups(key):
        if g["name"] in (GROUP, GROUP.encode()):
            pending = int(g.get("pending", 0))
            return max(0, int(g.get("entries-read") or 0) - pending)
    return 0


def long_run(tokens: list[list[str]], labels: list[str], messages: int, noise: int = 20,
             report_s: float = 10.0, chunk: int = 2_000, seed: int = 0,
             options: dict[str, Any] | None = None) -> list[list[Any]]:
    """Feed ``messages`` messages to one worker, a steady backlog ahead of it; rows
    ``[seconds, messages done, redis used MB, redis RSS MB, worker RSS MB, XLEN of each
    stream...]`` every ``report_s`` seconds and at the end."""
    rng = np.random.default_rng(seed)
    name = "memory"
    k = keys(name)
    rows: list[list[Any]] = []
    with RedisServer() as server:
        client = server.client()
        with workers(server.url, default_spec(name), 1,
                     {"cache_ttl_s": CACHE_TTL_S, **(options or {})}) as procs:
            pid = procs[0].pid
            sent = 0
            t0 = time.perf_counter()
            next_report = 0.0

            def report(done: int) -> None:
                mem = client.info("memory")
                lengths = _stream_lengths(client, name)
                rows.append([time.perf_counter() - t0, done, mem["used_memory"] / MB,
                             mem["used_memory_rss"] / MB, rss_bytes(pid) / MB,
                             *lengths.values()])
                print("  " + "  ".join(f"{h} {v:,.0f}" for h, v in zip(
                    ["s", "done", "redis MB", "redis RSS MB", "worker MB", *STREAMS],
                    rows[-1], strict=True)), flush=True)

            while True:
                done = _entries_read(client, k["in"]) if sent else 0
                now = time.perf_counter() - t0
                if now >= next_report:
                    report(done)
                    next_report = now + report_s
                if done >= messages:
                    break
                if procs[0].poll() is not None:
                    raise RuntimeError(f"the worker exited after {done} messages")
                if sent < messages and sent - done < BACKLOG:
                    n = min(chunk, messages - sent)
                    prefill(client, name, noisy_messages(tokens, labels, sent, n, noise, rng))
                    sent += n
                else:
                    time.sleep(0.05)
            report(messages)
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--checkpoints", default="10000,100000,1000000")
    ap.add_argument("--noise", type=int, default=20, help="random tokens added per message")
    ap.add_argument("--options", type=json.loads, default=None, metavar="JSON",
                    help='worker options, e.g. \'{"cache_labelled": false}\' (WorkerOptions fields)')
    ap.add_argument("--messages", type=int, default=None,
                    help="a long run of N messages: Redis memory and stream lengths over time")
    ap.add_argument("--report-s", type=float, default=10.0, help="long run: seconds between rows")
    ap.add_argument("--out-maxlen", type=int, default=20_000,
                    help="long run: the worker's out_maxlen (a reader would consume :out)")
    args = ap.parse_args(argv)
    print_header("benchmark 5: worker memory", "benchmarks.memory", argv)
    corpus = corpus_or_synthetic(args.corpus)
    if args.messages is not None:
        rows = long_run(corpus_tokens(corpus), corpus.labels, args.messages, args.noise,
                        args.report_s, options={"out_maxlen": args.out_maxlen,
                                                **(args.options or {})})
        print(format_table(["seconds", "messages", "redis used MB", "redis RSS MB",
                            "worker RSS MB", *(f"XLEN :{s}" for s in STREAMS)], rows))
        return 0
    for k, v in model_bytes().items():
        print(f"default multinomial model, {k}: {v:,} bytes ({v / MB:.1f} MB)")
    rows, extra = benchmark(corpus_tokens(corpus), corpus.labels,
                            [int(c) for c in args.checkpoints.split(",")], args.noise,
                            options=args.options)
    print(format_table(["messages", "worker RSS MB", "redis used MB", "snapshot MB", "seconds"], rows))
    for k, v in extra.items():
        days = DEFAULT_LABEL_CACHE_TTL_S / 86400
        print(f"{k}: {v:,.0f} (with the default --label-cache-ttl of {days:g} days, Redis keeps "
              f"this per message for {days:g} days)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
