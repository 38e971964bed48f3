"""Per-user models for ``python -m benchmarks.tenants --users N``: one worker serving N
models of ``bits`` under ``--replica-memory`` (workers/replication/replica_cache.py).

1. **Throughput**: the messages dealt round-robin to the N users (so nearly every batch
   is of a user the worker does not hold: a load from its snapshot and log), against
   the same messages to one global model; msg/s from the first output to the last
   (Redis clock), the worker's CPU per message.
2. **Cold users**: for ``cold`` users not used for longest (evicted), one unlabelled
   message each, then a second one right after its output: each message's latency from
   its ``XADD`` to its output (both ids: the Redis clock). The first includes the load.
3. **Memory**: the worker's RSS (``VmRSS``) at the end, once it is blocked on its next
   read (between steps, where the bound holds), and its peak (``VmHWM``, within a step),
   next to the setting; and the RSS of the same worker started with every model before
   any message (the runtimes and the replicas of the empty models it loaded at start). The
   per-model duties run at :data:`MANY_MODELS`' periods. The
   worker pools its metrics over the models (``model_metrics`` False, ``--no-model-metrics``:
   by model they cost about 110 KiB a model, docs/observability.md).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import cpu_seconds, format_table
from benchmarks.end_to_end import (
    RedisServer,
    id_ms,
    keys,
    prefill,
    wait_blocked,
    wait_until,
    workers,
)
from benchmarks.tenants import deal, run_tenants, spec

MIB = 2**20
#: The per-model duties' periods for thousands of models (docs/worker.md, "Many models":
#: at the defaults, 0.8 round trips a second a model, more than a worker does, so they
#: fall behind). ``input_trim_s`` an hour: the backlog sits before the group's start
#: until the benchmark sets it back, and a trim before then would drop it.
MANY_MODELS = {"heartbeat_s": 120.0, "stale_s": 600.0, "lease_ms": 300_000,
               "claim_idle_ms": 600_000, "input_trim_s": 3600.0}


def rss_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (KiB) of a live process."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


@dataclass
class UsersRun:
    users: int
    replica_memory: int
    messages: int
    start_s: float
    per_second: float
    worker_cpu_us: float
    idle_rss_mib: float
    rss_mib: float
    peak_rss_mib: float
    cold_first_ms: list[float]
    cold_next_ms: list[float]


def latency_ms(client: Any, name: str, message: bytes, timeout: float, procs: Sequence) -> float:
    """One message to ``name``'s ``:in``; ms from its id to its output's (Redis clock)."""
    k = keys(name)
    before = client.xlen(k["out"])
    sent = client.xadd(k["in"], {"data": message})
    if not wait_until(lambda: client.xlen(k["out"]) > before, timeout, procs, every_s=0.001):
        raise RuntimeError(f"no output for {name} in {timeout}s")
    last = client.xrevrange(k["out"], count=1)[0][0]
    return float(id_ms(last) - id_ms(sent))


def run_users(messages: Sequence[bytes], unlabelled: bytes, n_users: int, bits: int,
              replica_memory: int, cold: int = 20, timeout: float = 1800.0,
              model_metrics: bool = False) -> UsersRun:
    """Stages 1-3 of the module docstring with one worker (``unlabelled``: the message
    the cold users get)."""
    from streamnb_workers.store.keys import GROUP

    names = [f"u{i}" for i in range(n_users)]
    shares = deal(messages, n_users)
    options = {"replica_memory": replica_memory, "block_ms": 1000, "token_names": 0,
               "model_metrics": model_metrics, **MANY_MODELS}
    with RedisServer() as server:
        client = server.client()
        for name, share in zip(names, shares, strict=True):
            prefill(client, name, share)
            client.xgroup_create(keys(name)["in"], GROUP, id="$", mkstream=True)
        t0 = time.monotonic()
        with workers(server.url, [[spec(n, bits) for n in names]], 1, options) as procs:
            pid = procs[0].pid
            if not wait_blocked(client, 1, timeout, procs):
                raise RuntimeError(f"the worker did not start in {timeout}s")
            start_s = time.monotonic() - t0
            idle = rss_kib(pid)["VmRSS"] / 1024
            cpu0 = cpu_seconds(pid)
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.xgroup_setid(keys(name)["in"], GROUP, "0")
            pipe.execute()

            def outputs() -> int:
                pipe = client.pipeline(transaction=False)
                for name in names:
                    pipe.xlen(keys(name)["out"])
                return sum(pipe.execute())

            total = len(messages)
            if not wait_until(lambda: outputs() >= total, timeout, procs, every_s=0.5):
                raise RuntimeError(f"the worker did not process {total} messages in {timeout}s")
            cpu = cpu_seconds(pid) - cpu0
            stamps = sorted(id_ms(i) for n in names for i, _ in client.xrange(keys(n)["out"]))
            firsts, nexts = [], []
            for name in names[:cold]:  # served first in the round-robin: evicted since
                firsts.append(latency_ms(client, name, unlabelled, 300.0, procs))
                nexts.append(latency_ms(client, name, unlabelled, 60.0, procs))
            # between steps, where the bound holds: the worker blocked on its next read
            time.sleep(0.2)
            wait_blocked(client, 1, timeout, procs)
            mem = rss_kib(pid)
    span_s = max(1e-3, (stamps[-1] - stamps[0]) / 1000.0)
    return UsersRun(n_users, replica_memory, total, start_s, (total - 1) / span_s,
                    1e6 * cpu / total, idle, mem["VmRSS"] / 1024, mem["VmHWM"] / 1024,
                    firsts, nexts)


def _median_max(ms: Sequence[float]) -> str:
    """``median (max N)`` of latencies in ms; ``-`` for none (``--cold 0``)."""
    return f"{statistics.median(ms):.1f} (max {max(ms):.0f})" if ms else "-"


def print_users(messages: Sequence[bytes], unlabelled: bytes, users: Sequence[int], bits: int,
                replica_memory: int, cold: int, duties_s: float = 0) -> None:
    rows = []
    with RedisServer() as server:
        one = run_tenants(server, messages, 1, 1, bits)
    rows.append(["1 (global)", "-", "-", one.per_second, one.worker_cpu_us, "-", "-", "-",
                 "-", "-"])
    for n in users:
        r = run_users(messages, unlabelled, n, bits, replica_memory, cold)
        rows.append([f"{n:,} users", f"{r.start_s:.0f}", r.replica_memory // MIB, r.per_second,
                     r.worker_cpu_us, f"{r.idle_rss_mib:,.0f}", f"{r.rss_mib:,.0f}",
                     f"{r.peak_rss_mib:,.0f}", _median_max(r.cold_first_ms),
                     _median_max(r.cold_next_ms)])
    print()
    print(f"{len(messages):,} pre-tokenized labelled messages dealt round-robin to the users' "
          f"models (bits {bits}), one worker; cold users: {cold} users evicted, one unlabelled "
          "message each, then a second; latency from XADD to the output (Redis clock), "
          "median (max)")
    print(format_table(["models", "start s", "--replica-memory MiB", "msg/s",
                        "worker CPU us/msg", "RSS MiB before messages", "RSS MiB after",
                        "peak RSS MiB", "cold user: 1st message ms", "2nd message ms"], rows))
    if duties_s > 0:
        print_duties(users, bits, replica_memory, duties_s)


def run_duties(n_users: int, bits: int, replica_memory: int, seconds: float,
               timeout: float = 1800.0) -> dict[str, float]:
    """One worker serving ``n_users`` idle models at the default duty periods
    (``--duties``): for ``seconds`` after its start, every 5 s, the oldest of its
    heartbeats (``stale_s``, 30 s, is when other workers take its models as dead); and its
    CPU share meanwhile."""
    import msgpack

    names = [f"u{i}" for i in range(n_users)]
    options = {"replica_memory": replica_memory, "token_names": 0, "model_metrics": False}
    ages: list[float] = []
    with RedisServer() as server:
        client = server.client()
        with workers(server.url, [[spec(n, bits) for n in names]], 1, options) as procs:
            if not wait_blocked(client, 1, timeout, procs):
                raise RuntimeError(f"the worker did not start in {timeout}s")
            cpu0, t0 = cpu_seconds(procs[0].pid), time.monotonic()
            while time.monotonic() - t0 < seconds:
                time.sleep(5.0)
                pipe = client.pipeline(transaction=False)
                for name in names:
                    pipe.hget(f"streamnb:{{{name}}}:workers", "w0")
                now = time.time()
                ages.append(max(now - msgpack.unpackb(v)["ts"] if v else float("inf")
                                for v in pipe.execute()))
            cpu = (cpu_seconds(procs[0].pid) - cpu0) / (time.monotonic() - t0)
    return {"max_age_s": max(ages), "median_age_s": statistics.median(ages), "cpu": cpu}


def print_duties(users: Sequence[int], bits: int, replica_memory: int, seconds: float) -> None:
    rows = []
    for n in users:
        d = run_duties(n, bits, replica_memory, seconds)
        rows.append([f"{n:,} users", f"{d['max_age_s']:.1f}", f"{d['median_age_s']:.1f}",
                     f"{100 * d['cpu']:.0f}%"])
    print()
    print(f"An idle worker at the default duty periods, {seconds:.0f} s after its start: its "
          "oldest heartbeat every 5 s (others take it as dead past stale_s, 30 s)")
    print(format_table(["models", "oldest heartbeat s: max", "median", "worker CPU"], rows))
