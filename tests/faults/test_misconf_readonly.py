"""Fault 6: Redis refuses writes (MISCONF after a failed BGSAVE, READONLY while it is a
replica): workers back off, count the errors in ``streamnb_redis_errors_total``, resume."""

from __future__ import annotations

import time

import pytest

from tests.faults.harness import (
    K,
    check_guarantees,
    last_log_id,
    produce_mixed,
    wait_all_done,
    wait_for,
)
from tests.helpers.redis_server import free_port
from tests.helpers.workers import token_messages

pytestmark = [pytest.mark.slow, pytest.mark.redis]
WORKERS = ("a", "b")


def _errors(threads, kind):
    return {c: threads.metric(c, "redis_errors", kind=kind) for c in WORKERS}


def _refusing(threads, kind, r, hold_s=1.0):
    """Wait until every worker hit ``kind`` errors; while writes are refused nothing is
    committed; the workers back off rather than spin."""
    wait_for(lambda: min(_errors(threads, kind).values()) >= 1, 20, f"{kind} errors in both")
    out = r.xlen(K.out)
    before = _errors(threads, kind)
    time.sleep(hold_s)
    assert r.xlen(K.out) == out
    after = _errors(threads, kind)
    for c in WORKERS:  # backoff (cap 0.5 s): a handful of attempts, not a busy loop
        assert after[c] - before[c] <= 4 * hold_s / 0.05, (kind, c, before[c], after[c])


def test_misconf_then_readonly_then_resume(redis_factory, threads, tmp_path):
    # CONFIG SET dir is a protected config since Redis 7: allow it on this test server
    redis_server = redis_factory(extra=["--enable-protected-configs", "yes"])
    r = redis_server.client()
    msgs = token_messages(3000, seed=61, labelled_share=0.9)
    ids = produce_mixed(r, msgs[:1500])
    ws = [threads.spawn(redis_server.url, c) for c in WORKERS]
    wait_for(lambda: r.xlen(K.out) >= 500, 30, "some progress")

    # MISCONF: a BGSAVE that cannot write its file, with stop-writes-on-bgsave-error yes
    gone = tmp_path / "gone"
    gone.mkdir()
    r.config_set("save", "3600 1")  # MISCONF needs a save point and a failed BGSAVE
    r.config_set("stop-writes-on-bgsave-error", "yes")
    r.config_set("dir", str(gone))
    gone.rmdir()
    r.bgsave()
    wait_for(lambda: r.info("persistence")["rdb_last_bgsave_status"] == "err", 10, "BGSAVE fails")
    _refusing(threads, "misconf", r)
    r.config_set("dir", str(redis_server.dir))  # disk back: a BGSAVE succeeds, writes resume
    r.bgsave()
    wait_for(lambda: r.info("persistence")["rdb_last_bgsave_status"] == "ok", 10, "BGSAVE ok")
    out = r.xlen(K.out)
    ids += produce_mixed(r, msgs[1500:2500], 1500)
    wait_for(lambda: r.xlen(K.out) > out + 200, 30, "progress after MISCONF")

    # READONLY: the server turned into a replica of a master that does not exist
    r.replicaof("127.0.0.1", free_port())
    _refusing(threads, "readonly", r)
    r.replicaof("NO", "ONE")
    ids += produce_mixed(r, msgs[2500:], 2500)

    wait_all_done(r, len(msgs), 60, "every entry processed", threads)
    reps = [w.models["mail"].replica for w in ws]
    wait_for(lambda: {rep.version for rep in reps} == {last_log_id(r)}, 10, "replicas converge")
    threads.stop_all()
    for c in WORKERS:
        assert threads.metric(c, "redis_reconnects") >= 2
    check_guarantees(r, msgs, ids, reps)
