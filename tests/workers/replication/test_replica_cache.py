"""A worker holding fewer replicas than it serves models (workers/replication/replica_cache.py),
on a real redis-server: under a small ``replica_memory`` it evicts the least recently used
and loads them again for their batches, and its predictions, statistics and learnt counts
are those of a worker that holds every replica."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from benchmarks.replay_digest import stats_arrays, stats_digest
from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.replication.replica_cache import REPLICA_OBJECTS, model_nbytes
from streamnb_workers.replication.shards import load_model
from streamnb_workers.replication.user_sum import UserSum
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.user_models import UserNames, register
from tests.helpers.workers import count_spec, fast_options, produce, token_messages, url_worker

pytestmark = pytest.mark.redis

MODELS = [f"user{i}" for i in range(6)]
CHUNKS = 4


def arrays_bound(worker):
    """The worker's bound taken as the replicas' arrays alone (no resident memory
    measured): held replicas that do not depend on the test process's RSS."""
    worker.replicas.resident = None
    return worker


def one_replica_bytes(url: str) -> int:
    """What one replica of the test's model counts once it predicted (3 classes): its
    arrays and the fixed cost of its objects."""
    w = url_worker(url, [count_spec("probe")], fast_options("probe", replica_memory=0))
    produce(w.connector.client(), "probe", token_messages(30, seed=99))
    w.run_until_idle()
    return model_nbytes(w.models["probe"].replica.model) + REPLICA_OBJECTS


def held_bytes(worker) -> int:
    """The arrays of the replicas the worker holds, measured (not the cache's account)."""
    return sum(model_nbytes(rt.replica.model) for rt in worker.models.values()
               if not rt.replica.evicted)


def outputs(client, name: str) -> list[tuple]:
    rows = []
    for _, fields in client.xrange(ModelKeys(name).out):
        out = msgpack.unpackb(fields[b"data"], raw=False)
        rows.append((out["id"], out["label"], out.get("log_proba")))
    return rows


def test_bounded_worker_equals_one_holding_every_replica(server):
    client = server.client()
    bounded_url, full_url = server.url, server.url[:-2] + "/1"
    size = one_replica_bytes(full_url)
    budget = int(2.5 * size)  # two replicas held of six
    opts = dict(snapshot_every=3)  # some replicas load a snapshot, some the log alone
    registry = CollectorRegistry()
    bounded = arrays_bound(url_worker(bounded_url, [count_spec(m) for m in MODELS],
                           fast_options("b", replica_memory=budget, **opts), Metrics(registry)))
    full = url_worker(full_url, [count_spec(m) for m in MODELS],
                      fast_options("f", replica_memory=0, **opts))
    full_client = full.connector.client()
    messages = {m: token_messages(20 * CHUNKS, seed=i) for i, m in enumerate(MODELS)}
    for chunk in range(CHUNKS):
        if chunk == CHUNKS - 1:  # a restart: the replicas past the bound start evicted
            bounded.shutdown()
            registry = CollectorRegistry()
            bounded = arrays_bound(url_worker(bounded_url, [count_spec(m) for m in MODELS],
                                              fast_options("b2", replica_memory=budget, **opts),
                                              Metrics(registry)))
            bounded.start()
            assert sum(not rt.replica.evicted for rt in bounded.models.values()) <= 3
        for m in MODELS:
            part = messages[m][20 * chunk:20 * (chunk + 1)]
            part += part[:3]  # sent again: learnt once
            produce(bounded.connector.client(), m, part)
            produce(full_client, m, part)
            # one model at a time, so each batch evicts the least recently used
            while bounded.step(20):
                assert held_bytes(bounded) <= budget
            full.run_until_idle()
    bounded.run_until_idle()
    assert held_bytes(bounded) <= budget

    cache = bounded.replicas
    assert cache.evictions >= len(MODELS) and cache.loads >= len(MODELS)
    assert registry.get_sample_value("streamnb_replica_loads_total", {"worker": "b2"}) > 0
    assert registry.get_sample_value("streamnb_replicas_held", {"worker": "b2"}) == cache.held
    assert any(client.exists(ModelKeys(m).snapshot) for m in MODELS)  # reloads read them
    b_db1 = server.client(db=1)
    for m in MODELS:
        # predictions in stream order as with every replica held, bit for bit
        assert outputs(client, m) == outputs(b_db1, m)
        # each message learnt once
        assert int(client.get(ModelKeys(m).learnt)) == 20 * CHUNKS
        rt, ref = bounded.models[m], full.models[m]
        if rt.replica.evicted:
            cache.use(m)  # loaded again: bit-identical to the replica never evicted
        assert stats_digest(stats_arrays(rt.replica.model.stats)) == \
            stats_digest(stats_arrays(ref.replica.model.stats))
        assert rt.replica.version == client.xrevrange(ModelKeys(m).log, count=1)[0][0].decode()
        stored, _ = load_model(client, m)
        np.testing.assert_array_equal(stored.predict_log_proba(np.ones((1, 1024))),
                                      ref.replica.model.predict_log_proba(np.ones((1, 1024))))
    bounded.shutdown()
    full.shutdown()


