"""Crash, pause, shutdown and Redis restarts: no message lost, none learnt twice (real Redis)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.worker.process import process_batch
from tests.helpers.redis_server import REDIS_SERVER, RedisServer
from tests.helpers.workers import (
    FCFG,
    all_done,
    assert_same_stats,
    count_spec,
    fast_options,
    learnt_model,
    offline_model,
    produce,
    spawn_worker,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis
K = ModelKeys("mail")
OPTS = {"batch": 20, "block_ms": 50, "heartbeat_s": 0.3, "claim_idle_ms": 800}


def _wait(cond, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _done(r, n):
    return lambda: all_done(r, n) and r.xlen(K.out) >= n


def _delivered_all(r):
    groups = r.xinfo_groups(K.input)
    last = r.xrevrange(K.input, count=1)
    return bool(groups) and bool(last) and groups[0]["last-delivered-id"] == last[0][0]


def _check_exactly_once(r, msgs):
    _check_exactly_once_of(r, msgs)
    ids = {decode_output(f[b"data"])["id"] for _, f in r.xrange(K.out)}
    assert ids == {m["id"] for m in msgs}  # every message has a prediction


def _check_exactly_once_of(r, msgs):
    """The stored model is an offline fit of ``msgs``, each learnt once."""
    model, _ = learnt_model(r, "mail")
    assert_same_stats(model, offline_model("multinomial", {"n_features": 1024}, FCFG, msgs))
    assert int(r.get(K.learnt)) == sum(1 for m in msgs if "label" in m)


def _stop(p, sig=signal.SIGTERM):
    if p.poll() is None:
        p.send_signal(sig)
    return p.wait(20)


@pytest.mark.slow
def test_kill_9_mid_batch_then_restart(redis_server, tmp_path):
    r = redis_server.client()
    msgs = token_messages(2000, seed=11)
    spec = count_spec()
    p = spawn_worker(redis_server.url, spec, dict(OPTS, consumer="a"), tmp_path / "a.log")
    _wait(lambda: r.hlen(K.workers) == 1, what="worker up")
    produce(r, "mail", msgs)
    _wait(lambda: r.xlen(K.out) >= 500, what="some progress")
    p.kill()  # SIGKILL: no chance to commit the batch in hand
    p.wait()
    assert r.xlen(K.out) < 2000
    p = spawn_worker(redis_server.url, spec, dict(OPTS, consumer="a"), tmp_path / "a2.log")
    try:
        _wait(_done(r, 2000), what="all processed")
    finally:
        assert _stop(p) == 0
    _check_exactly_once(r, msgs)
    assert r.xlen(K.out) == 2000  # no duplicate prediction either


@pytest.mark.slow
def test_sigstop_past_the_claim_timeout_does_not_double_learn(redis_server, tmp_path):
    r = redis_server.client()
    msgs = token_messages(1500, seed=12)
    spec = count_spec()
    a = spawn_worker(redis_server.url, spec, dict(OPTS, consumer="a"), tmp_path / "a.log")
    _wait(lambda: r.hlen(K.workers) == 1, what="worker a up")
    produce(r, "mail", msgs)
    _wait(lambda: r.xlen(K.out) >= 300, what="some progress")
    for _ in range(50):  # stop a while it holds an uncommitted batch
        os.kill(a.pid, signal.SIGSTOP)
        time.sleep(0.05)
        held = r.xpending_range(K.input, GROUP, "-", "+", 100, consumername="a")
        if held:
            break
        os.kill(a.pid, signal.SIGCONT)
    assert held, "could not catch worker a holding a batch"
    try:
        b = spawn_worker(redis_server.url, spec, dict(OPTS, consumer="b"), tmp_path / "b.log")
        # b finishes everything, claiming what a holds once it is idle past claim_idle_ms
        _wait(lambda: r.xlen(K.out) >= 1500 and _delivered_all(r) and
              not r.xpending_range(K.input, GROUP, "-", "+", 10, consumername="a"),
              what="b claims and finishes")
    finally:
        os.kill(a.pid, signal.SIGCONT)
    time.sleep(1.0)  # a wakes up, finds its batch lost in the ownership check
    _wait(_done(r, 1500), what="all committed")
    assert _stop(a) == 0 and _stop(b) == 0
    _check_exactly_once(r, msgs)


def test_ownership_check_drops_entries_claimed_meanwhile(redis_server):
    """Deterministic version of the pause: w0 holds a batch, w1 claims it, w0 commits."""
    r = redis_server.client()
    msgs = token_messages(30, seed=13)
    produce(r, "mail", msgs)
    w0 = url_worker(redis_server.url, [count_spec()], fast_options("w0", batch=30, claim_idle_ms=100))
    w1 = url_worker(redis_server.url, [count_spec()], fast_options("w1", batch=30, claim_idle_ms=100))
    w0.start()
    rt0 = w0.models["mail"]
    rt0.pending_phase = False
    entries = w0.reader.xreadgroup(GROUP, "w0", {K.input: ">"}, count=30)[0][1]
    time.sleep(0.25)  # w0 "paused" past the claim timeout
    w1.run_until_idle()  # claims and learns all 30
    assert process_batch(rt0, entries) == 30  # ownership check: everything lost
    w0.run_until_idle()
    for w in (w0, w1):
        assert_same_stats(w.models["mail"].replica.model,
                          offline_model("multinomial", {"n_features": 1024}, FCFG, msgs))
    assert r.xlen(K.out) == 30 and int(r.get(K.learnt)) == 30


def test_sigterm_warm_shutdown(redis_server, tmp_path):
    r = redis_server.client()
    msgs = token_messages(3000, seed=14)
    produce(r, "mail", msgs)
    p = spawn_worker(redis_server.url, count_spec(), dict(OPTS, consumer="a", batch=50),
                     tmp_path / "a.log")
    _wait(lambda: r.xlen(K.out) >= 200, what="some progress")
    assert _stop(p) == 0
    assert not r.xpending_range(K.input, GROUP, "-", "+", 10, consumername="a")
    n_out = r.xlen(K.out)
    assert n_out < 3000  # stopped mid-stream, having committed what it read
    model, _ = learnt_model(r, "mail")
    done = [decode_output(f[b"data"])["id"] for _, f in r.xrange(K.out)]
    by_id = {m["id"]: m for m in msgs}
    assert_same_stats(model, offline_model("multinomial", {"n_features": 1024}, FCFG,
                                           [by_id[i] for i in done]))
    assert "a" not in {c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
                       for c in r.xinfo_consumers(K.input, GROUP)}


def test_poison_messages_go_to_dead(redis_server):
    r = redis_server.client()
    msgs = token_messages(5, seed=15)
    ids = produce(r, "mail", msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", claim_idle_ms=10,
                                                                   max_deliveries=3))
    w.start()
    r.xreadgroup(GROUP, "crasher", {K.input: ">"}, count=1)  # a worker that keeps dying on it
    for _ in range(3):
        r.xclaim(K.input, GROUP, "crasher", 0, [ids[0]])
    time.sleep(0.05)
    w.run_until_idle()
    dead = [decode_output(f[b"data"]) for _, f in r.xrange(K.dead)]
    assert [(d["entry"], d["reason"]) for d in dead] == [(ids[0], "poison")]
    assert "delivered 5 times" in dead[0]["detail"]
    assert r.xpending(K.input, GROUP)["pending"] == 0
    assert w.models["mail"].replica.learnt == 4


@pytest.mark.slow
@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_redis_restart_with_aof_always(tmp_path):
    msgs = token_messages(1500, seed=16)
    with RedisServer(appendfsync="always") as server:
        r = server.client()
        p = spawn_worker(server.url, count_spec(),
                         dict(OPTS, consumer="a", backoff_cap_s=0.3), tmp_path / "a.log")
        try:
            _wait(lambda: r.hlen(K.workers) == 1, what="worker up")
            produce(r, "mail", msgs[:1000])
            _wait(lambda: r.xlen(K.out) >= 300, what="some progress")
            server.stop(signal.SIGKILL)  # crash; AOF always keeps every acknowledged write
            time.sleep(0.5)
            server.start()
            r = server.client()
            produce(r, "mail", msgs[1000:])
            _wait(_done(r, 1500), what="all processed after the restart")
        finally:
            code = _stop(p)
        log = (tmp_path / "a.log").read_text()
        assert code == 0, log[-3000:]
        assert "reconnecting in" in log
        _check_exactly_once(r, msgs)


def test_a_message_that_breaks_the_worker_goes_to_dead_alone(redis_server):
    """An unexpected error (not Redis) on one message: counted, the batch redone from the
    pending entries one at a time, so only that message reaches max_deliveries and goes
    to :dead as poison; its batch-mates are learnt and predicted as usual."""
    import threading

    from prometheus_client import CollectorRegistry

    from streamnb_workers.observe.metrics import Metrics

    r = redis_server.client()
    msgs = token_messages(8, seed=17, labelled_share=1.0)
    ids = produce(r, "mail", msgs)
    bad = msgs[3]["id"]
    reg = CollectorRegistry()
    w = url_worker(redis_server.url, [count_spec()],
                   fast_options("w1", max_deliveries=3, claim_idle_ms=60_000), Metrics(reg))
    w.start()
    featurizer = w.models["mail"].featurizer
    real = featurizer.featurize_batch

    bad_tokens = msgs[3]["tokens"]
    assert sum(m["tokens"] == bad_tokens for m in msgs) == 1

    def breaks_on_bad(batch, *options):
        if any(p.value == bad_tokens for p in batch):
            raise RuntimeError("a bug this message triggers")
        return real(batch, *options)

    featurizer.featurize_batch = breaks_on_bad
    t = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
    t.start()
    try:
        _wait(lambda: all_done(r, len(msgs)), 30, "nothing pending")
    finally:
        w.request_stop()
        t.join(30)
    assert not t.is_alive()
    dead = [decode_output(f[b"data"]) for _, f in r.xrange(K.dead)]
    assert [(d["entry"], d["reason"]) for d in dead] == [(ids[3], "poison")]
    outs = {decode_output(f[b"data"])["id"] for _, f in r.xrange(K.out)}
    assert outs == {m["id"] for m in msgs} - {bad}
    good = [m for m in msgs if m["id"] != bad]
    _check_exactly_once_of(r, good)
    errors = reg.get_sample_value("streamnb_worker_errors_total", {"model": "mail", "worker": "w1"})
    assert errors == 3  # delivered 1, 2 and 3 times; poison on the 4th delivery
