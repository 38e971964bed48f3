"""Redis Cluster: a 3-master cluster of real redis-server processes, two models, two workers each.

The cluster is started by the test (free ports, ``cluster-enabled yes``, ``redis-cli --cluster
create``) with the shipped ACL on every node, and the workers log in as ``streamnb-worker``.
Every key of a model carries the hash tag ``{NAME}``, so one model lives in one slot and
its commit script runs on one node; the two models used here hash to slots owned by
different masters. Afterwards: the statistics of each model equal one offline fit, every
message has exactly one prediction, nothing is pending, and no node logged an ACL refusal.
"""

from __future__ import annotations

import time

import msgpack
import pytest
import redis

from streamnb.exceptions import SettingsError
from streamnb_workers.replication.shards import load_model
from streamnb_workers.store.connection import RedisSettings, UrlConnector, is_access_error
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.worker import Worker
from tests.helpers.acl import (
    FEATURIZER,
    WORKER_PASSWORD,
    WORKER_USER,
    start_worker_cli,
    stop,
    wait_until,
)
from tests.helpers.cluster import MODELS, check_model, cluster_ports, drained, slot_of
from tests.helpers.workers import (
    assert_same_stats,
    count_spec,
    fast_options,
    offline_model,
    produce,
    run_in_threads,
    token_messages,
)

pytestmark = pytest.mark.redis


def test_slot_of_matches_redis(cluster):
    client = cluster.nodes[0].client()
    for name in (*MODELS, "mail", "a.b-c_9"):
        key = ModelKeys(name).input
        assert slot_of(key) == client.cluster("keyslot", key)
        assert {slot_of(k) for k in ModelKeys(name).all_fixed()} == {slot_of(key)}


@pytest.mark.slow
def test_two_models_two_cli_workers_each_exactly_once(cluster, tmp_path):
    slots = {name: slot_of(ModelKeys(name).input) for name in MODELS}
    assert len({cluster.owner(s) for s in slots.values()}) == 2, slots
    admin = cluster.admin()
    msgs = {name: token_messages(800, seed=i, labelled_share=0.8) for i, name in enumerate(MODELS)}
    logs, procs = [], []
    for name in MODELS:
        for i in range(2):
            logs.append(tmp_path / f"{name}-{i}.log")
            # error weight 1: the statistics are an offline partial_fit's
            procs.append(start_worker_cli(cluster.url(), name, f"{name}-{i}", logs[-1], "--cluster",
                                          "--error-weight", "1"))
    t0 = time.monotonic()
    try:
        for name in MODELS:
            wait_until(lambda n=name: admin.hlen(ModelKeys(n).workers) == 2, 40,
                       f"two workers of {name}", procs, logs)
            produce(admin, name, msgs[name])
        for name in MODELS:
            wait_until(lambda n=name: drained(admin, n), 40, f"model {name} drained", procs, logs)
    finally:
        codes = stop(procs)
    assert codes == [0] * 4, [log.read_text()[-2000:] for log in logs]
    assert time.monotonic() - t0 < 60
    for name in MODELS:
        check_model(admin, name, msgs[name], n_workers=2)
        # the model's data lives on the master that owns its slot, nowhere else
        owner = next(n for n in cluster.nodes if n.port == cluster.owner(slots[name]))
        assert owner.client().exists(ModelKeys(name).log) == 1
        assert sum(n.client().dbsize() > 0 for n in cluster.nodes) >= 2
    assert cluster.refusals() == []


def test_workers_serving_both_models_read_each_slot(cluster):
    names = ("spam-api", "ham-api")
    admin = cluster.admin()
    msgs = {name: token_messages(400, seed=7 + i, labelled_share=0.75) for i, name in enumerate(names)}
    for name in names:
        produce(admin, name, msgs[name])
    specs = [count_spec(name) for name in names]
    workers = [Worker(UrlConnector(RedisSettings(cluster.url(), cluster=True)), specs,
                      fast_options(f"both-{i}")) for i in range(2)]
    run_in_threads(workers, timeout=40)  # raises the first worker error
    for w in workers:
        w.shutdown()
    for name in names:
        check_model(admin, name, msgs[name], n_workers=len({
            msgpack.unpackb(f[b"data"])["worker"] for _, f in admin.xrange(ModelKeys(name).out)}))
        versions = {w.models[name].replica.version for w in workers}
        assert len(versions) == 1
    assert cluster.refusals() == []


