"""How a worker gets its entries from ``{M}:in`` (its consumer group made if need be):
new ones (``XREADGROUP >``), read for several models at once, or ahead of a commit, or
behind it (the reply of the read a pipelined commit carries); its own pending ones after
a (re)start, idle ones of other consumers (``XAUTOCLAIM``), how often each was delivered,
and whether a model's stream is done; the read of the next batch sent behind a commit
(workers/store/scripts/read.lua): its commands, and what their reply holds.

>>> import fakeredis
>>> from streamnb_workers.store.keys import GROUP, ModelKeys
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from streamnb.exceptions import StreamnbError
from streamnb_workers.replication.ordering import InflightBoard, announcement_time
from streamnb_workers.replication.read_plan import ReadPlan, entries_bytes
from streamnb_workers.store.commit import read_replies
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.lua import packaged_script
from streamnb_workers.store.training import forward, train_stream
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import first_id, parse_id

__all__ = ["ANNOUNCED_AT_ONCE", "READ_SCRIPT", "ReadBatch", "ReadReply", "all_done", "claim_idle", "delivery_counts",
           "ensure_group", "in_stream_order", "move_training", "node_pool", "parse_read",
           "read_announced", "read_batches", "read_behind", "read_commands", "read_each", "read_groups",
           "read_models", "read_new", "read_next", "read_now", "read_pending", "read_reply",
           "training_done"]

#: A model, as far as the order of batches goes (it has a ``name``).
Held = TypeVar("Held")

#: Announces the batch that the read behind it in one MULTI returns (workers/store/scripts/read.lua).
READ_SCRIPT = packaged_script("read.lua")


def read_commands(keys: ModelKeys | Sequence[ModelKeys], consumer: str, count: int,
                  announce: bool, now: float | None = None) -> list[list[Any]]:
    """The commands reading this consumer's next batch of at most ``count`` new entries
    of each model (``keys``: one model's or several, on one node): one ``XREADGROUP``, and
    with ``announce`` ahead of it the script announcing each model's batch in
    ``{M}:inflight`` (workers/store/scripts/read.lua, as
    :meth:`~streamnb_workers.replication.ordering.InflightBoard.announcement` does), all in
    one ``MULTI``. :func:`parse_read` reads the reply of the last command (the ``EXEC``);
    a script not loaded (NOSCRIPT, e.g. after a restart of Redis) fails alone in it, and
    the read still runs: the caller then announces the batch itself and loads the script."""
    models = [keys] if isinstance(keys, ModelKeys) else list(keys)
    xread = ["XREADGROUP", "GROUP", GROUP, consumer, "COUNT", int(count), "STREAMS",
             *(k.input for k in models), *(">" for _ in models)]
    if not announce:
        return [xread]
    ts = announcement_time(time.time() if now is None else now)
    scripts = [["EVALSHA", READ_SCRIPT.sha, 2, k.input, k.inflight, GROUP, consumer, int(count), ts]
               for k in models]
    return [["MULTI"], *scripts, xread, ["EXEC"]]


def read_now(client: Any, keys: ModelKeys | Sequence[ModelKeys], consumer: str, count: int,
             announce: bool, now: float | None = None) -> Any:
    """:func:`read_commands` sent and answered at once (raw replies, as behind a commit);
    the reply for :func:`parse_read`. On Redis Cluster, on the node of the models' slot."""
    commands = read_commands(keys, consumer, count, announce, now)
    first = keys if isinstance(keys, ModelKeys) else keys[0]
    pool = node_pool(client, first.input)
    conn = pool.get_connection()
    try:
        conn.send_packed_command(conn.pack_commands(commands))
        return read_replies(conn, len(commands))[-1]
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def node_pool(client: Any, key: str) -> Any:
    """The connection pool of the node serving ``key``: the client's own, or on Redis
    Cluster that of the key's node (a ``MULTI`` of one slot's keys runs there)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        return pool
    return client.get_node_from_key(key).redis_connection.connection_pool


@dataclass(frozen=True, slots=True)
class ReadReply:
    """What a read of :func:`read_commands` gave: per model, the announcement field (None:
    not announced) and the group's last delivered id the script saw ("": unknown); the
    entries by stream name, ``(id, {field: value})`` as redis-py's XREADGROUP gives them."""

    announced: list[str | None]
    last: list[str]
    entries: dict[str, list[tuple[Any, dict[Any, Any]]]]


def parse_read(reply: Any, n_models: int = 1, announced: bool = True) -> ReadReply:
    """The last reply of :func:`read_commands` for ``n_models`` models, with
    ``announce=announced``: the ``EXEC`` (each script's reply, then the read's), or the
    read's reply. Raises the error of a read that failed; a failed announcement gives None.
    """
    fields: list[str | None] = [None] * n_models
    last = [""] * n_models
    if announced and not isinstance(reply, Exception):
        *scripts, reply = reply
        for i, answer in enumerate(scripts):
            if not isinstance(answer, Exception):
                fields[i] = as_str(answer[0]) or None
                last[i] = as_str(answer[1])
    if isinstance(reply, Exception):
        raise reply
    # RESP3 (redis-py 8's default) answers a map of stream -> entries, RESP2 a list of pairs
    streams = reply.items() if isinstance(reply, dict) else reply or ()
    entries = {as_str(stream): [(eid, dict(zip(flat[::2], flat[1::2], strict=True)))
                                for eid, flat in got]
               for stream, got in streams}
    return ReadReply(fields, last, entries)


def read_reply(reply: Any, announced: bool = True,
               ) -> tuple[str | None, list[tuple[Any, dict[Any, Any]]]]:
    """One model's :func:`parse_read`: its announcement field and its entries."""
    r = parse_read(reply, 1, announced)
    return r.announced[0], [e for got in r.entries.values() for e in got]


#: At most this many models are read in one announced read: the script costs redis-server
#: about 10 us a model (``python -m benchmarks.read_cost``). A worker serving more reads
#: with a plain ``XREADGROUP`` and announces each batch right after, in a round trip of
#: its own (docs/worker.md, "Ordered predictions across workers", says what that leaves).
ANNOUNCED_AT_ONCE = 8


def read_announced(reader: Any, client: Any, consumer: str,
                   models: Sequence[tuple[ModelKeys, InflightBoard]], count: int,
                   block_ms: int) -> list[tuple[int, ReadBatch]]:
    """New entries of ``models`` (each model's keys and ``{M}:inflight`` board, on one
    node), each batch announced in the same step as its read (:func:`read_commands`), so
    a worker that looks at ``:inflight`` after its own read sees every batch delivered
    before (workers/replication/ordering.py). ``(index in models, batch)`` of those that
    had some. With nothing to read, it waits at most ``block_ms`` for an entry after the
    group's last delivered id (``XREAD BLOCK``, which reads nothing), then reads once
    more. More than :data:`ANNOUNCED_AT_ONCE` models: a plain read, each batch announced
    right after it (together, in one round trip). ``client``: loads the script where
    Redis had lost it."""
    if len(models) > ANNOUNCED_AT_ONCE:
        got = read_new(reader, consumer, [keys.input for keys, _ in models], count, block_ms)
        index = {keys.input: i for i, (keys, _) in enumerate(models)}
        out, pipe = [], models[0][1].client.pipeline(transaction=False)
        for stream, entries in got:  # the announcements in one round trip
            field, command = models[index[stream]][1].announcement(first_id(entries), len(entries))
            pipe.execute_command(*command)
            out.append((index[stream], ReadBatch(entries, field)))
        if out:
            pipe.execute()
        return out
    got = _read_announced_once(reader, client, consumer, models, count)
    if got or block_ms <= 0:
        return got
    after = {keys.input: board.delivered for keys, board in models}
    if reader.xread(after, count=1, block=block_ms):
        got = _read_announced_once(reader, client, consumer, models, count)
    return got


def _read_announced_once(reader: Any, client: Any, consumer: str,
                         models: Sequence[tuple[ModelKeys, InflightBoard]], count: int,
                         ) -> list[tuple[int, ReadBatch]]:
    reply = parse_read(read_now(reader, [keys for keys, _ in models], consumer, count, True),
                       len(models))
    out = []
    for i, (keys, board) in enumerate(models):
        entries = reply.entries.get(keys.input)
        field = reply.announced[i]
        if not entries:
            board.delivered = reply.last[i] or board.delivered
            if field is not None:  # (its entries were deleted meanwhile)
                board.withdraw(_announced(board, client, field, entries))
            continue
        board.delivered = as_str(entries[-1][0])
        out.append((i, ReadBatch(entries, _announced(board, client, field, entries))))
    return out


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


def read_batches(reader: Any, client: Any, consumer: str,
                 models: list[tuple[ModelKeys, InflightBoard]], count: int, block_ms: int,
                 cluster: bool, announce: bool = False,
                 ) -> tuple[list[tuple[int, ReadBatch]], float]:
    """New entries of ``models`` (each model's keys and ``{M}:inflight`` board), in one
    read (one per model on a cluster): ``(index in models, batch)`` of those that had
    some, and the seconds the read took. ``announce`` (ordered predictions): each batch
    announced on its board in the same step as its read (:func:`read_announced`; on a
    cluster the caller reads one model at a time)."""
    t0 = time.perf_counter()
    if announce:
        out = read_announced(reader, client, consumer, models, count, block_ms)
    else:
        got = read_new(reader, consumer, [keys.input for keys, _ in models], count, block_ms,
                       cluster)
        index = {keys.input: i for i, (keys, _) in enumerate(models)}
        out = [(index[stream], ReadBatch(entries, None)) for stream, entries in got]
    return out, time.perf_counter() - t0


def read_next(reader: Any, client: Any, consumer: str, keys: ModelKeys, count: int,
              board: InflightBoard | None) -> ReadBatch | None:
    """This consumer's next batch of the model (``keys``), read at once without waiting,
    ahead of a commit (behind the commit's script the read would wait for it: Redis
    answers the commands of one write together); with ``board``, announced in the same
    step. None when nothing is new."""
    if board is not None:
        got = read_announced(reader, client, consumer, [(keys, board)], count, block_ms=0)
        return got[0][1] if got else None
    got = read_new(reader, consumer, [keys.input], count, block_ms=0)
    entries = [e for _, es in got for e in es]
    return ReadBatch(entries, None) if entries else None


def read_behind(reply: Any, client: Any, board: InflightBoard | None) -> ReadBatch:
    """The batch read behind a commit (workers/worker/intake.py ``read_commands``,
    announced on ``board`` if given) from the reply of the read's last command; raises
    the error of a read that failed. A batch whose announcement failed (the script not
    loaded: e.g. Redis restarted) is announced now, in a round trip of its own, and the
    script loaded for the next time."""
    field, entries = read_reply(reply, announced=board is not None)
    if board is not None and (entries or field is not None):
        field = _announced(board, client, field, entries)
    return ReadBatch(entries, field)


def _announced(board: InflightBoard, client: Any, field: str | None, entries: list) -> str:
    """A batch's announcement: ``field`` as the read's script made it, now tracked on
    ``board``; or, where Redis had lost the script (NOSCRIPT: it restarted), made now in a
    round trip of its own, and the script loaded again for the next read."""
    if field is None:
        field = board.announce(first_id(entries), len(entries))
        READ_SCRIPT.load(client)
    else:
        board.fields.add(field)
    return field


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
    got, seconds = read_batches(reader, rts[0].client, consumer,
                                [(rt.keys, rt.inflight) for rt in rts], count, block_ms,
                                cluster, announce)
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


def read_groups(reader: Any, consumer: str, rts: list[Any], count: int, wait_ms: int,
                cluster: bool, announce: bool, plan: ReadPlan | None = None,
                before_read: Callable[[], Any] = lambda: None,
                first: Sequence[tuple[Any, ReadBatch]] = (),
                ) -> Iterator[list[tuple[Any, ReadBatch]]]:
    """New entries of the models ``rts`` (:func:`read_models`), in groups of streams
    within ``plan``'s room (workers/replication/read_plan.py; None: one read), each
    group's batches yielded in stream order (with ``first``, batches already in hand, in
    the first) before the next group is read: the caller empties each list it gets
    (``pop``), so the entries of one group at most are held. ``before_read`` runs before
    each read of several groups (room made for it). After the groups, the streams read
    full at a count below ``count`` are read again (they hold more); a read waits
    (``wait_ms``) only when every group was empty: one read of every stream then, at the
    last group's count."""
    groups = [] if plan is None else plan.groups([rt.name for rt in rts], count)
    alone = len(groups) <= 1  # one read, which waits
    reads = [(list(range(len(rts))), groups[0][1] if groups else count, wait_ms)] if alone \
        else [(index, each, 0) for index, each in groups]
    found, cut, again = bool(first), set(), alone  # cut: came full at a smaller count
    for n_read, (index, each, wait) in enumerate(reads):  # (the list grows: see below)
        named = [rts[i] for i in index]
        if plan is not None:
            before_read()
        got = list(first) + read_models(reader, consumer, named, each, wait, cluster, announce)
        first = ()
        if plan is not None:
            size = sum(entries_bytes(batch.entries)[1] for _, batch in got)
            counts = {rt.name: len(batch.entries) for rt, batch in got}
            plan.observe(((rt.name, counts.get(rt.name, 0)) for rt in named), each, count, size)
            cut.update(name for name, k in counts.items() if each < count and k >= each)
        if got:
            found = True
            yield in_stream_order(got)
        del got
        if alone or n_read + 1 < len(reads):
            continue
        # after the groups: those cut short again (just used), else a read that waits
        hot = [i for i, rt in enumerate(rts) if rt.name in cut and not again]
        if hot:
            again = True
            reads += [([hot[j] for j in sub], k, 0)
                      for sub, k in plan.groups([rts[i].name for i in hot], count)]
        elif not found and wait_ms > 0:
            found = True  # (once)
            reads.append((list(range(len(rts))), groups[-1][1], wait_ms))
