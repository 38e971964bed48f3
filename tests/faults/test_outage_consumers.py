"""After a Redis outage longer than ``stale_s``, every worker's heartbeat is stale and its
consumer idle; the lease holder, back first, must not take a live worker that is still
in its reconnect backoff for a dead consumer (it waits ``stale_s`` after reconnecting
before judging the others). Real redis-server, stopped with its data saved."""

from __future__ import annotations

import logging
import time

import pytest

from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.wire.replies import as_str
from tests.faults.harness import wait_for
from tests.helpers.workers import produce, token_messages

pytestmark = [pytest.mark.redis]
K = ModelKeys("mail")


def test_the_lease_holder_removes_no_live_consumer_after_an_outage(redis_factory, threads,
                                                                   caplog):
    caplog.set_level(logging.INFO, logger="streamnb")
    server = redis_factory()
    r = server.client()
    produce(r, "mail", token_messages(40, classes=("spam", "ham"), seed=1))
    common = dict(stale_s=1.5, heartbeat_s=0.3, lease_ms=1000)
    # "a" reconnects at once; "b" waits up to 1 s between attempts (less than stale_s)
    threads.spawn(server.url, "a", backoff_base_s=0.05, backoff_cap_s=0.1, **common)
    wait_for(lambda: any(w.models.get("mail") is not None and w.models["mail"].snapshotter.holder
                         for w in threads.workers.values()), 10, "a holds the lease")
    threads.spawn(server.url, "b", backoff_base_s=0.9, backoff_cap_s=1.0, **common)
    wait_for(lambda: {as_str(c["name"]) for c in r.xinfo_consumers(K.input, GROUP)} >= {"a", "b"},
             10, "both consumers in the group")
    reach = threads.registries["a"].get_sample_value
    assert reach("streamnb_model_reachable", {"model": "mail", "worker": "a"}) == 1.0
    r.shutdown(save=True)
    server.proc.wait(10)
    wait_for(lambda: reach("streamnb_model_reachable", {"model": "mail", "worker": "a"}) == 0.0,
             10, "model_reachable 0 while Redis is down")
    time.sleep(3.0)  # longer than stale_s: every heartbeat stale, every consumer idle
    server.start()
    r = server.client()
    wait_for(lambda: reach("streamnb_model_reachable", {"model": "mail", "worker": "a"}) == 1.0,
             10, "model_reachable 1 again")
    time.sleep(4.0)  # past stale_s after both came back: cleanups ran
    names = {as_str(c["name"]) for c in r.xinfo_consumers(K.input, GROUP)}
    threads.stop_all()
    removed = [rec.getMessage() for rec in caplog.records if "dead consumers" in rec.getMessage()]
    assert not removed, removed
    assert {"a", "b"} <= names
