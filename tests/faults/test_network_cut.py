"""Fault 4: the network between a worker and Redis cut (a TCP proxy on loopback stopped,
its connections reset) and restored, once past the claim timeout and once briefly."""

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
from tests.faults.proxy import TcpProxy
from tests.helpers.workers import token_messages

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def test_network_cut_and_restore(redis_server, threads):
    r = redis_server.client()
    msgs = token_messages(4000, seed=41, labelled_share=0.9)
    ids = produce_mixed(r, msgs)
    with TcpProxy("127.0.0.1", redis_server.port) as proxy:
        cut = threads.spawn(proxy.url, "cut")  # behind the proxy
        direct = threads.spawn(redis_server.url, "direct")
        wait_for(lambda: r.xlen(K.out) >= 600, 30, "some progress")
        out_before = r.xlen(K.out)
        proxy.stop()  # past claim_idle_ms: "direct" claims what "cut" held
        time.sleep(2.0)
        assert r.xlen(K.out) > out_before, "the direct worker went on alone"
        proxy.start()
        wait_for(lambda: threads.metric("cut", "commits") > 0 and r.xlen(K.out) >= out_before + 600,
                 30, "progress after the first cut")
        proxy.stop()  # a short cut: the cut worker keeps its entries and redoes them
        time.sleep(0.3)
        proxy.start()
        wait_all_done(r, len(msgs), 60, "every entry processed", threads)
        reps = [cut.models["mail"].replica, direct.models["mail"].replica]
        wait_for(lambda: {rep.version for rep in reps} == {last_log_id(r)}, 10,
                 "both replicas at the last log entry")
        threads.stop_all()
    assert threads.metric("cut", "redis_errors", kind="connection") >= 2
    assert threads.metric("cut", "redis_reconnects") >= 2
    assert threads.metric("direct", "redis_errors", kind="connection") == 0
    check_guarantees(r, msgs, ids, reps)
