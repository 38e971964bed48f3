"""The atomic commit of a batch (workers/commit.lua) and a small EVALSHA helper.

One script call per batch: it checks that every entry id is still pending for this
consumer and that every delayed-label compare-and-set still holds; only then does it
append the delta to ``:log`` (plus decay events every K learnt messages), the predictions
to ``:out``, the dead letters to ``:dead``, write the feature cache, XACK the ids and,
if asked, delete the batch's ``:inflight`` announcement.
Otherwise it writes nothing and says which ids were lost or which cache entries changed.

:func:`send_commit` sends the same call without waiting for its reply (on a connection of
its own, read later by :meth:`SentCommit.result`), so a worker can decode and featurize
its next batch while Redis runs the script.

>>> import fakeredis
>>> from streamnb_workers.keys import GROUP, ModelKeys
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

import hashlib
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import msgpack
import redis

from streamnb._cmodules import optional_c_module
from streamnb_workers.keys import GROUP, ModelKeys
from streamnb_workers.replies import as_str


class LuaScript:
    """A Lua script run by EVALSHA, loaded (SCRIPT LOAD) on NOSCRIPT, e.g. after a restart."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def load(self, client: Any) -> None:
        """SCRIPT LOAD it (for callers that send EVALSHA themselves)."""
        client.script_load(self.source)

    def __call__(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            self.load(client)
            return client.evalsha(self.sha, len(keys), *keys, *args)


COMMIT_SCRIPT = LuaScript(resources.files("streamnb_workers").joinpath("commit.lua").read_text())
#: Announces the batch that the read behind it in one MULTI returns (workers/read.lua).
READ_SCRIPT = LuaScript(resources.files("streamnb_workers").joinpath("read.lua").read_text())


def read_commands(keys: ModelKeys, consumer: str, count: int, announce: bool,
                  now: float | None = None) -> list[list[Any]]:
    """The commands reading this consumer's next batch of at most ``count`` new entries:
    a plain ``XREADGROUP``, and with ``announce`` the script announcing the batch in
    ``{M}:inflight`` (workers/read.lua, as
    :meth:`~streamnb_workers.ordering.InflightBoard.announcement` does) ahead of it, the two in one
    ``MULTI``. :func:`read_reply` reads the reply of the last command (the ``EXEC``); a
    script not loaded (NOSCRIPT, e.g. after a restart of Redis) fails alone in it, and the
    read still runs: the caller then announces the batch itself and loads the script."""
    xread = ["XREADGROUP", "GROUP", GROUP, consumer, "COUNT", int(count), "STREAMS", keys.input, ">"]
    if not announce:
        return [xread]
    ts = time.time() if now is None else now
    script = ["EVALSHA", READ_SCRIPT.sha, 2, keys.input, keys.inflight, GROUP, consumer,
              int(count), msgpack.packb(float(ts))]
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
    entries = [(eid, flat if isinstance(flat, dict) else dict(zip(flat[::2], flat[1::2], strict=True)))
               for _, got in (reply.items() if isinstance(reply, dict) else reply or ())
               for eid, flat in got]  # (fakeredis, the embedded default, answers it in a MULTI with a map)
    return field, entries


#: ``streamnb_workers._resp.pack_command``: one command in the Redis protocol (bytes), or None
#: (not built, or ``STREAMNB_PURE_PYTHON``): then redis-py packs it, the reference.
PACK_COMMAND = getattr(optional_c_module("streamnb_workers._resp"), "pack_command", None)


@dataclass(slots=True)
class CacheWrite:
    """Cache entries of a batch for one bucket hash (workers/label_cache.py): ``HSET key
    field entry field entry ...``, then ``PEXPIRE key ttl_ms``."""

    key: str
    ttl_ms: int
    #: field, entry, field, entry, ...
    values: list[Any]

    def args(self) -> list[Any]:
        return [int(self.ttl_ms), len(self.values), *self.values]


@dataclass(slots=True)
class CacheCas:
    """Change a cached message's learnt label from ``expected`` to ``new`` (else: conflict).

    ``prefixed``: the value of ``field`` is a bucket entry, which starts with its learnt
    label (workers/label_cache.py); else that value is the label itself (the field
    ``learnt`` of a per-message hash of the layout before buckets)."""

    key: str
    field: str
    expected: bytes
    new: bytes
    prefixed: bool = True

    def args(self) -> list[Any]:
        return ["p" if self.prefixed else "f", self.field, self.expected, self.new]


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
    #: recorded with them (workers/label_cache.py); None: no record.
    cache_registry: tuple[str, str, str] | None = None
    decay_every: int = 0
    decay_data: bytes = b""
    #: ``{M}:inflight``: withdraw the batch's announcement in the same commit, so a
    #: worker woken by the log entry never still sees it (workers/ordering.py).
    inflight_key: str | None = None
    #: The announcement's field in ``inflight_key`` (default: the consumer name).
    inflight_field: str | None = None


@dataclass(slots=True)
class CommitResult:
    """``log_id`` on success ("" if nothing was logged), else the lost ids or conflicts.

    On success also ``delta_id``, the id of the batch's delta entry ("" if none), and
    ``prev_id``, the id of ``:log``'s last entry before the commit wrote to it ("" if it
    was empty or nothing was written): a replica at ``prev_id`` may apply the delta it
    sent as the entry ``delta_id`` without reading it back (:meth:`Replica.apply_own`).
    Both None from a commit script of an older version, which does not say."""

    log_id: str | None = None
    lost: list[str] = field(default_factory=list)
    conflicts: list[int] = field(default_factory=list)
    prev_id: str | None = None
    delta_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.log_id is not None


def _command(keys: ModelKeys, consumer: str, req: CommitRequest, out_maxlen: int,
             dead_maxlen: int) -> tuple[list[str], list[Any]]:
    """The commit script's KEYS and ARGV for ``req`` (layout: workers/commit.lua)."""
    script_keys = [keys.input, keys.out, keys.dead, keys.log, keys.learnt]
    script_keys += [w.key for w in req.cache_writes]
    script_keys += [c.key for c in req.cache_cas]
    registry = req.cache_registry
    if registry is not None:
        script_keys.append(registry[0])
    args: list[Any] = [
        GROUP, consumer, int(out_maxlen), int(dead_maxlen), req.log_data or b"",
        int(req.n_learnt), int(req.decay_every), req.decay_data,
        len(req.ids), len(req.outputs), len(req.dead), len(req.cache_writes),
        len(req.cache_cas), *(registry[1:] if registry is not None else ("", "")),
        *req.ids, *req.outputs, *req.dead,
    ]
    for w in req.cache_writes:
        args += w.args()
    for c in req.cache_cas:
        args += c.args()
    if req.inflight_key:
        script_keys.append(req.inflight_key)
        args.append(req.inflight_field or consumer)
    return script_keys, args


def _result(reply: Any) -> CommitResult:
    status = as_str(reply[0])
    if status == "ok":
        if len(reply) < 4:  # (a script of an older version)
            return CommitResult(log_id=as_str(reply[1]))
        return CommitResult(log_id=as_str(reply[1]), prev_id=as_str(reply[2]),
                            delta_id=as_str(reply[3]))
    if status == "lost":
        return CommitResult(lost=[as_str(v) for v in reply[1:]])
    if status == "conflict":
        return CommitResult(conflicts=[int(as_str(v)) for v in reply[1:]])
    raise RuntimeError(f"unexpected reply from the commit script: {reply!r}")


def commit_batch(client: Any, keys: ModelKeys, consumer: str, req: CommitRequest,
                 out_maxlen: int = 0, dead_maxlen: int = 0) -> CommitResult:
    """Run the commit script for one batch; see the module docstring."""
    script_keys, args = _command(keys, consumer, req, out_maxlen, dead_maxlen)
    return _result(COMMIT_SCRIPT(client, script_keys, args))


class SentCommit:
    """A commit script call on the wire: :meth:`result` reads its reply (once).

    The call has a connection of the client's pool to itself until then, so the client
    stays usable meanwhile (its commands run in Redis after the script). :meth:`abandon`
    drops the connection without reading: the script ran whole or not at all, and the
    batch's ids say which (acknowledged, or still pending). Commands ``before`` go in the
    same write, ahead of the script; their replies are read and dropped by :meth:`result`
    (Redis sends the replies of one write together, after the script: nothing is sent
    there whose reply is needed sooner). Commands ``after`` go behind the script (e.g.
    :func:`read_command`); :meth:`result` keeps their replies in :attr:`after` (an
    exception object for a command that failed).
    """

    __slots__ = ("client", "conn", "script_keys", "args", "done", "n_before", "n_after", "after")

    def __init__(self, client: Any, script_keys: list[str], args: list[Any],
                 before: list[list[Any]] | None = None,
                 after: list[list[Any]] | None = None) -> None:
        self.client, self.script_keys, self.args = client, script_keys, args
        self.done: CommitResult | None = None
        self.conn: Any = None
        self.n_before, self.n_after = len(before or ()), len(after or ())
        self.after: list[Any] = []
        pool = getattr(client, "connection_pool", None)
        if pool is None or not hasattr(pool, "get_connection"):
            raise TypeError("send_commit needs a client with a connection pool (on Redis "
                            "Cluster the worker commits with commit_batch, unpipelined)")
        conn = pool.get_connection()
        commit = ["EVALSHA", COMMIT_SCRIPT.sha, len(script_keys), *script_keys, *args]
        commands = [*(before or ()), commit, *(after or ())]
        try:
            if PACK_COMMAND is None:
                packed = conn.pack_commands(commands)
            else:  # the commit's thousand arguments in one C pass (workers/_resp.c)
                packed = [PACK_COMMAND(command) for command in commands]
            conn.send_packed_command(packed)
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
            # (a failed command ahead is not the commit's business: an announcement goes stale)
            read_replies(conn, self.n_before)
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
                before: list[list[Any]] | None = None,
                after: list[list[Any]] | None = None) -> SentCommit:
    """Send the commit script for one batch (between the commands ``before`` and
    ``after``, in the same write); read its result later with :meth:`SentCommit.result`.
    The client needs a connection pool (not Redis Cluster: :func:`commit_batch` there)."""
    script_keys, args = _command(keys, consumer, req, out_maxlen, dead_maxlen)
    return SentCommit(client, script_keys, args, before, after)
