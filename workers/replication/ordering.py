"""Ordered predictions across workers: wait for earlier labelled batches in flight.

With one worker, message *i* is predicted by a model that has learnt every labelled
message before it (prequential within the batch). With several workers reading one
stream, worker B's batch would otherwise be predicted while worker A is still working on
the batch just before it: B's predictions miss up to a batch of the most recent labels,
and accuracy depends on the number of workers and on timing (SpamAssassin replay: 98.55%
with 1 worker; 98.15-98.58% over 5 runs with 2; docs/performance.md, benchmark 6).

So a worker *announces* each batch it reads (the first entry id and the number of
entries) in the hash ``{M}:inflight``, in a field of its own per batch
(``<consumer>|<first id>``), in the same step as the read: a script
(workers/store/scripts/read.lua) and the ``XREADGROUP`` in one ``MULTI``, whether the
worker reads its next batch, reads one ahead of a pipelined commit, or has the commit
carry the read behind its script (workers/worker/intake.py). So once an entry is
delivered to one worker, its batch is announced, and a worker that looks after its own
read (which delivered later entries) sees it. It withdraws it once decoded if
no message in it has a label, and otherwise in its commit (the commit script deletes the
field, so a worker woken by the new log entry never still sees it). One field per batch,
not per consumer: a worker that reads its next batch while the commit of the previous
one is still running (workers/worker/committing.py) has two batches in flight,
and the commit of the first must not withdraw the second. Before
predicting, a worker looks for announcements of *other* consumers whose batch starts
*before* its own, and waits for them to be committed (blocking on ``:log``, applying
what arrives), at most ``max_wait_s``. The commit's log entry names the announcement it
withdraws, so the wait usually ends on applying that entry, with no further look at the
hash: this wait is on the path from one worker's commit to the next worker's, which
bounds how well workers scale. Then its predictions see the same labels a single
worker's would. (A read and its announcement as two round trips would leave a window,
reached on a loaded host, in which the worker holding the earlier batch has not
announced it yet when the other one looks.)

Unlabelled batches are withdrawn after decoding, so unlabelled traffic waits at most for
a decode; the wait only covers predictions, never what is learnt (exactly-once learning
does not depend on it); an announcement older than ``horizon_s`` (a worker that died
mid-batch) is ignored and removed. There is no deadlock: a worker only waits for batches
that start before its own.

>>> import fakeredis
>>> from streamnb_workers.store.keys import ModelKeys
>>> r, k = fakeredis.FakeRedis(), ModelKeys("doc")
>>> a, b = InflightBoard(r, k, "a"), InflightBoard(r, k, "b")
>>> a.announce("5-0", n_entries=3, now=100.0)
'a|5-0'
>>> b.earlier("9-0", now=100.5), b.earlier("2-0", now=100.5), a.earlier("9-0", now=100.5)
(['a|5-0'], [], [])
>>> b.earlier("9-0", now=200.0)  # stale: ignored (and removed)
[]
>>> r.hgetall(k.inflight)
{}
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import parse_id

__all__ = ["InflightBoard", "OrderWait", "announcement_time", "decode_announcement",
           "encode_announcement", "wait_for_earlier"]

#: An announcement older than this is a worker that died mid-batch: ignored and removed.
DEFAULT_HORIZON_S = 10.0


def announcement_time(ts: float) -> str:
    """An announcement's time as it is written (workers/store/scripts/read.lua writes it as given)."""
    return repr(float(ts))


def encode_announcement(first_id: str, n_entries: int, ts: float) -> bytes:
    """The value of a batch's field in ``{M}:inflight``: ``"<first id> <n> <time>"``, plain
    text, which workers/store/scripts/read.lua writes as well.

    >>> decode_announcement(encode_announcement("5-0", 3, 100.25))
    ('5-0', 3, 100.25)
    """
    return f"{first_id} {int(n_entries)} {announcement_time(ts)}".encode()


def decode_announcement(raw: bytes | str) -> tuple[str, int, float]:
    """``(first id, number of entries, time)`` of an announcement; ValueError if damaged."""
    first, n, ts = as_str(raw).split(" ")
    parse_id(first)
    return first, int(n), float(ts)


