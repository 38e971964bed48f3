"""The empty consumer: the same batches a worker reads, read and acknowledged by a process
that does nothing else. The ceiling of one Python consumer of a stream on this host in
this hour, against which benchmark 3 gives every worker's rate as a share.

One process (forked, as a worker is its own process) reads the pre-filled stream through
a consumer group in batches of the worker's size (``XREADGROUP ... COUNT 200``, redis-py
with hiredis, as a worker), decodes every entry with ``msgpack.unpackb`` (what any Python
consumer of the wire format does; the worker's own codec is part of the worker's cost) and
``XACK``s the batch; nothing is written back. Its rate and its CPU a message are timed
inside the process, from its first read to its last acknowledgement.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EmptyConsumer", "empty_consumer"]

#: The worker's default batch (WorkerOptions.batch).
BATCH = 200


@dataclass(frozen=True)
class EmptyConsumer:
    """Messages read, msg/s and CPU us a message of one run of the empty consumer."""

    messages: int
    per_second: float
    cpu_us: float


def _consume(url: str, stream: str, group: str, total: int, batch: int, out: Any) -> None:
    import msgpack
    import redis

    client = redis.Redis.from_url(url)
    client.ping()  # connected before the clock starts
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    while n < total:
        reply = client.xreadgroup(group, "empty", {stream: ">"}, count=batch)
        if not reply or not reply[0][1]:
            break
        entries = reply[0][1]
        for _, fields in entries:
            msgpack.unpackb(fields[b"data"], raw=False, strict_map_key=False)
        client.xack(stream, group, *[eid for eid, _ in entries])
        n += len(entries)
    out.put((n, time.perf_counter() - t0, time.process_time() - c0))


def empty_consumer(client: Any, url: str, stream: str, messages: Sequence[bytes],
                   batch: int = BATCH, timeout: float = 600.0) -> EmptyConsumer:
    """Fill ``stream`` with ``messages`` (through ``client``), then read, decode and
    acknowledge them all in one process of their own (on redis-server ``url``).

    >>> from benchmarks._common import RedisServer
    >>> from streamnb_workers.wire.codec import encode_input
    >>> with RedisServer() as server:
    ...     r = empty_consumer(server.client(), server.url, "s", [encode_input("tokens", ["a"])] * 450)
    >>> r.messages, r.per_second > 0
    (450, True)
    """
    import multiprocessing

    group = "empty"
    for i in range(0, len(messages), 1000):
        pipe = client.pipeline(transaction=False)
        for m in messages[i:i + 1000]:
            pipe.xadd(stream, {"data": m})
        pipe.execute()
    client.xgroup_create(stream, group, id="0", mkstream=True)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_consume, args=(url, stream, group, len(messages), batch, out))
    proc.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                n, seconds, cpu_s = out.get(timeout=1.0)
                break
            except queue.Empty:
                if proc.exitcode not in (None, 0) or time.monotonic() > deadline:
                    raise RuntimeError("the empty consumer failed (its traceback is above)") from None
    finally:
        proc.join(5)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
    return EmptyConsumer(n, n / seconds if seconds > 0 else 0.0, 1e6 * cpu_s / max(1, n))
