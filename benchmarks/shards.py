"""One model in K statistics shards (``--shards K``) against the same model in one: what a
message costs the workers and Redis, with 1 to 3 workers.

The corpus's pre-tokenized labelled messages, each sent to its shard by its id (as
``streamnb produce`` does: crc32 of the id, mod K), on a private redis-server or with
``--cluster`` a private 3-master Redis Cluster (where shard j's slot falls on master j);
worker processes serving the model (ordered predictions, the daemon's defaults), started
together. From the first output to the last: msg/s (Redis clock), the workers' CPU per
message (``/proc``), all redis-servers' and the busiest one's (``INFO cpu``). The
workers' cost with K shards over its cost with one is what the K-shard columns of
``python -m benchmarks.projection`` leave out: every worker applies every shard's deltas
and keeps their sum as well.

    python -m benchmarks.shards [--shards 3] [--workers 1,2,3] [--cluster] [--repeat 2]
        [--trials 2]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from statistics import median

from benchmarks._cluster import RedisCluster3
from benchmarks._common import DEFAULT_CORPUS, corpus_or_synthetic, format_table, print_header
from benchmarks.end_to_end import RedisServer, repeated_messages, route_to_shards
from benchmarks.tenants import TenantsRun, run_served


def run(server: RedisServer | RedisCluster3, messages: Sequence[bytes], k: int,
        n_workers: int) -> TenantsRun:
    name = f"sharded{k}"
    names, shares = route_to_shards(messages, name, k)
    return run_served(server, names, [{"name": name, "kind": "multinomial", "shards": k}],
                      shares, n_workers)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None, help="first N corpus messages only")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--workers", default="1,2,3")
    ap.add_argument("--repeat", type=int, default=2, help="passes over the corpus")
    ap.add_argument("--trials", type=int, default=2,
                    help="interleaved rounds; each figure is the median")
    ap.add_argument("--cluster", action="store_true", help="on a private 3-master Redis Cluster")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.workers.split(",") if x]
    if args.shards < 2 or args.trials < 1 or not counts or min(counts) < 1:
        print("--shards must be >= 2, --trials and --workers >= 1", file=sys.stderr)
        return 2
    print_header("one model in K statistics shards against one model", "benchmarks.shards", argv)
    msgs = repeated_messages(corpus_or_synthetic(args.corpus, args.limit), "tokens", args.repeat)
    runs: dict[tuple[int, int], list[TenantsRun]] = {}
    with (RedisCluster3() if args.cluster else RedisServer()) as server:
        for _ in range(args.trials):
            for n in counts:
                for k in (1, args.shards):
                    runs.setdefault((k, n), []).append(run(server, msgs, k, n))
    print_runs(runs, args, len(msgs))
    return 0


def print_runs(runs: dict[tuple[int, int], list[TenantsRun]], args: argparse.Namespace,
               n_messages: int) -> None:
    where = "a 3-master Redis Cluster" if args.cluster else "one redis-server"
    print(f"{n_messages:,} pre-tokenized labelled messages on {where}; medians of "
          f"{args.trials} interleaved rounds")
    rows = []
    for (k, n), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        w = median([r.worker_cpu_us for r in rs])
        one = median([r.worker_cpu_us for r in runs[(1, n)]])
        rows.append([n, k, median([r.per_second for r in rs]), w, f"{w / one:.2f}x",
                     median([r.redis_cpu_us for r in rs]),
                     median([r.busiest_redis_cpu_us for r in rs])])
    print(format_table(["workers", "shards", "msg/s", "workers' CPU us/msg", "vs 1 shard",
                        "redis CPU us/msg (all)", "busiest redis-server us/msg"], rows))


if __name__ == "__main__":
    sys.exit(main())