def test_one_replica_larger_than_the_bound_is_still_served_metrics_pooled(server):
    url = server.url[:-2] + "/2"
    registry = CollectorRegistry()
    w = url_worker(url, [count_spec("big"), count_spec("idle")],
                   fast_options("w", replica_memory=1, model_metrics=False), Metrics(registry))
    produce(w.connector.client(), "big", token_messages(40, seed=5))
    w.run_until_idle()
    assert not w.models["big"].replica.evicted and w.models["big"].replica.learnt == 40
    assert w.models["idle"].replica.evicted
    # --no-model-metrics: one series for every model, none by model
    assert registry.get_sample_value("streamnb_messages_read_total",
                                     {"model": "*", "worker": "w"}) == 40
    assert registry.get_sample_value("streamnb_messages_read_total",
                                     {"model": "big", "worker": "w"}) is None


def held_with_sums(worker) -> int:
    """The arrays of the replicas held and of the summed user+global models held."""
    total = held_bytes(worker)
    for rt in worker.models.values():
        if isinstance(rt.summed, UserSum) and rt.summed._model is not None:
            total += model_nbytes(rt.summed._model)
    return total


def test_bounded_worker_serving_per_user_models_equals_an_unbounded_one(server):
    """The global model's replica, which every user's sum reads, is pinned; each user's
    summed model is counted with the user's replica and dropped when it is evicted."""
    bounded_url, full_url = server.url[:-2] + "/3", server.url[:-2] + "/4"
    size = one_replica_bytes(server.url[:-2] + "/5")
    budget = int(3.5 * size)  # the global, and one user with its sum
    users = [UserNames("doc").user(f"u{i}@b.org") for i in range(4)]
    opts = dict(per_user_s=0.001, user_min_weight=3, snapshot_every=4)
    bounded = arrays_bound(url_worker(bounded_url, [count_spec("doc")],
                                      fast_options("b", replica_memory=budget, **opts)))
    full = url_worker(full_url, [count_spec("doc")], fast_options("f", replica_memory=0, **opts))
    workers = [(bounded, bounded.connector.client()), (full, full.connector.client())]
    glob = token_messages(50, seed=40)
    mail = {u: token_messages(30, seed=41 + i, labelled_share=0.7) for i, u in enumerate(users)}
    for w, c in workers:
        produce(c, "doc", glob[:20])
        w.run_until_idle()
        for u in users:
            register(c, "doc", u)
        w.step(0)
        assert set(users) <= set(w.models)
    for chunk in range(3):
        for _, c in workers:  # the global learns between the users' batches
            produce(c, "doc", glob[20 + 10 * chunk:30 + 10 * chunk])
        for u in users:
            part = mail[u][10 * chunk:10 * (chunk + 1)]
            for _, c in workers:
                produce(c, u, part)
            while bounded.step(20):  # one user at a time: each batch evicts another
                assert not bounded.models["doc"].replica.evicted
                assert held_with_sums(bounded) <= budget
            full.run_until_idle()
    bounded.run_until_idle()
    assert not bounded.models["doc"].replica.evicted
    assert held_with_sums(bounded) <= budget
    cache = bounded.replicas
    assert cache.evictions >= len(users) and cache.loads >= len(users)
    summed = [bounded.models[u].summed for u in users]
    assert all(s.resums > 0 for s in summed)  # the users' parts counted in their verdicts
    # an evicted user's sum is dropped
    assert all(s._model is None for u, s in zip(users, summed, strict=True)
               if bounded.models[u].replica.evicted)
    assert any(bounded.models[u].replica.evicted for u in users)
    b_client, f_client = workers[0][1], workers[1][1]
    for name in ["doc", *users]:
        got = outputs(b_client, name)
        assert len(got) == len(mail.get(name, glob))
        assert got == outputs(f_client, name)  # bit for bit
    bounded.shutdown()
    full.shutdown()


