"""The atomic commit of a batch: workers/store/scripts/commit.lua and the one place its arguments are
built (:func:`script_args`).

One script call per batch: it checks that every entry id is still pending for this
consumer and that every delayed-label compare-and-set still holds; only then does it
append the delta to ``:log`` (plus decay events every K learnt messages), the predictions
to ``:out``, the dead letters to ``:dead``, write the feature cache, XACK the ids and,
if asked, delete the batch's ``:inflight`` announcement.
It records the learn-once keys of the messages it learns, rewrites those it relearns under
another label and deletes those it forgets (workers/wire/learn_keys.py), after checking
that none of the first is recorded and each of the others still holds the record the
worker subtracts. A class removal (``streamnb forget --class``) appends its log entry after
the delta and releases the keys recorded under the class.
Otherwise it writes nothing and says which ids were lost, which cache entries changed or
which keys are not as the worker took them.

:func:`send_commit` sends the same call without waiting for its reply (on a connection of
its own, read later by :meth:`SentCommit.result`), so a worker can decode and featurize
its next batch while Redis runs the script. hiredis packs the command.

>>> import fakeredis
>>> from streamnb_workers.store.keys import GROUP, ModelKeys
>>> r, k = fakeredis.FakeRedis(), ModelKeys("doc")
>>> r.xgroup_create(k.input, GROUP, id="0", mkstream=True)
True
>>> eid = r.xadd(k.input, {"data": b"x"}).decode()
>>> _ = r.xreadgroup(GROUP, "w1", {k.input: ">"})
>>> res = commit_batch(r, k, "w1", CommitRequest(ids=[eid], outputs=[b"p"], log_data=b"d"))
>>> res.ok, r.xlen(k.log), r.xpending(k.input, GROUP)["pending"]
(True, 1, 0)
>>> commit_batch(r, k, "w1", CommitRequest(ids=[eid])).lost == [eid]  # replay: no-op
True
>>> sent = send_commit(r, k, "w1", CommitRequest(ids=[eid]))  # the same, reply read later
>>> sent.result().lost == [eid]
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import hiredis
import redis

from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.lua import LuaScript, packaged_script
from streamnb_workers.wire.replies import as_str

__all__ = ["COMMIT_SCRIPT", "CacheCas", "CacheWrite", "CommitRequest", "CommitResult",
           "LuaScript", "SentCommit", "commit_batch", "read_replies", "script_args",
           "send_commit"]

COMMIT_SCRIPT = packaged_script("commit.lua")


@dataclass(slots=True)
class CacheWrite:
    """Cache entries of a batch for one bucket hash (workers/store/label_cache.py): ``HSET key
    field entry field entry ...``, then ``PEXPIRE key ttl_ms``."""

    key: str
    ttl_ms: int
    #: field, entry, field, entry, ...
    values: list[Any]


@dataclass(slots=True)
class CacheCas:
    """Replace the cache entry ``field`` of hash ``key``, if it still holds the bytes
    ``expected`` (else: conflict), by ``new``. Both entries are built by
    workers/store/label_cache.py, which alone knows what they hold."""

    key: str
    field: str
    expected: bytes
    new: bytes


@dataclass(slots=True)
class CommitRequest:
    """Everything one batch writes. ``log_data`` None: no delta (nothing learnt)."""

    ids: list[str]
    outputs: list[bytes] = field(default_factory=list)
    dead: list[bytes] = field(default_factory=list)
    log_data: bytes | None = None
    n_learnt: int = 0
    cache_writes: list[CacheWrite] = field(default_factory=list)
    cache_cas: list[CacheCas] = field(default_factory=list)
    #: ``({M}:cachebuckets, width field, "ttl:time")``: the bucket width the writes use,
    #: recorded with them (workers/store/label_cache.py); None: no record.
    cache_registry: tuple[str, str, str] | None = None
    decay_every: int = 0
    decay_data: bytes = b""
    #: ``{M}:inflight``: withdraw the batch's announcement in the same commit, so a
    #: worker woken by the log entry never still sees it (workers/replication/ordering.py).
    inflight_key: str | None = None
    #: The announcement's field in ``inflight_key`` (default: the consumer name).
    inflight_field: str | None = None
    #: ``({M}:keys, {M}:keyorder)``: where learnt keys are recorded; None: no learn-once
    #: keys (then ``learn_keys`` and ``forget_keys`` are empty).
    key_store: tuple[str, str] | None = None
    #: ``(key, record)`` to record, each checked absent first (workers/wire/learn_keys.py).
    learn_keys: list[tuple[str, bytes]] = field(default_factory=list)
    #: ``(key, record)`` to delete, each checked to hold that record first.
    forget_keys: list[tuple[str, bytes]] = field(default_factory=list)
    #: ``(key, record, new record)`` of a learnt key relearnt under another label: checked
    #: to hold ``record`` first, then rewritten.
    relabel_keys: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    #: Keys kept at most (the oldest learnt are dropped beyond it; 0: no bound).
    keys_max: int = 0
    #: ``(log entry, record prefix)`` of each class removed: the entry is logged after the
    #: delta, and every learnt key whose record holds the prefix after its first byte is released
    #: (workers/wire/learn_keys.py, ``record_prefix``; needs ``key_store``).
    class_drops: list[tuple[bytes, bytes]] = field(default_factory=list)
    #: ``({M}:epochs, sources)``: a source forgotten by one of ``class_drops``' entries
    #: (``{"t": "forget"}``) counts its epoch up there, once per name listed.
    source_bumps: tuple[str, list[str]] | None = None


@dataclass(slots=True)
class CommitResult:
    """``log_id`` on success ("" if nothing was logged), else the lost ids or conflicts.

    On success also ``delta_id``, the id of the batch's delta entry ("" if none), and
    ``prev_id``, the id of ``:log``'s last entry before the commit wrote to it ("" if it
    was empty or nothing was written): a replica at ``prev_id`` may apply the delta it
    sent as the entry ``delta_id`` without reading it back (:meth:`Replica.apply_own`)."""

    log_id: str | None = None
    lost: list[str] = field(default_factory=list)
    conflicts: list[int] = field(default_factory=list)
    prev_id: str = ""
    delta_id: str = ""
    #: Learn-once keys not as the worker took them (learnt meanwhile, or forgotten):
    #: nothing was written; read them again and rebuild.
    keys: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.log_id is not None


def script_args(keys: ModelKeys, consumer: str, req: CommitRequest, out_maxlen: int,
                dead_maxlen: int) -> tuple[list[str], list[Any]]:
    """The commit script's KEYS and ARGV for ``req``.

    KEYS: ``:in``, ``:out``, ``:dead``, ``:log``, ``:learnt``, then the bucket hash of
    each cache write, the hash of each compare-and-set, ``{M}:cachebuckets`` (with a
    registry record) and ``{M}:inflight`` (with an announcement to delete).

    ARGV: the number of named values, then ``name value`` pairs, then the lists. The
    script reads the pairs into a table by name; the names:

    - ``group``, ``consumer``: whose pending entries the ids must be;
    - ``out_maxlen``, ``dead_maxlen``: ``MAXLEN ~`` of ``:out`` and ``:dead`` (0: none);
    - ``log_data``: the delta log entry ("" : none); ``n_learnt``: messages learnt, added
      to ``:learnt``; ``decay_every``, ``decay_data``: a decay entry each time ``:learnt``
      crosses a multiple of ``decay_every`` (0: never);
    - ``ids_at``/``n_ids``, ``outputs_at``/``n_outputs``, ``dead_at``/``n_dead``: where
      the entry ids, the outputs and the dead letters start in ARGV, and how many;
    - ``writes_at``/``n_writes``: the cache writes, each its TTL (ms), its number v of
      values and v values (field, entry, ...); ``write_keys_at``: the first one's key;
    - ``cas_at``/``n_cas``: the compare-and-sets, each field, entry read, entry to write;
      ``cas_keys_at``: the first one's key;
    - ``registry_key_at``, ``registry_field``, ``registry_value``: the bucket registry's
      record (position 0: none);
    - ``inflight_key_at``, ``inflight_field``: the announcement the commit deletes, also
      named by the delta's log entry (field ``inflight``; position 0, "": none);
    - ``keys_key_at``, ``keyorder_key_at``: ``{M}:keys`` and ``{M}:keyorder`` (0: no
      learn-once keys); ``learn_at``/``n_learn``: the keys learnt, each key and record
      (none may be recorded yet); ``forget_at``/``n_forget``: the keys forgotten, each key
      and the record it must still hold; ``relabel_at``/``n_relabel``: keys relearnt
      under another label, each key, the record it must still hold and the record written;
      ``keys_max``: keys kept at most (0: no bound);
    - ``drops_at``/``n_drops``: the classes removed, each its log entry (appended after
      the delta and the decay events) and the prefix of the records of the keys it
      releases (deleted from ``{M}:keys`` and ``{M}:keyorder``);
    - ``epochs_key_at``, ``bumps_at``/``n_bumps``: ``{M}:epochs`` and the sources whose
      epoch a forget among the drops counts up (0: none).
    """
    script_keys = [keys.input, keys.out, keys.dead, keys.log, keys.learnt]
    write_keys_at = len(script_keys) + 1
    script_keys += [w.key for w in req.cache_writes]
    cas_keys_at = len(script_keys) + 1
    script_keys += [c.key for c in req.cache_cas]
    registry_key_at = inflight_key_at = 0
    registry_field = registry_value = ""
    if req.cache_registry is not None:
        registry_key, registry_field, registry_value = req.cache_registry
        script_keys.append(registry_key)
        registry_key_at = len(script_keys)
    inflight_field = ""
    if req.inflight_key:
        script_keys.append(req.inflight_key)
        inflight_key_at = len(script_keys)
        inflight_field = req.inflight_field or consumer
    keys_key_at = 0
    if req.key_store is not None:
        script_keys += req.key_store
        keys_key_at = len(script_keys) - 1
    epochs_key_at, bumps = 0, []
    if req.source_bumps is not None and req.source_bumps[1]:
        script_keys.append(req.source_bumps[0])
        epochs_key_at, bumps = len(script_keys), req.source_bumps[1]

    lists: list[Any] = [*req.ids, *req.outputs, *req.dead]
    writes_at = len(lists)
    for w in req.cache_writes:
        lists += (int(w.ttl_ms), len(w.values), *w.values)
    cas_at = len(lists)
    for c in req.cache_cas:
        lists += (c.field, c.expected, c.new)
    learn_at = len(lists)
    for key, record in req.learn_keys:
        lists += (key, record)
    forget_at = len(lists)
    for key, record in req.forget_keys:
        lists += (key, record)
    relabel_at = len(lists)
    for key, record, new in req.relabel_keys:
        lists += (key, record, new)
    drops_at = len(lists)
    for entry, prefix in req.class_drops:
        lists += (entry, prefix)
    bumps_at = len(lists)
    lists += bumps
    named = {
        "group": GROUP, "consumer": consumer,
        "out_maxlen": int(out_maxlen), "dead_maxlen": int(dead_maxlen),
        "log_data": req.log_data or b"", "n_learnt": int(req.n_learnt),
        "decay_every": int(req.decay_every), "decay_data": req.decay_data,
        "ids_at": 0, "n_ids": len(req.ids),
        "outputs_at": len(req.ids), "n_outputs": len(req.outputs),
        "dead_at": len(req.ids) + len(req.outputs), "n_dead": len(req.dead),
        "writes_at": writes_at, "n_writes": len(req.cache_writes), "write_keys_at": write_keys_at,
        "cas_at": cas_at, "n_cas": len(req.cache_cas), "cas_keys_at": cas_keys_at,
        "registry_key_at": registry_key_at, "registry_field": registry_field,
        "registry_value": registry_value,
        "inflight_key_at": inflight_key_at, "inflight_field": inflight_field,
        "keys_key_at": keys_key_at, "keyorder_key_at": keys_key_at + 1 if keys_key_at else 0,
        "learn_at": learn_at, "n_learn": len(req.learn_keys),
        "forget_at": forget_at, "n_forget": len(req.forget_keys),
        "relabel_at": relabel_at, "n_relabel": len(req.relabel_keys),
        "keys_max": int(req.keys_max),
        "drops_at": drops_at, "n_drops": len(req.class_drops),
        "epochs_key_at": epochs_key_at, "bumps_at": bumps_at, "n_bumps": len(bumps),
    }
    first = 2 + 2 * len(named)  # where the lists start (Lua counts from 1)
    for name in ("ids_at", "outputs_at", "dead_at", "writes_at", "cas_at", "learn_at",
                 "forget_at", "relabel_at", "drops_at", "bumps_at"):
        named[name] += first
    args: list[Any] = [len(named)]
    for name, value in named.items():
        args += (name, value)
    args += lists
    return script_keys, args


def _result(reply: Any) -> CommitResult:
    status = as_str(reply[0])
    if status == "ok":
        return CommitResult(log_id=as_str(reply[1]), prev_id=as_str(reply[2]),
                            delta_id=as_str(reply[3]))
    if status == "lost":
        return CommitResult(lost=[as_str(v) for v in reply[1:]])
    if status == "conflict":
        return CommitResult(conflicts=[int(as_str(v)) for v in reply[1:]])
    if status == "keys":
        return CommitResult(keys=[as_str(v) for v in reply[1:]])
    raise RuntimeError(f"unexpected reply from the commit script: {reply!r}")


def commit_batch(client: Any, keys: ModelKeys, consumer: str, req: CommitRequest,
                 out_maxlen: int = 0, dead_maxlen: int = 0) -> CommitResult:
    """Run the commit script for one batch; see the module docstring."""
    script_keys, args = script_args(keys, consumer, req, out_maxlen, dead_maxlen)
    return _result(COMMIT_SCRIPT(client, script_keys, args))


def read_replies(conn: Any, n: int) -> list[Any]:
    """The next ``n`` replies on ``conn``, a command's error as its reply (an exception
    object): the commands of one write are answered in step, whatever each one gives."""
    replies: list[Any] = []
    for _ in range(n):
        try:
            replies.append(conn.read_response())
        except redis.exceptions.ResponseError as exc:
            replies.append(exc)
    return replies


class SentCommit:
    """A commit script call on the wire: :meth:`result` reads its reply (once).

    The call has a connection of the client's pool to itself until then, so the client
    stays usable meanwhile (its commands run in Redis after the script). :meth:`abandon`
    drops the connection without reading: the script ran whole or not at all, and the
    batch's ids say which (acknowledged, or still pending). Commands ``after`` go in the
    same write, behind the script (e.g.
    :func:`streamnb_workers.worker.intake.read_commands`); :meth:`result` keeps their replies
    in :attr:`after` (an exception object for a command that failed).
    """

    __slots__ = ("client", "conn", "script_keys", "args", "done", "n_after", "after")

    def __init__(self, client: Any, script_keys: list[str], args: list[Any],
                 after: list[list[Any]] | None = None) -> None:
        self.client, self.script_keys, self.args = client, script_keys, args
        self.done: CommitResult | None = None
        self.conn: Any = None
        self.n_after = len(after or ())
        self.after: list[Any] = []
        pool = getattr(client, "connection_pool", None)
        if pool is None or not hasattr(pool, "get_connection"):
            raise TypeError("send_commit needs a client with a connection pool (on Redis "
                            "Cluster the worker commits with commit_batch, unpipelined)")
        conn = pool.get_connection()
        commit = ["EVALSHA", COMMIT_SCRIPT.sha, len(script_keys), *script_keys, *args]
        try:
            conn.send_packed_command([hiredis.pack_command(tuple(command))
                                      for command in (commit, *(after or ()))])
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        self.conn = conn

    def result(self) -> CommitResult:
        """Wait for the reply (loading the script on NOSCRIPT, e.g. after a restart)."""
        if self.done is not None:
            return self.done
        conn, self.conn = self.conn, None
        if conn is None:
            raise RuntimeError("the commit was abandoned")
        pool = self.client.connection_pool
        rerun = False
        try:
            try:
                reply = conn.read_response()
            except redis.exceptions.NoScriptError:
                rerun = True  # nothing ran: run it once the replies behind it are read
            self.after = read_replies(conn, self.n_after)
        except BaseException:
            conn.disconnect()  # the reply may still come: never hand this socket out again
            pool.release(conn)
            raise
        pool.release(conn)
        if rerun:
            reply = COMMIT_SCRIPT(self.client, self.script_keys, self.args)
        self.done = _result(reply)
        return self.done

    def abandon(self) -> None:
        """Forget the call without its reply (its connection is closed)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.disconnect()
            finally:
                self.client.connection_pool.release(conn)


def send_commit(client: Any, keys: ModelKeys, consumer: str, req: CommitRequest,
                out_maxlen: int = 0, dead_maxlen: int = 0,
                after: list[list[Any]] | None = None) -> SentCommit:
    """Send the commit script for one batch (the commands ``after`` behind it, in the
    same write); read its result later with :meth:`SentCommit.result`.
    The client needs a connection pool (not Redis Cluster: :func:`commit_batch` there)."""
    script_keys, args = script_args(keys, consumer, req, out_maxlen, dead_maxlen)
    return SentCommit(client, script_keys, args, after)
