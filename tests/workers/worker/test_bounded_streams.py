"""Bounded streams against a real redis-server: the lease holder trims ``:in`` of what
every consumer group acknowledged (never an entry a group has not read or holds pending);
``:out`` and ``:dead`` keep about their ``MAXLEN ~``."""

from __future__ import annotations

import time

import msgpack
import pytest

from streamnb_workers.store.input_trim import trim_input
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.worker.housekeeping import housekeeping
from tests.helpers.workers import (
    all_done,
    count_spec,
    fast_options,
    produce,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis
K = ModelKeys("t")


def _add(r, n: int) -> list[bytes]:
    return [r.xadd(K.input, {"data": b"x"}) for _ in range(n)]


def test_nothing_is_trimmed_without_a_group_or_before_a_group_reads(redis_server):
    r = redis_server.client()
    assert trim_input(r, K) == (None, 0)  # no stream
    _add(r, 5)
    assert trim_input(r, K) == (None, 0)  # no group: nothing says what is done
    r.xgroup_create(K.input, GROUP, "0")
    assert trim_input(r, K)[1] == 0 and r.xlen(K.input) == 5


def test_only_what_every_group_acknowledged_is_trimmed(redis_server):
    r = redis_server.client()
    ids = _add(r, 10)
    r.xgroup_create(K.input, GROUP, "0")
    r.xgroup_create(K.input, "audit", "0")
    r.xreadgroup(GROUP, "c1", {K.input: ">"}, count=6)
    r.xack(K.input, GROUP, *ids[:2], *ids[3:6])  # ids[2] still pending
    r.xreadgroup("audit", "a1", {K.input: ">"}, count=8)
    r.xack(K.input, "audit", *ids[:8])
    minid, removed = trim_input(r, K)
    assert (minid, removed) == (ids[2].decode(), 2)  # the oldest pending of "workers"
    r.xack(K.input, GROUP, ids[2])
    minid, removed = trim_input(r, K)  # now "workers" needs ids[6] (not read yet)
    assert (removed, [e for e, _ in r.xrange(K.input)]) == (4, ids[6:])
    r.xreadgroup(GROUP, "c1", {K.input: ">"})
    r.xack(K.input, GROUP, *ids[6:])
    assert trim_input(r, K)[1] == 2  # "audit" read up to ids[7]
    assert [e for e, _ in r.xrange(K.input)] == ids[8:]
    # a pending entry survives: XAUTOCLAIM by another consumer still finds it
    r.xreadgroup("audit", "a1", {K.input: ">"})
    trim_input(r, K)
    claimed = r.xautoclaim(K.input, "audit", "a2", 0, "0-0")
    assert [e for e, _ in claimed[1]] == ids[8:]


def test_the_lease_holder_trims_in_and_every_message_is_predicted(redis_server):
    r = redis_server.client()
    k = ModelKeys("mail")
    msgs = token_messages(300, seed=3)
    produce(r, "mail", msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", input_trim_s=0.01))
    w.run_until_idle()
    assert r.xlen(k.out) == 300 and all_done(r, 300, k)
    rt = w.models["mail"]
    assert rt.snapshotter.hold_lease()
    time.sleep(0.02)
    housekeeping(rt, ["mail"])
    assert r.xlen(k.input) == 0
    assert r.xinfo_stream(k.input)["entries-added"] == 300
    produce(r, "mail", token_messages(20, seed=4))  # the stream and its group go on
    w.run_until_idle()
    assert r.xlen(k.out) == 320
    assert rt.replica.model.class_count_.sum() == sum(
        1 for m in msgs + token_messages(20, seed=4) if "label" in m)


def test_the_first_trim_waits_one_interval(redis_server):
    """A worker just started has acknowledged nothing, and a group set to start after old
    entries may yet be set back: the first trim comes one interval after the start."""
    r = redis_server.client()
    k = ModelKeys("mail")
    produce(r, "mail", token_messages(10, seed=6))
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", input_trim_s=3600))
    w.run_until_idle()
    rt = w.models["mail"]
    assert rt.snapshotter.hold_lease()
    housekeeping(rt, ["mail"])
    assert r.xlen(k.input) == 10
    housekeeping(rt, ["mail"], now=time.monotonic() + 3601)
    assert r.xlen(k.input) == 0


def test_out_and_dead_keep_about_their_maxlen(redis_server):
    r = redis_server.client()
    k = ModelKeys("mail")
    produce(r, "mail", token_messages(600, seed=5))
    for _ in range(600):
        r.xadd(k.input, {"data": msgpack.packb({"text": "x", "label": ""})})  # bad_label
    w = url_worker(redis_server.url, [count_spec()],
                   fast_options("w1", out_maxlen=100, dead_maxlen=100, batch=100))
    w.run_until_idle()
    # MAXLEN ~ trims whole radix-tree nodes (100 entries each by default): at most one more
    assert 100 <= r.xlen(k.out) <= 200 and 100 <= r.xlen(k.dead) <= 200