def test_the_bound_counts_the_process_memory_besides_the_replicas(server):
    """The worker's bound is its resident memory: the replicas held fit what the rest of
    the process leaves (here a stand-in RSS: a floor plus the held replicas), the
    freed memory is released after evictions, and a rest above the bound leaves the last
    used replica alone held."""
    url = server.url[:-2] + "/6"
    size = one_replica_bytes(server.url[:-2] + "/7")
    floor = [50 * 2**20]
    budget = floor[0] + int(2.5 * size)
    w = url_worker(url, [count_spec(m) for m in MODELS], fast_options("p", replica_memory=budget))
    releases = []
    w.replicas.resident = lambda: floor[0] + held_bytes(w) + REPLICA_OBJECTS * sum(
        not rt.replica.evicted for rt in w.models.values())
    w.replicas.release = lambda: releases.append(1)
    client = w.connector.client()
    for i, m in enumerate(MODELS):
        produce(client, m, token_messages(20, seed=60 + i))
        while w.step(20):
            assert w.replicas.resident() <= budget
    w.run_until_idle()
    assert w.replicas.resident() <= budget and w.replicas.rest == floor[0]
    assert sum(not rt.replica.evicted for rt in w.models.values()) == 2
    assert releases and w.replicas.evictions >= len(MODELS) - 2
    evicted = [rt for rt in w.models.values() if rt.replica.evicted]
    assert all(rt._observer.value is None for rt in evicted)  # let go with the replica
    # one featurizer for every model of the same featurizer config
    assert len({id(rt.featurizer) for rt in w.models.values()}) == 1
    floor[0] += size  # the rest grew (more runtimes): one replica fits now
    w.step(0)
    assert sum(not rt.replica.evicted for rt in w.models.values()) == 1
    assert w.replicas.resident() <= budget
    floor[0] = budget + 1  # over the bound without replicas: the last used alone held
    w.step(0)
    held = [m for m, rt in w.models.items() if not rt.replica.evicted]
    assert held == [MODELS[-1]]
    produce(client, MODELS[0], token_messages(5, seed=70))
    w.run_until_idle()
    assert [m for m, rt in w.models.items() if not rt.replica.evicted] == [MODELS[0]]
    assert int(client.get(ModelKeys(MODELS[0]).learnt)) == 25
    w.shutdown()


MANY = [f"many{i}" for i in range(12)]  # more than FEW_MODELS: duties in slices


def assert_same_stats(w, full, m: str) -> None:
    """Model ``m``'s statistics in the bounded worker ``w`` (loaded again if evicted) are
    those of the worker ``full`` holding every replica."""
    if w.models[m].replica.evicted:
        w.replicas.use(m)
    assert stats_digest(stats_arrays(w.models[m].replica.model.stats)) == \
        stats_digest(stats_arrays(full.models[m].replica.model.stats))


def bounded_and_full_workers(server, db: int, floor: int, extra: list, budget_of):
    """A worker of MANY under the budget ``floor + budget_of(replica size)`` whose RSS is
    the floor, ``extra[0]`` and the replicas it holds, and one holding every replica
    (databases db, db + 1; db + 2 sizes one replica)."""
    url, full_url = server.url[:-2] + f"/{db}", server.url[:-2] + f"/{db + 1}"
    size = one_replica_bytes(server.url[:-2] + f"/{db + 2}")
    budget = floor + budget_of(size)
    w = url_worker(url, [count_spec(m) for m in MANY], fast_options("g", replica_memory=budget))
    full = url_worker(full_url, [count_spec(m) for m in MANY], fast_options("h", replica_memory=0))

    def resident():
        held = sum(model_nbytes(rt.replica.model) + REPLICA_OBJECTS
                   for rt in w.models.values() if not rt.replica.evicted)
        return floor + extra[0] + held

    w.replicas.resident, w.replicas.release = resident, lambda: None
    return w, full, size, budget


