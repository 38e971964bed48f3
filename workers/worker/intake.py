"""How a worker gets its entries from ``{M}:in`` (its consumer group made if need be):
new ones (``XREADGROUP >``), read for several models at once, or ahead of a commit, or
behind it (the reply of the read a pipelined commit carries); its own pending ones after
a (re)start, idle ones of other consumers (``XAUTOCLAIM``), how often each was delivered,
and whether a model's stream is done; the read of the next batch sent behind a commit
(workers/store/scripts/read.lua): its commands, and what their reply holds.

>>> import fakeredis
>>> from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.lua import packaged_script
>>> r, k = fakeredis.FakeRedis(), ModelKeys("doc")
>>> r.xgroup_create(k.input, GROUP, id="0", mkstream=True)
True
>>> eid = r.xadd(k.input, {"data": b"x"})
>>> (stream, entries), = read_new(r, "w1", [k.input], count=10, block_ms=0)
>>> len(entries), delivery_counts(r, k, "w1", entries), all_done(r, k)
(1, {...: 1}, False)
>>> eid = r.xadd(k.input, {"data": b"x"}).decode()
>>> READ_SCRIPT.load(r)
>>> field, entries = read_reply(read_now(r, k, "w1", 10, announce=True))
>>> field == f"w1|{eid}", entries == [(eid.encode(), {b"data": b"x"})]
(True, True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from streamnb.exceptions import StreamnbError
from streamnb_workers.replication.ordering import InflightBoard, announcement_time
from streamnb_workers.store.commit import read_replies
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.lua import packaged_script
from streamnb_workers.store.training import forward, train_stream
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import first_id, parse_id

__all__ = ["READ_SCRIPT", "read_commands", "read_now", "read_reply", "all_done", "claim_idle", "delivery_counts", "ensure_group", "read_new",
           "read_pending", "ReadBatch", "read_batches", "read_behind", "read_models", "read_each", "read_next",
           "in_stream_order", "move_training", "training_done"]

#: A model, as far as the order of batches goes (it has a ``name``).
Held = TypeVar("Held")

#: Announces the batch that the read behind it in one MULTI returns (workers/store/scripts/read.lua).
READ_SCRIPT = packaged_script("read.lua")


def read_commands(keys: ModelKeys, consumer: str, count: int, announce: bool,
                  now: float | None = None) -> list[list[Any]]:
    """The commands reading this consumer's next batch of at most ``count`` new entries:
    a plain ``XREADGROUP``, and with ``announce`` the script announcing the batch in
    ``{M}:inflight`` (workers/store/scripts/read.lua, as
    :meth:`~streamnb_workers.replication.ordering.InflightBoard.announcement` does) ahead of it, the two in one
    ``MULTI``. :func:`read_reply` reads the reply of the last command (the ``EXEC``); a
    script not loaded (NOSCRIPT, e.g. after a restart of Redis) fails alone in it, and the
    read still runs: the caller then announces the batch itself and loads the script."""
    xread = ["XREADGROUP", "GROUP", GROUP, consumer, "COUNT", int(count), "STREAMS", keys.input, ">"]
    if not announce:
        return [xread]
    script = ["EVALSHA", READ_SCRIPT.sha, 2, keys.input, keys.inflight, GROUP, consumer,
              int(count), announcement_time(time.time() if now is None else now)]
    return [["MULTI"], script, xread, ["EXEC"]]


def read_now(client: Any, keys: ModelKeys, consumer: str, count: int, announce: bool,
             now: float | None = None) -> Any:
    """:func:`read_commands` sent and answered at once (raw replies, as behind a commit);
    the reply for :func:`read_reply`."""
    commands = read_commands(keys, consumer, count, announce, now)
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command(conn.pack_commands(commands))
        return read_replies(conn, len(commands))[-1]
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def read_reply(reply: Any, announced: bool = True,
               ) -> tuple[str | None, list[tuple[Any, dict[Any, Any]]]]:
    """The announcement field (None: not announced) and the entries, ``(id, {field:
    value})`` as redis-py's XREADGROUP gives them, of the last reply of
    :func:`read_commands` with ``announce=announced``: the ``EXEC`` (the field, then the
    read's reply), or the read's reply. Raises the error of a read that failed; a failed
    announcement gives None."""
    field = None
    if announced and not isinstance(reply, Exception):
        announcement, reply = reply
        field = None if isinstance(announcement, Exception) else (as_str(announcement) or None)
    if isinstance(reply, Exception):
        raise reply
    # RESP3 (redis-py 8's default) answers a map of stream -> entries, RESP2 a list of pairs
    streams = reply.items() if isinstance(reply, dict) else reply or ()
    entries = [(eid, dict(zip(flat[::2], flat[1::2], strict=True)))
               for _, got in streams for eid, flat in got]
    return field, entries


def read_new(reader: Any, consumer: str, streams: list[str], count: int, block_ms: int,
             cluster: bool = False) -> list[tuple[str, list]]:
    """Up to ``count`` new entries of each of ``streams`` (the models' ``:in``), waiting
    at most ``block_ms`` (0: not at all) for a first one: ``(stream, entries)`` of the
    streams that had some. On Redis Cluster, several streams (several slots) are read one
    call each: first none waits, so an empty stream never holds up the others; only if
    all were empty does each wait its share of ``block_ms`` in turn, until one has some."""
    block = block_ms if block_ms > 0 else None
    if cluster and len(streams) > 1:
        replies = []
        for stream in streams:
            replies += reader.xreadgroup(GROUP, consumer, {stream: ">"}, count=count) or []
        if block and not any(entries for _, entries in replies):
            per = max(1, block // len(streams))
            for stream in streams:
                replies = reader.xreadgroup(GROUP, consumer, {stream: ">"}, count=count,
                                            block=per) or []
                if any(entries for _, entries in replies):
                    break
    else:
        replies = reader.xreadgroup(GROUP, consumer, {stream: ">" for stream in streams},
                                    count=count, block=block) or []
    return [(as_str(stream), entries) for stream, entries in replies if entries]


def read_pending(client: Any, keys: ModelKeys, consumer: str, count: int) -> list:
    """Up to ``count`` of this consumer's pending entries, oldest first."""
    reply = client.xreadgroup(GROUP, consumer, {keys.input: "0"}, count=count)
    return reply[0][1] if reply else []


def move_training(client: Any, keys: ModelKeys, count: int, training: str) -> str | None:
    """For a model stored with ``training: train``, at most ``count`` entries of its
    ``:train`` moved into ``:in`` (workers/store/training.py); the model's token (None for
    ``training: in``, which has no training stream)."""
    return forward(client, keys, count)[1] if training == "train" else None


def training_done(client: Any, keys: ModelKeys, training: str) -> bool:
    """Nothing waits in the model's ``:train`` (always, for ``training: in``)."""
    return training != "train" or not client.xlen(train_stream(keys))


def claim_idle(client: Any, keys: ModelKeys, consumer: str, min_idle_ms: int, cursor: str,
               count: int) -> tuple[str, list]:
    """Up to ``count`` entries pending longer than ``min_idle_ms`` in any consumer, from
    ``cursor`` on, now this consumer's: (the next cursor, the entries still in the stream)."""
    reply = client.xautoclaim(keys.input, GROUP, consumer, min_idle_time=min_idle_ms,
                              start_id=cursor, count=count)
    return as_str(reply[0]), [e for e in reply[1] if e and e[1] is not None]


def delivery_counts(client: Any, keys: ModelKeys, consumer: str, entries: list) -> dict[str, int]:
    """Entry id -> how many times it was delivered, for ``entries`` pending for
    ``consumer``."""
    if not entries:
        return {}
    ids = [as_str(e[0]) for e in entries]
    rows = client.xpending_range(keys.input, GROUP, min=min(ids, key=parse_id),
                                 max=max(ids, key=parse_id), count=len(ids) * 2 + 10,
                                 consumername=consumer)
    return {as_str(r["message_id"]): int(r["times_delivered"]) for r in rows}


def all_done(client: Any, keys: ModelKeys) -> bool:
    """Every entry of the model's ``:in`` delivered, then none pending, read in that
    order: a batch read between the two reads shows as pending (the other order could
    miss it)."""
    last = client.xrevrange(keys.input, count=1)
    groups = client.xinfo_groups(keys.input)
    g = next(g for g in groups if as_str(g["name"]) == GROUP)
    if last and parse_id(last[0][0]) > parse_id(g["last-delivered-id"]):
        return False
    return int(client.xpending(keys.input, GROUP)["pending"]) == 0


def ensure_group(client: Any, keys: ModelKeys) -> None:
    """Create the consumer group (and the stream) unless present; never clobber a non-stream."""
    t = as_str(client.type(keys.input))
    if t not in ("none", "stream"):
        raise StreamnbError(f"{keys.input} is a {t}, not a stream; refusing to touch it")
    try:
        client.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


@dataclass(frozen=True, slots=True)
class ReadBatch:
    """Entries read ahead of their turn, and their ``:inflight`` announcement (None: not
    announced)."""

    entries: list
    announced: str | None


def read_batches(reader: Any, consumer: str, models: list[tuple[ModelKeys, InflightBoard]],
                 count: int, block_ms: int, cluster: bool, announce: bool = False,
                 ) -> tuple[list[tuple[int, ReadBatch]], float]:
    """New entries of ``models`` (each model's keys and ``{M}:inflight`` board), in one
    read (one per model on a cluster): ``(index in models, batch)`` of those that had
    some, and the seconds the read took. ``announce``: each batch announced on its
    board right after the read (workers/replication/ordering.py; a worker serving several
    models holds their batches until it processes them in turn, and must not hold them
    unannounced)."""
    t0 = time.perf_counter()
    got = read_new(reader, consumer, [keys.input for keys, _ in models], count, block_ms,
                   cluster)
    seconds = time.perf_counter() - t0
    index = {keys.input: i for i, (keys, _) in enumerate(models)}
    out = []
    for stream, entries in got:
        i = index[stream]
        field = models[i][1].announce(first_id(entries), len(entries)) if announce else None
        out.append((i, ReadBatch(entries, field)))
    return out, seconds


def read_next(reader: Any, consumer: str, keys: ModelKeys, count: int,
              board: InflightBoard | None) -> tuple[ReadBatch | None, list[list[Any]]]:
    """This consumer's next batch of the model (``keys``), read at once without waiting,
    ahead of a commit: behind the commit's script the read would wait for it (Redis
    answers the commands of one write together). With ``board``, the batch's
    announcement is the command returned, which the commit's write carries ahead of its
    script. ``(None, [])`` when nothing is new."""
    got = read_new(reader, consumer, [keys.input], count, block_ms=0)
    entries = [e for _, es in got for e in es]
    if not entries:
        return None, []
    if board is None:
        return ReadBatch(entries, None), []
    announced, command = board.announcement(first_id(entries), len(entries))
    return ReadBatch(entries, announced), [command]


def read_behind(reply: Any, client: Any, board: InflightBoard | None) -> ReadBatch:
    """The batch read behind a commit (workers/worker/intake.py ``read_commands``,
    announced on ``board`` if given) from the reply of the read's last command; raises
    the error of a read that failed. A batch whose announcement failed (the script not
    loaded: e.g. Redis restarted) is announced now, in a round trip of its own, and the
    script loaded for the next time."""
    field, entries = read_reply(reply, announced=board is not None)
    if board is not None:
        if field is None and entries:
            field = board.announce(first_id(entries), len(entries))
            READ_SCRIPT.load(client)
        if field is not None:
            board.fields.add(field)
    return ReadBatch(entries, field)


def in_stream_order(batches: list[tuple[Held, ReadBatch]]) -> list[tuple[Held, ReadBatch]]:
    """Batches of several models (``(model, batch)``, a model having a ``name``) in one
    order every worker agrees on: by first entry id, then model name. A worker processing what it holds in that order never waits (for an
    earlier batch of the same model, workers/replication/ordering.py) on a worker that waits on it:
    a cycle would need a batch both before and after another in this order.

    >>> class M:  # a model's runtime, as far as the order goes
    ...     def __init__(self, name): self.name = name
    >>> held = [(M("b"), ReadBatch([(b"9-0", {})], None)), (M("a"), ReadBatch([(b"9-0", {})], None)),
    ...         (M("c"), ReadBatch([(b"10-0", {}), (b"2-0", {})], None))]
    >>> [rt.name for rt, _ in in_stream_order(held)]
    ['c', 'a', 'b']
    """
    return sorted(batches, key=lambda b: (parse_id(first_id(b[1].entries)), b[0].name))


def read_models(reader: Any, consumer: str, rts: list[Any], count: int, block_ms: int,
                cluster: bool, announce: bool) -> list[tuple[Any, ReadBatch]]:
    """New entries of the models ``rts`` (:func:`read_batches`; each a ``ModelRuntime``), the
    read's time observed in each model's ``read`` stage that got some."""
    got, seconds = read_batches(reader, consumer, [(rt.keys, rt.inflight) for rt in rts],
                                count, block_ms, cluster, announce)
    for i, _ in got:
        read = rts[i].stage("read", summed=True)
        read.add(seconds)
        read.observe()
    return [(rts[i], batch) for i, batch in got]


def read_each(guard: Any, reader: Any, consumer: str, rts: list[Any], count: int, wait_ms: int,
              announce: bool) -> list[tuple[Any, ReadBatch]]:
    """New entries of each model of ``rts`` on a cluster, a read each run by ``guard``
    (workers/worker/outages.py ``ModelGuard``): none waits unless all were empty, then each
    its share of ``wait_ms``."""
    got: list[tuple[Any, ReadBatch]] = []
    for rt in rts:
        got += guard(rt, read_models, reader, consumer, [rt], count, 0, True, announce) or []
    if got or not wait_ms:
        return got
    for rt in guard.serving(rts):
        got = guard(rt, read_models, reader, consumer, [rt], count,
                    max(1, wait_ms // len(rts)), True, announce) or []
        if got:
            break
    return got
