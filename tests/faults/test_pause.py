"""Fault 3: a worker paused (SIGSTOP) past the claim timeout while it holds a batch."""

from __future__ import annotations

import os
import signal
import time

import pytest

from streamnb_workers.store.keys import GROUP
from tests.faults.harness import (
    K,
    check_guarantees,
    produce_mixed,
    wait_all_done,
    wait_converged,
    wait_for,
)
from tests.helpers.workers import token_messages

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def _held(r, consumer):
    return r.xpending_range(K.input, GROUP, "-", "+", 1000, consumername=consumer)


def test_sigstop_past_claim_timeout_then_sigcont(redis_server, procs):
    r = redis_server.client()
    # enough that a is still at work when we look (a whole batch takes a few ms)
    msgs = token_messages(12000, seed=31, labelled_share=0.9)
    ids = produce_mixed(r, msgs)
    names = ["a", "b", "c"]
    a = procs.spawn("a")
    wait_for(lambda: r.xlen(K.out) >= 200, 30, "a at work")
    held = []
    for _ in range(100):  # stop a while it holds an uncommitted batch
        os.kill(a.pid, signal.SIGSTOP)
        time.sleep(0.05)  # a commit already on the wire lands before we look
        held = _held(r, "a")
        if held:
            break
        os.kill(a.pid, signal.SIGCONT)
    assert held, "could not catch worker a holding a batch"
    held_ids = {e["message_id"] for e in held}
    try:
        procs.spawn("b")
        procs.spawn("c")
        # b and c claim a's batch once it is idle past claim_idle_ms, and finish the stream
        wait_all_done(r, len(msgs), 60, "b and c claim a's batch and finish")
        claimed = {e["message_id"] for e in r.xpending_range(K.input, GROUP, "-", "+", 10)}
        assert not claimed & held_ids
    finally:
        os.kill(a.pid, signal.SIGCONT)
    # a wakes up with its old batch and commits it: the ownership check must drop it.
    # a's heartbeat reaches the last log id only after that commit and its tail.
    wait_converged(r, names)
    wait_all_done(r, len(msgs), 30, "nothing pending")
    check_guarantees(r, msgs, ids)
    assert "claimed by another worker" in (procs.log_dir / "a.log").read_text()
    assert set(procs.stop_all().values()) == {0}