def test_the_bound_holds_at_every_load_when_a_step_grows_the_rest(server, monkeypatch):
    """Within a step the rest of the process grows (here a stand-in: the step's read adds
    a replica's size until the step ends): the worker measures it before each load and
    after each batch, and makes room before it loads, so the stand-in RSS is within the
    bound whenever a replica has been loaded, and after every batch; a worker serving
    more models than FEW_MODELS (duties in slices, settles by batch) predicts and learns
    bit for bit as one holding every replica."""
    from streamnb_workers.replication.replica import Replica
    from streamnb_workers.worker import intake

    floor, extra = 50 * 2**20, [0]
    w, full, size, budget = bounded_and_full_workers(server, 8, floor, extra, lambda size: int(3.5 * size))
    seen = []
    load = Replica.load

    def checked_load(self, *a, **k):
        out = load(self, *a, **k)
        if self.keys.name in w.models:
            seen.append(w.replicas.resident())
        return out

    read = intake.read_models

    def read_grows(*a, **k):  # what a read brings stays until the step's end
        got = read(*a, **k)
        extra[0] = size if got else 0
        return got

    monkeypatch.setattr(Replica, "load", checked_load)
    monkeypatch.setattr(intake, "read_models", read_grows)
    messages = {m: token_messages(24, seed=80 + i) for i, m in enumerate(MANY)}
    for chunk in range(3):
        for m in MANY:  # every model has entries in each step: a load a batch
            part = messages[m][8 * chunk:8 * (chunk + 1)]
            produce(w.connector.client(), m, part)
            produce(full.connector.client(), m, part)
        while w.step(20):
            assert w.replicas.resident() <= budget
        full.run_until_idle()
    w.run_until_idle()
    assert seen and max(seen) <= budget, (max(seen), budget)
    assert w.replicas.loads >= len(MANY)
    client, f_client = w.connector.client(), full.connector.client()
    for m in MANY:
        assert outputs(client, m) == outputs(f_client, m)
        assert int(client.get(ModelKeys(m).learnt)) == 24
        assert_same_stats(w, full, m)
    w.shutdown()
    full.shutdown()


def padded_messages(n: int, seed: int, pad: int = 400) -> list[dict]:
    """Token messages of about 3 KiB each (``pad`` filler tokens)."""
    out = token_messages(n, seed=seed)
    for m in out:
        m["tokens"] = m["tokens"] + [f"filler{j % 37}" for j in range(pad)]
    return out


def test_a_backlog_is_read_in_groups_within_the_bound(server, monkeypatch):
    """A worker serving more models than FEW_MODELS reads a backlog in groups of streams
    (workers/replication/read_plan.py), making room before each read: the stand-in RSS (the
    held replicas, and the entries of the last read, alive until the next read) is within
    the bound right after every read, where one read of every stream would bring the
    whole backlog at once, past it; and it predicts and learns bit for bit as a worker
    holding every replica."""
    from streamnb_workers.replication.read_plan import entries_bytes
    from streamnb_workers.worker import intake

    floor, extra = 2**20, [0]
    # (the budget's 16th, the read's room, within what the floor leaves)
    w, full, size, budget = bounded_and_full_workers(server, 11, floor, extra, lambda size: 4 * size)
    read, after_reads, backlog = intake.read_models, [], [0]

    def read_grows(*a, **k):  # what a read brings stays until the next read
        got = read(*a, **k)
        if a[0] is w.reader:
            extra[0] = sum(entries_bytes(batch.entries)[1] for _, batch in got)
            after_reads.append(w.replicas.resident())
        return got

    monkeypatch.setattr(intake, "read_models", read_grows)
    w.start()
    full.start()
    for i, m in enumerate(MANY):
        part = padded_messages(20, seed=90 + i)
        backlog[0] += entries_bytes(
            [(b"1-0", {b"data": msgpack.packb(x, use_bin_type=True)}) for x in part])[1]
        produce(w.connector.client(), m, part)
        produce(full.connector.client(), m, part)
    assert floor + backlog[0] > budget + size  # one read of it all: past the bound
    w.run_until_idle()
    full.run_until_idle()
    assert after_reads and max(after_reads) <= budget, (max(after_reads), budget)
    assert len(after_reads) > len(MANY)  # in groups, over steps
    client, f_client = w.connector.client(), full.connector.client()
    for m in MANY:  # batches of other sizes: the same verdicts, log-probabilities to 1e-12
        got, want = outputs(client, m), outputs(f_client, m)
        assert [row[:2] for row in got] == [row[:2] for row in want]
        for (_, _, a), (_, _, b) in zip(got, want, strict=True):
            assert a.keys() == b.keys() and all(abs(a[c] - b[c]) < 1e-12 for c in a)
        assert int(client.get(ModelKeys(m).learnt)) == 20
        assert_same_stats(w, full, m)
    w.shutdown()
    full.shutdown()
