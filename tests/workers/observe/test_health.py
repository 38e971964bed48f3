"""``/healthz`` and ``streamnb_redis_up``: a worker that cannot reach Redis says so.

Unit tests of :mod:`streamnb_workers.observe.health` on a real HTTP server, then a real ``streamnb
worker`` process whose redis-server is stopped and started again: ``redis_up`` goes to 0,
the gauges read from Redis disappear from ``/metrics``, ``/healthz`` turns 503 after
``--healthz-grace`` and 200 again once Redis is back.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge

from streamnb_workers.observe.health import RedisHealth, serve_metrics_and_health
from tests.helpers.acl import cli_env, start_worker_cli, stop, wait_until
from tests.helpers.http import get, sample
from tests.helpers.redis_server import free_port


def test_grace_counts_from_the_last_success_and_from_the_start():
    now = [0.0]
    gauge = Gauge("up", "demo", registry=CollectorRegistry())
    h = RedisHealth(grace_s=30.0, gauge=gauge, clock=lambda: now[0])
    assert gauge._value.get() == 0 and h.healthy()      # starting: within the grace
    now[0] = 31.0
    assert not h.healthy()                             # never reached Redis in 30 s
    h.up()
    assert gauge._value.get() == 1 and h.healthy()
    now[0] = 60.0
    assert h.healthy()
    now[0] = 62.0
    assert not h.healthy(), "a loop that stopped stepping is not healthy, Redis or not"
    h.up()  # the worker says so after every step
    h.down()
    assert gauge._value.get() == 0 and h.healthy() and h.seconds_since_success() == 0.0
    now[0] = 92.5
    assert not h.healthy() and h.seconds_since_success() == pytest.approx(30.5)
    with pytest.raises(ValueError):
        RedisHealth(grace_s=0)


def test_healthz_and_metrics_on_one_port():
    now = [0.0]
    reg = CollectorRegistry()
    gauge = Gauge("streamnb_redis_up", "demo", ["worker"], registry=reg)
    health = RedisHealth(grace_s=5.0, gauge=gauge.labels(worker="w1"), clock=lambda: now[0])
    port = free_port()
    server = serve_metrics_and_health(port, "127.0.0.1", reg, health)
    try:
        health.up()
        assert get(port, "/healthz") == (200, "ok\n")
        code, body = get(port, "/metrics")
        assert code == 200 and sample(body, "streamnb_redis_up", worker="w1") == 1.0
        health.down()
        now[0] = 6.0
        code, body = get(port, "/healthz")
        assert code == 503 and "no successful Redis round trip for 6 s (grace 5 s)" in body
        assert sample(get(port, "/metrics")[1], "streamnb_redis_up", worker="w1") == 0.0
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.redis
@pytest.mark.slow
def test_a_worker_without_redis_fails_healthz_and_drops_its_redis_gauges(redis_server, tmp_path):
    port = free_port()
    log = tmp_path / "worker.log"
    proc = start_worker_cli(redis_server.url, "hz", "hz-1", log, "--metrics-port", str(port),
                            "--healthz-grace", "2", env=cli_env())
    try:
        def scrape() -> str:
            return get(port, "/metrics")[1]

        wait_until(lambda: sample(scrape(), "streamnb_group_lag_entries", model="hz") is not None,
                   30, "the lag gauge", [proc], [log])
        assert sample(scrape(), "streamnb_redis_up", worker="hz-1") == 1.0
        assert get(port, "/healthz")[0] == 200

        redis_server.stop()
        wait_until(lambda: sample(scrape(), "streamnb_redis_up", worker="hz-1") == 0.0, 15,
                   "redis_up 0", [proc], [log])
        body = scrape()
        for name in ("streamnb_group_lag_entries", "streamnb_group_pending_entries",
                     "streamnb_stream_length_entries", "streamnb_live_workers"):
            assert sample(body, name, model="hz") is None, f"{name} served while Redis is down"
        assert sample(body, "streamnb_worker_up", model="hz", worker="hz-1") == 1.0
        wait_until(lambda: get(port, "/healthz")[0] == 503, 15, "/healthz 503", [proc], [log])

        redis_server.start()
        wait_until(lambda: get(port, "/healthz")[0] == 200, 30, "/healthz 200 again", [proc], [log])
        wait_until(lambda: sample(scrape(), "streamnb_redis_up", worker="hz-1") == 1.0, 10,
                   "redis_up 1 again", [proc], [log])
        wait_until(lambda: sample(scrape(), "streamnb_group_lag_entries", model="hz") is not None,
                   15, "the lag gauge again", [proc], [log])
    finally:
        codes = stop([proc])
    assert codes == [0], log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()


def test_a_worker_that_loses_the_lease_drops_its_redis_gauges():
    import fakeredis

    from streamnb_workers.observe.metrics import Metrics
    from streamnb_workers.store.model_config import ModelSpec, ensure_config
    from streamnb_workers.worker.housekeeping import housekeeping
    from streamnb_workers.worker.intake import ensure_group
    from streamnb_workers.worker.options import WorkerOptions
    from streamnb_workers.worker.runtime import ModelRuntime

    r = fakeredis.FakeRedis()
    reg = CollectorRegistry()
    cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 4}))
    rt = ModelRuntime(cfg, r, WorkerOptions(consumer="w1"), Metrics(reg))
    ensure_group(r, rt.keys)
    rt.replica.load()
    housekeeping(rt, ["doc"], now=1.0)
    assert rt.snapshotter.holder
    assert reg.get_sample_value("streamnb_group_lag_entries", {"model": "doc"}) == 0.0
    r.set(rt.keys.lease, "w2")  # another worker holds it now (our lease expired meanwhile)
    housekeeping(rt, ["doc"], now=1000.0)
    assert not rt.snapshotter.holder
    assert reg.get_sample_value("streamnb_group_lag_entries", {"model": "doc"}) is None
