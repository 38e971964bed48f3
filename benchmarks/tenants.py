"""Per-tenant models: throughput against the number of models, and Redis memory per model.

Each model has a hash tag of its own, so models spread over a cluster's shards; what a
model costs decides how many a shard holds and what many small models cost the workers.

Throughput: a private redis-server, or with ``--cluster`` a private 3-master Redis
Cluster (the M models' slots spread over the masters; a worker reads each model's stream
in a call of its own there, docs/worker.md); the corpus's pre-tokenized labelled messages dealt round-robin to M models (``bits`` 16 by default,
so that 64 replicas fit a worker's memory on a small host), ``--workers`` worker
processes each serving all M models, started together. From the first output to the
last: msg/s (Redis clock), the workers' and redis-server's CPU per message (``/proc``,
``INFO cpu``): the measure a shared host does not move.

Memory: one model of ``bits`` 16, 18 and 20 learns the corpus through one worker with
snapshots after every few log entries, the log trimmed behind them and no label cache
(which costs per message, not per model: docs/performance.md, "Memory"); then
``MEMORY USAGE`` of each of the model's keys but its ``:in``/``:out`` streams. A 16 GB
shard holds 16e9 / that many such models (less what the label cache, the streams and an
AOF rewrite's copy-on-write need).

Per-user models (``--users 10000``): one worker serving that many models under
``--replica-memory``, against one global model: throughput, the latency of a cold user's
first and second messages, the worker's RSS; with ``--duties``, an idle worker of as many
models at the default duty periods: its oldest heartbeat (benchmarks/_users.py).

    python -m benchmarks.tenants [--models 1,4,16,64] [--workers 2] [--bits 16]
        [--memory-bits 16,18,20] [--repeat 1] [--cluster]
    python -m benchmarks.tenants --users 10000 --replica-memory 256 [--cold 20]
        [--duties SECONDS] --models '' --memory-bits ''
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks._cluster import RedisCluster3
from benchmarks._common import (
    DEFAULT_CORPUS,
    Corpus,
    corpus_or_synthetic,
    cpu_seconds,
    format_table,
    print_header,
    redis_cpu_s,
)
from benchmarks.end_to_end import (
    RedisServer,
    encode_messages,
    id_ms,
    keys,
    prefill,
    repeated_messages,
    wait_blocked,
    wait_until,
    workers,
)

#: A 16 GB shard, in bytes.
SHARD_BYTES = 16e9
#: The model's keys that are per-message traffic, not the model.
TRAFFIC = (":in", ":out", ":dead", ":events")
#: The learn-once keys' bookkeeping (workers/wire/learn_keys.py): bytes by learnt message.
LEARN_ONCE = (":keys", ":keyorder")


def spec(name: str, bits: int) -> dict[str, Any]:
    return {"name": name, "kind": "multinomial", "featurizer_config": {"bits": bits}}


@dataclass
class TenantsRun:
    models: int
    workers: int
    messages: int
    per_second: float
    worker_cpu_us: float
    redis_cpu_us: float
    #: CPU per message of the busiest redis-server (a cluster's busiest master).
    busiest_redis_cpu_us: float = float("nan")


def deal(messages: Sequence[bytes], n_models: int) -> list[list[bytes]]:
    """Message j to model j % n_models.

    >>> deal([b"a", b"b", b"c"], 2)
    [[b'a', b'c'], [b'b']]
    """
    return [list(messages[i::n_models]) for i in range(n_models)]


def node_cpu(server: RedisServer | RedisCluster3) -> list[float]:
    """CPU seconds of redis-server, or of each node of a cluster."""
    if isinstance(server, RedisCluster3):
        return server.node_cpu_s()
    return [redis_cpu_s(server.client())]


def run_tenants(server: RedisServer | RedisCluster3, messages: Sequence[bytes], n_models: int,
                n_workers: int, bits: int, timeout: float = 600.0) -> TenantsRun:
    """``n_workers`` workers serving ``n_models`` models, the messages dealt among them
    (on one redis-server or a cluster's masters)."""
    names = [f"t{n_models}-{i}" for i in range(n_models)]
    return run_served(server, names, [spec(n, bits) for n in names], deal(messages, n_models),
                      n_workers, timeout)


def run_served(server: RedisServer | RedisCluster3, streams: Sequence[str],
               specs: Sequence[dict[str, Any]], shares: Sequence[Sequence[bytes]],
               n_workers: int, timeout: float = 600.0) -> TenantsRun:
    """``n_workers`` workers, each serving ``specs``, the messages of ``shares[i]`` sent
    to the model (or shard) ``streams[i]`` (all but the last behind a group that starts
    after them, as run_e2e does)."""
    from streamnb_workers.store.keys import GROUP

    cluster = isinstance(server, RedisCluster3)
    client = server.client()
    for name, share in zip(streams, shares, strict=True):
        prefill(client, name, share[:-1])
        client.xgroup_create(keys(name)["in"], GROUP, id="$", mkstream=True)
    total = sum(len(share) for share in shares)

    def outputs() -> int:
        pipe = client.pipeline(transaction=False)
        for name in streams:
            pipe.xlen(keys(name)["out"])
        return sum(pipe.execute())

    def consumers() -> bool:  # every worker has read (or waited on) every model's stream
        return all(len(client.xinfo_consumers(keys(n)["in"], GROUP)) >= n_workers
                   for n in streams)

    with workers(server.url, [list(specs)], n_workers, cluster=cluster) as procs:
        started = (wait_until(consumers, timeout, procs) if cluster
                   else wait_blocked(client, n_workers, timeout, procs))
        if not started:
            raise RuntimeError(f"{n_workers} workers did not start in {timeout}s")
        # one step on one server; on a cluster, per master (the models' slots differ)
        gate = client.pipeline(transaction=not cluster)
        for name, share in zip(streams, shares, strict=True):
            gate.xgroup_setid(keys(name)["in"], GROUP, "0")
            gate.xadd(keys(name)["in"], {"data": share[-1]})
        gate.execute()
        if not wait_until(lambda: outputs() > 0, timeout, procs, every_s=0.005):
            raise RuntimeError("no output")
        done0, cpu0 = outputs(), [cpu_seconds(p.pid) for p in procs]
        redis0 = node_cpu(server)
        if not wait_until(lambda: outputs() >= total, timeout, procs):
            raise RuntimeError(f"the workers did not process {total} messages in {timeout}s")
        worker_cpu = sum(cpu_seconds(p.pid) for p in procs) - sum(cpu0)
        redis_cpu = [b - a for a, b in zip(redis0, node_cpu(server), strict=True)]
    stamps = sorted(id_ms(i) for name in streams for i, _ in client.xrange(keys(name)["out"]))
    span_s = max(1e-3, (stamps[-1] - stamps[0]) / 1000.0)
    window = max(1, total - done0)
    if cluster:
        server.flush()
    else:
        client.flushdb()
    return TenantsRun(len(streams), n_workers, total, (total - 1) / span_s,
                      1e6 * worker_cpu / window, 1e6 * sum(redis_cpu) / window,
                      1e6 * max(redis_cpu) / window)


def model_bytes(client: Any, name: str) -> dict[str, int]:
    """``MEMORY USAGE`` of each of the model's keys but its traffic streams."""
    prefix = keys(name)["in"][: -len(":in")]
    out = {}
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        k = key.decode()
        if not k.endswith(TRAFFIC):
            out[k[len(prefix):]] = int(client.memory_usage(k, samples=0) or 0)
    return out


def memory_per_model(messages: Sequence[bytes], bits: int, timeout: float = 600.0,
                     ) -> dict[str, int]:
    """The Redis bytes of one model of ``bits`` that learnt ``messages``, by key, once a
    snapshot covers the log (docstring)."""
    name = f"mem{bits}"
    options = {"snapshot_every": 4, "snapshot_interval_s": 0.2, "trim_margin_ms": 0,
               "cache_ttl_s": 0}
    with RedisServer() as server:
        client = server.client()
        prefill(client, name, messages)
        with workers(server.url, spec(name, bits), 1, options) as procs:
            out = keys(name)["out"]
            if not wait_until(lambda: client.xlen(out) >= len(messages), timeout, procs):
                raise RuntimeError(f"model {name}: not done in {timeout}s")
            snap = keys(name)["snapshot"]
            last = client.xrevrange(keys(name)["log"], count=1)
            # the snapshot catches up with the last log entry on the lease holder's timer
            wait_until(lambda: bool(last) and client.hget(snap, "log_id") == last[0][0],
                       10.0, procs)
            time.sleep(0.3)  # the trim that follows the snapshot
            return model_bytes(client, name)


def full_table_bytes(bits: int, classes: int = 2, count_bytes: int = 2) -> int:
    """A snapshot's count table once every bucket has been seen: a uint32 column index
    and a count per class (uint16: counts up to 65,535) per bucket; a snapshot writes only
    the columns seen (streamnb.stats.feature_counts), so this bounds a model's size.

    >>> full_table_bytes(20) / 2**20
    8.0
    """
    return 2**bits * (4 + classes * count_bytes)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None, help="first N corpus messages only")
    ap.add_argument("--models", default="1,4,16,64")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bits", type=int, default=16, help="bits of the throughput runs' models")
    ap.add_argument("--memory-bits", default="16,18,20", help="'' to skip the memory runs")
    ap.add_argument("--repeat", type=int, default=1, help="passes over the corpus")
    ap.add_argument("--cluster", action="store_true",
                    help="the throughput runs on a private 3-master Redis Cluster")
    ap.add_argument("--users", default="", help="per-user runs: numbers of users (e.g. 10000)")
    ap.add_argument("--replica-memory", type=int, default=256, help="MiB, the users' worker")
    ap.add_argument("--cold", type=int, default=20, help="cold users whose latency is taken")
    ap.add_argument("--duties", type=float, default=0,
                    help="seconds: also an idle worker of --users at the default periods")
    args = ap.parse_args(argv)
    print_header("per-tenant models: throughput against models, Redis memory per model",
                 "benchmarks.tenants", argv)
    corpus: Corpus = corpus_or_synthetic(args.corpus, args.limit)
    msgs = repeated_messages(corpus, "tokens", args.repeat)
    runs = []
    with (RedisCluster3() if args.cluster else RedisServer()) as server:
        for m in (int(x) for x in args.models.split(",") if x):
            runs.append(run_tenants(server, msgs, m, args.workers, args.bits))
    if runs:
        print_runs(runs, len(msgs), args)
    if args.memory_bits:
        print_memory(msgs, args)
    if args.users:
        from benchmarks._users import print_users  # deferred: it imports this module

        one = Corpus(corpus.raws[:1], corpus.labels[:1])
        unlabelled = encode_messages(one, "tokens", labelled=False)[0]
        print_users(msgs, unlabelled, [int(u) for u in args.users.split(",")], args.bits,
                    args.replica_memory * 2**20, args.cold, args.duties)
    return 0