class InflightBoard:
    """One consumer's view of the ``{M}:inflight`` hash (``<consumer>|<first id>`` ->
    announcement)."""

    __slots__ = ("client", "consumer", "horizon_s", "key", "fields", "others_seen", "delivered")

    def __init__(self, client: Any, keys: ModelKeys, consumer: str,
                 horizon_s: float = DEFAULT_HORIZON_S) -> None:
        self.client = client
        self.key = keys.inflight
        self.consumer = consumer
        self.horizon_s = horizon_s
        #: This consumer's announcements not yet withdrawn.
        self.fields: set[str] = set()
        #: When :meth:`earlier` last found another consumer's batch in flight (time.time()).
        self.others_seen = float("-inf")
        #: The group's last delivered entry id as this consumer's last announced read left
        #: it: a wait for new entries starts there (workers/worker/intake.py).
        self.delivered = "0-0"

    def field(self, first_id: str) -> str:
        """The hash field of this consumer's batch starting at ``first_id``."""
        return f"{self.consumer}|{first_id}"

    def announce(self, first_id: str, n_entries: int, now: float | None = None) -> str:
        """Say that this consumer's batch of ``n_entries`` starting at ``first_id`` may
        learn labels; returns the field to withdraw."""
        name, command = self.announcement(first_id, n_entries, now)
        self.client.execute_command(*command)
        return name

    def announcement(self, first_id: str, n_entries: int, now: float | None = None,
                     ) -> tuple[str, list[Any]]:
        """:meth:`announce` as a command for the caller to send (e.g. in the same write as
        a commit, workers/store/commit.py): the field, tracked from now on, and the HSET."""
        ts = time.time() if now is None else now
        name = self.field(first_id)
        self.fields.add(name)
        return name, ["HSET", self.key, name, encode_announcement(first_id, n_entries, ts)]

    def withdraw(self, name: str | None) -> None:
        """The batch is committed (or abandoned): nobody needs to wait for it any more."""
        if name in self.fields:
            self.fields.discard(name)  # also if the HDEL fails: the field goes stale in horizon_s
            self.client.hdel(self.key, name)

    def withdrawn_by_commit(self, name: str | None) -> None:
        """The commit script deleted the field along with the batch (workers/store/scripts/commit.lua)."""
        self.fields.discard(name)  # type: ignore[arg-type]

    def forget(self, delete: bool = True) -> None:
        """Drop every announcement of this consumer (after an error: its batches are redone
        and announced again). ``delete=False`` when Redis is away: the fields go stale in
        ``horizon_s``."""
        names, self.fields = list(self.fields), set()
        if names and delete:
            self.client.hdel(self.key, *names)

    def saw_others(self, now: float | None = None) -> bool:
        """Whether :meth:`earlier` found another consumer's batch in flight in the last
        ``horizon_s`` seconds (another worker serves the model)."""
        return (time.time() if now is None else now) - self.others_seen <= self.horizon_s

    def earlier(self, first_id: str, now: float | None = None) -> list[str]:
        """The fields of other consumers' batches in flight (that may learn labels)
        starting before ``first_id``."""
        now = time.time() if now is None else now
        mine = parse_id(first_id)
        found, stale = [], []
        for name, raw in (self.client.hgetall(self.key) or {}).items():
            field = as_str(name)
            if field.rpartition("|")[0] == self.consumer:
                continue
            try:
                theirs, n, ts = decode_announcement(raw)
                first = parse_id(theirs)
            except (ValueError, UnicodeDecodeError):  # a foreign or damaged field: not ours to wait on
                stale.append(field)
                continue
            if now - ts > self.horizon_s:
                stale.append(field)
                continue
            self.others_seen = now
            if n > 0 and first < mine:
                found.append(field)
        if stale:
            self.client.hdel(self.key, *stale)
        return sorted(found)


@dataclass(slots=True)
class OrderWait:
    """What one wait did: seconds waited, whether it gave up at ``max_wait_s``, the most
    batches waited for at once, and whether its last step applied the log (then the
    caller need not tail it again before predicting)."""

    seconds: float = 0.0
    timed_out: bool = False
    waited_for: int = 0
    caught_up: bool = False


def wait_for_earlier(board: InflightBoard, first_id: str, max_wait_s: float,
                     catch_up: Callable[[set[str], int], int], poll_ms: int = 2) -> OrderWait:
    """Block until no earlier labelled batch of another consumer is in flight, applying
    the log as it grows, for at most ``max_wait_s`` seconds.

    ``catch_up(batches, block_ms)`` waits at most ``block_ms`` (``poll_ms`` at a time)
    for the log to grow, applies what it finds (the wait and the read of the entries are
    one round trip: :meth:`streamnb_workers.replication.replica.Replica.catch_up`), adds to ``batches`` the
    announcements whose commits it applied (each commit's log entry names its batch) and
    returns the number of entries applied. When those cover
    every batch waited for, the wait ends there: no second look at ``:inflight``, and
    ``caught_up`` tells the caller the model is current. Otherwise (a batch withdrawn
    without a log entry: unlabelled after all, or abandoned) it looks at ``:inflight``
    again; the caller then catches up once more, since
    the commit that ended the wait may have landed between two polls.
    """
    t0 = time.monotonic()
    result = OrderWait()
    if max_wait_s <= 0:
        return result
    deadline = t0 + max_wait_s
    waiting = set(board.earlier(first_id))
    while waiting:
        result.waited_for = max(result.waited_for, len(waiting))
        left = deadline - time.monotonic()
        if left <= 0:
            result.timed_out = True
            break
        committed: set[str] = set()
        if catch_up(committed, max(1, min(poll_ms, int(left * 1000)))):
            waiting -= committed
            if not waiting:
                result.caught_up = True
                break
        waiting = set(board.earlier(first_id))
    result.seconds = time.monotonic() - t0
    return result
