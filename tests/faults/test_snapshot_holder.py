"""Fault 5: the snapshot lease holder killed (kill -9) while it snapshots and trims; the
lease expires, another worker takes over, and no log entry is trimmed before it is in a
snapshot."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from streamnb.models import loads as load_model
from streamnb_workers.replication.replica import Replica, decode_log_entry
from streamnb_workers.replication.snapshotter import Snapshotter
from streamnb_workers.wire.stream_ids import parse_id
from tests.faults.harness import (
    K,
    StreamFeeder,
    check_guarantees,
    wait_all_done,
    wait_converged,
    wait_for,
)
from tests.helpers.workers import token_messages

pytestmark = pytest.mark.redis


class TrimWatcher:
    """Polls the snapshot, the log and the ``:learnt`` counter atomically and records two
    kinds of violation of "no log entry is trimmed before it is in a snapshot":

    - a log entry seen before is gone although it is newer than the snapshot;
    - the messages in the snapshot plus those in the log entries after it fall short of
      the ``:learnt`` counter (incremented in the same script as each XADD to the log):
      some delta was trimmed without being in the snapshot, even one never polled.
    """

    def __init__(self, client) -> None:
        self.client = client
        self.seen: set[str] = set()
        self.violations: list[tuple] = []
        self.polls = 0
        self.trimmed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TrimWatcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            pipe = self.client.pipeline(transaction=True)
            pipe.hmget(K.snapshot, ["log_id", "data"])
            pipe.xrange(K.log, "-", "+")
            pipe.get(K.learnt)
            (snap, data), entries, learnt = pipe.execute()
            present = {e.decode() for e, _ in entries}
            snap_id = snap.decode() if snap else "0-0"
            for gone in self.seen - present:
                self.trimmed += 1
                if parse_id(gone) > parse_id(snap_id):
                    self.violations.append(("trimmed after the snapshot", gone, snap_id))
            self.seen = present
            in_snapshot = 0
            if data is not None:
                in_snapshot = round(float(np.sum(load_model(data).stats["classes"].counts)))
            in_log = sum(int(decode_log_entry(f[b"data"]).get("n", 0)) for e, f in entries
                         if parse_id(e) > parse_id(snap_id))
            if in_snapshot + in_log != int(learnt or 0):
                self.violations.append(("snapshot + log != learnt", snap_id, in_snapshot, in_log,
                                        int(learnt or 0)))
            self.polls += 1
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _holder(r):
    v = r.get(K.lease)
    return v.decode() if v else None


@pytest.mark.slow
def test_snapshot_holder_killed_while_writing(redis_server, procs):
    r = redis_server.client()
    msgs = token_messages(3000, seed=51, labelled_share=0.9)
    procs.options.update(snapshot_every=1, lease_ms=1000, batch=10)  # snapshot after every entry
    live = ["w0", "w1", "w2"]
    for c in live:
        procs.spawn(c)
    wait_for(lambda: _holder(r) in live, 30, "a lease holder")
    feeder = StreamFeeder(r, msgs, chunk=25, pause_s=0.1).start()  # ~12 s of stream
    watcher = TrimWatcher(r).start()
    takeovers = []
    try:
        for k in range(3):
            wait_for(lambda: r.hget(K.snapshot, "log_id") is not None, 30, "a snapshot")
            holder = _holder(r)
            assert holder in live
            snap_before = r.hget(K.snapshot, "log_id")
            procs.kill(holder)
            t0 = time.monotonic()
            wait_for(lambda h=holder: _holder(r) not in (None, h), 10, "another worker takes over")
            wait_for(lambda s=snap_before: r.hget(K.snapshot, "log_id") != s, 10,
                     "the new holder writes a snapshot")
            takeovers.append((holder, _holder(r), round(time.monotonic() - t0, 2)))
            new = f"{holder}.{k}"
            live[live.index(holder)] = new
            procs.spawn(new)
        feeder.join()
        wait_all_done(r, len(msgs), 60, "every entry processed")
        wait_converged(r, live)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\ntrim violations {watcher.violations[:5]}\n"
                             f"{procs.logs()}") from None
    finally:
        watcher.stop()
    ids = [e.decode() for e, _ in r.xrange(K.input)]
    assert watcher.trimmed > 0 and watcher.polls > 10  # the invariant was actually exercised
    assert not watcher.violations, watcher.violations
    assert len(takeovers) == 3, takeovers
    check_guarantees(r, msgs, ids)  # a fresh replica from snapshot + log = the offline fit
    assert set(procs.stop_all().values()) == {0}


def test_former_holder_cannot_store_a_stale_or_lost_version(redis_server):
    """The write script refuses a writer that lost the lease, a version older than the
    stored snapshot, and a version whose log entry Redis no longer has."""
    from streamnb_workers.store.model_config import ensure_config
    from tests.helpers.workers import count_spec

    r = redis_server.client()
    cfg = ensure_config(r, count_spec("mail"))
    old, new = Snapshotter(r, K, "old", lease_ms=100), Snapshotter(r, K, "new", lease_ms=5000)
    e1 = r.xadd(K.log, {"data": b"x"}).decode()
    rep = Replica(r, K, cfg)
    rep.version, rep.applied = e1, 1
    assert old.hold_lease()
    time.sleep(0.15)  # old pauses past its lease
    assert new.hold_lease()
    assert not old.write(rep) and not old.holder  # lost the lease
    assert new.write(rep) and r.hget(K.snapshot, "log_id").decode() == e1
    assert not new.write(rep)  # not newer than the stored one
    rep.version = f"{parse_id(e1)[0] + 10}-0"  # applied an entry Redis lost in a crash
    assert not new.write(rep)
    assert r.hget(K.snapshot, "log_id").decode() == e1