def print_runs(runs: Sequence[TenantsRun], n_messages: int, args: argparse.Namespace) -> None:
    where = "a 3-master Redis Cluster" if args.cluster else "one redis-server"
    print(f"{n_messages:,} pre-tokenized labelled messages dealt round-robin to the models "
          f"(bits {args.bits}) on {where}; {args.workers} workers, each serving every model")
    one = runs[0]
    print(format_table(
        ["models", "messages a model", "msg/s (all models)", "workers' CPU us/msg",
         "vs first row", "redis-server CPU us/msg"],
        [[r.models, r.messages // r.models, r.per_second, r.worker_cpu_us,
          f"{r.worker_cpu_us / one.worker_cpu_us:.2f}x", r.redis_cpu_us] for r in runs]))


def print_memory(msgs: Sequence[bytes], args: argparse.Namespace) -> None:
    from streamnb_workers.defaults import DEFAULT_LEARNT_KEYS_MAX

    rows = []
    for bits in (int(b) for b in args.memory_bits.split(",")):
        by_key = memory_per_model(msgs, bits)
        total = sum(by_key.values())
        top = ", ".join(f"{k} {v:,}" for k, v in sorted(by_key.items(), key=lambda kv: -kv[1])[:3])
        full = full_table_bytes(bits)
        # the learn-once keys (workers/wire/learn_keys.py) grow by message up to their cap
        per_key = sum(by_key.get(k, 0) for k in LEARN_ONCE) / max(1, len(msgs))
        capped = full + per_key * DEFAULT_LEARNT_KEYS_MAX
        rows.append([bits, total, f"{SHARD_BYTES / total:,.0f}", full,
                     f"{SHARD_BYTES / full:,.0f}", per_key, capped,
                     f"{SHARD_BYTES / capped:,.0f}", top])
    print()
    print(f"Redis bytes of one model after {len(msgs):,} messages (snapshot + log left, no "
          "label cache), and models a 16 GB shard holds; then with every bucket seen; then "
          f"with every bucket seen and {DEFAULT_LEARNT_KEYS_MAX:,} learn-once keys (the "
          "default learnt_keys_max)")
    print(format_table(["bits", "bytes a model", "models in 16 GB", "every bucket seen",
                        "models in 16 GB", "learn-once bytes a key", "with the keys' cap",
                        "models in 16 GB", "largest keys"], rows))

if __name__ == "__main__":
    sys.exit(main())