def test_delayed_labels_and_corrections_on_a_cluster(cluster):
    """The label cache on a cluster, as the worker's login: the commit writes the bucket
    hashes, and workers/store/scripts/cache_get.lua finds the entries in the buckets it names from the
    registry (keys of the model's one slot); labels and corrections are learnt exactly once."""
    name = "late-labels"
    admin = cluster.admin()
    msgs = token_messages(60, seed=11, labelled_share=0.5)
    produce(admin, name, msgs)
    workers = [Worker(UrlConnector(RedisSettings(cluster.url(), cluster=True)), [count_spec(name)],
                      fast_options(f"late-{i}", batch=16)) for i in range(2)]
    run_in_threads(workers, timeout=40)
    final = {m["id"]: m["label"] for m in msgs if "label" in m}
    late = [m["id"] for m in msgs if "label" not in m][:10]
    moved = [i for i in final][:5]
    labels = [{"ref": i, "label": "spam"} for i in late] + \
        [{"ref": i, "label": "news" if final[i] != "news" else "ham"} for i in moved]
    produce(admin, name, labels)
    run_in_threads(workers, timeout=40)
    for w in workers:
        w.shutdown()
    final |= {lab["ref"]: lab["label"] for lab in labels}
    expected = [dict({k: v for k, v in m.items() if k != "label"}, label=final[m["id"]])
                for m in msgs if m["id"] in final]
    model, _ = load_model(admin, name)
    assert_same_stats(model, offline_model("multinomial", {"n_features": 1024}, FEATURIZER, expected))
    assert int(admin.get(ModelKeys(name).learnt)) == len(final)
    assert admin.xlen(ModelKeys(name).dead) == 0
    assert cluster.refusals() == []


def test_the_ordering_wait_reads_the_log_in_one_pipeline_on_a_cluster(cluster):
    """``Replica.catch_up(block_ms=...)``: XREAD BLOCK with the checks behind it in one
    pipeline, sent to the node of the model's slot, as the worker's login (ACL)."""
    import numpy as np

    from streamnb.models import make_model
    from streamnb_workers.replication.replica import Replica, encode_delta
    from streamnb_workers.store.model_config import ModelSpec, ensure_config

    client = RedisSettings(cluster.url(), cluster=True).make_client()
    spec = ModelSpec("blocking", kind="multinomial", model_params={"n_features": 4},
                     featurizer_config={"input": "dense", "dim": 4})
    cfg = ensure_config(client, spec)
    keys = ModelKeys("blocking")
    rep = Replica(client, keys, cfg).load()
    assert rep.catch_up(block_ms=30) == 0 and rep.waited_s >= 0.02
    X, y = np.array([[1.0, 0, 2, 0], [0, 3, 0, 1]]), ["a", "b"]
    cluster.admin().xadd(keys.log, {"data": encode_delta(
        make_model("multinomial", n_features=4).batch_stats(X, y), None, 2, "w", "b1"),
        "inflight": "w|1-0"})
    batches: set[str] = set()
    assert rep.catch_up(batches=batches, block_ms=30) == 1 and batches == {"w|1-0"}
    ref = make_model("multinomial", n_features=4).partial_fit(X, y)
    np.testing.assert_array_equal(rep.model.predict_log_proba(X), ref.predict_log_proba(X))
    assert cluster.refusals() == []


def test_a_connector_reaches_the_cluster_through_the_nodes_it_knew(cluster):
    """After a failover the URL's node may be the master that died: a connector makes new
    clients from the nodes its last client knew as well (tests/faults/test_cluster_failover.py
    kills that node; here the URL names a port where nothing listens)."""
    live = UrlConnector(RedisSettings(cluster.url(), cluster=True))
    live.client()
    assert sorted(port for _, port in live.known_nodes) == sorted(n.port for n in cluster.nodes)
    dead_url = f"redis://{WORKER_USER}:{WORKER_PASSWORD}@127.0.0.1:{cluster_ports(1)[0]}/0"
    dead = UrlConnector(RedisSettings(dead_url, cluster=True))
    with pytest.raises(redis.ConnectionError, match="cannot be reached"):
        dead.client()
    dead.known_nodes = live.known_nodes
    client = dead.client()
    assert client.xlen(ModelKeys("known-nodes").input) == 0
    assert dead.reader(100).ping()


def test_wrong_password_on_a_cluster_fails_at_once(cluster):
    t0 = time.monotonic()
    with pytest.raises(redis.AuthenticationError, match="refused the credentials") as info:
        RedisSettings(cluster.url(password="wrong"), cluster=True).make_client()
    assert time.monotonic() - t0 < 1.0
    assert is_access_error(info.value) and "wrong" not in str(info.value)


def test_cluster_flag_against_a_plain_server_says_so(redis_server):
    with pytest.raises(SettingsError, match="not a Redis Cluster node"):
        RedisSettings(redis_server.url, cluster=True).make_client()
