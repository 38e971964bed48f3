"""The read of a worker's next batch sent behind its commit (workers/store/scripts/read.lua): the
commands, and what their reply holds.

>>> import fakeredis
>>> from streamnb_workers.store.keys import GROUP, ModelKeys
>>> r, k = fakeredis.FakeRedis(), ModelKeys("doc")
>>> r.xgroup_create(k.input, GROUP, id="0", mkstream=True)
True
>>> eid = r.xadd(k.input, {"data": b"x"}).decode()
>>> READ_SCRIPT.load(r)
>>> field, entries = read_reply(read_now(r, k, "w1", 10, announce=True))
>>> field == f"w1|{eid}", entries == [(eid.encode(), {b"data": b"x"})]
(True, True)
"""

from __future__ import annotations

import time
from typing import Any

from streamnb_workers.replication.ordering import announcement_time
from streamnb_workers.store.commit import read_replies
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.lua import packaged_script
from streamnb_workers.wire.replies import as_str

__all__ = ["READ_SCRIPT", "read_commands", "read_now", "read_reply"]

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
