"""A model in K statistics shards (workers/replication/shards.py): names and slots, routing, the config
that fixes K, workers that learn each message once in its shard and predict with the sum
(equal to one offline fit of every message), and a worker that serves the other shards
while one shard's Redis node is away (workers/worker/outages.py)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import redis
from redis.crc import key_slot

from streamnb.exceptions import ConfigConflict
from streamnb_workers.replication.shards import (
    Router,
    ShardSum,
    load_model,
    route_id,
    shard_names,
    shard_of,
)
from streamnb_workers.store.keys import GROUP, MAX_SHARDS, ModelKeys, check_model_name
from streamnb_workers.store.model_config import ModelSpec, ensure_config, read_config, resolve_spec
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import (
    assert_same_stats,
    count_spec,
    fast_options,
    offline_model,
    run_in_threads,
    token_messages,
    url_worker,
    vector_messages,
)

pytestmark = pytest.mark.redis


def send(client, model: str, k: int, messages: list[dict]) -> dict[str, list[dict]]:
    """XADD each message to its shard; returns shard name -> its messages."""
    router = Router(model, k)
    by_shard: dict[str, list[dict]] = {}
    pipe = client.pipeline(transaction=False)
    for m in messages:
        keys = router.keys_for(route_id(m))
        pipe.xadd(keys.input, {"data": msgpack.packb(m, use_bin_type=True)})
        by_shard.setdefault(keys.name, []).append(m)
    pipe.execute()
    return by_shard


# ----------------------------------------------------------------------------- names, routing
@pytest.mark.parametrize("k", [2, 3, 5, 16, MAX_SHARDS])
def test_each_shard_falls_in_its_share_of_the_slots(k):
    names = shard_names("mail", k)
    assert len(set(names)) == k and names == shard_names("mail", k)
    for j, name in enumerate(names):
        assert key_slot(ModelKeys(name).log.encode()) * k // 16384 == j
        assert check_model_name(name, shard=True) == name
        with pytest.raises(ValueError):
            check_model_name(name)  # no user model can take a shard's name


def test_routing_follows_the_id_or_the_ref():
    assert shard_of("m1", 1) == 0
    ids = [f"m{i}" for i in range(3000)]
    counts = np.bincount([shard_of(i, 3) for i in ids], minlength=3)
    assert counts.min() > 900  # crc32 spreads ids evenly
    assert route_id({"id": "a", "text": "x"}) == "a"
    assert route_id({"ref": "a", "label": "spam"}) == "a"  # a delayed label: its message's shard
    assert route_id({"id": 7}) == "7" and route_id({"text": "x"}) is None
    assert route_id([1, 2]) is None and route_id({"id": True}) is None
    with pytest.raises(ValueError):
        shard_names("mail", 0)


def test_the_number_of_shards_is_fixed_at_creation(r):
    cfg = ensure_config(r, count_spec("mail", shards=3))
    assert cfg.shards == 3 and read_config(r, "mail").shards == 3
    assert ensure_config(r, count_spec("mail")).shards == 3  # as stored
    with pytest.raises(ConfigConflict, match="shards: stored 3, given 2"):
        ensure_config(r, count_spec("mail", shards=2))
    with pytest.raises(ValueError, match="shards must be an integer"):
        ModelSpec("x", shards=0)
    assert resolve_spec(count_spec("y")).shards == 1


def test_cli_refuses_a_bad_shard_count_in_one_line(capsys):
    from streamnb_workers.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["worker", "--model", "mail", "--shards", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shards" in err[0] and f"1..{MAX_SHARDS}" in err[0]


# ----------------------------------------------------------------------------- workers
def test_workers_learn_each_message_once_in_its_shard_and_predict_with_the_sum(redis_server):
    r = redis_server.client()
    msgs = token_messages(1500, seed=5, labelled_share=0.8)
    by_shard = send(r, "mail", 3, msgs)
    spec = count_spec("mail", shards=3)
    workers = [url_worker(redis_server.url, [spec], fast_options(f"w{i}")) for i in range(2)]
    run_in_threads(workers)
    params = resolve_spec(count_spec()).model_params
    fcfg = {"bits": 10, "counts": "raw"}
    names = shard_names("mail", 3)
    assert sorted(workers[0].models) == sorted(names)
    for name in names:
        ref = offline_model("multinomial", params, fcfg, by_shard[name])
        outs = [decode_output(d[b"data"]) for _, d in r.xrange(ModelKeys(name).out)]
        assert sorted(o["id"] for o in outs) == sorted(m["id"] for m in by_shard[name])
        assert r.xpending(ModelKeys(name).input, GROUP)["pending"] == 0
        for w in workers:
            assert_same_stats(w.models[name].replica.model, ref)  # each shard exactly once
    whole = offline_model("multinomial", params, fcfg, msgs)
    sums = [w.models[names[0]].predictor for w in workers]
    for total in sums:
        assert_same_stats(total, whole)  # the sum is one fit of every message
    assert all(w.models[n].summed is w.models[names[0]].summed for w in workers for n in names)
    model, version = load_model(r, "mail")  # what status and export read
    assert_same_stats(model, whole)
    assert version.split(",") == [w.models[n].replica.version for n in names for w in workers[:1]]
    # the sum predicts: an unlabelled message's output agrees with the offline model's
    X = np.zeros((1, 1024))
    assert np.allclose(sums[0].predict_joint_log_proba(X), whole.predict_joint_log_proba(X))


def test_gaussian_shards_sum_in_shard_order_bit_identical(redis_server):
    r = redis_server.client()
    msgs = vector_messages(900, d=3, seed=4)
    send(r, "vec", 2, msgs)
    spec = ModelSpec("vec", kind="gaussian", featurizer_config={"input": "dense", "dim": 3},
                     shards=2)
    workers = [url_worker(redis_server.url, [spec], fast_options(f"g{i}", batch=37))
               for i in range(2)]
    run_in_threads(workers)
    name = shard_names("vec", 2)[0]
    a, b = (w.models[name].predictor for w in workers)
    assert_same_stats(a, b)  # summed anew in shard order: equal bit for bit
    ref = offline_model("gaussian", {}, {"input": "dense", "dim": 3}, msgs)
    assert_same_stats(a, ref, rtol=1e-9, atol=1e-9)


def test_the_sum_follows_decay_and_reload(redis_server):
    r = redis_server.client()
    spec = count_spec("mail", shards=2, half_life=50.0)
    msgs = token_messages(400, seed=6)
    send(r, "mail", 2, msgs)
    w = url_worker(redis_server.url, [spec], fast_options("w0"))
    w.run_until_idle()
    names = shard_names("mail", 2)
    total: ShardSum = w.models[names[0]].summed
    expect = w.models[names[0]].replica.model.stats.copy().merge(
        w.models[names[1]].replica.model.stats)
    assert_same_stats(total.model, type(total.model).from_stats(expect))
    resums = total.resums
    w.models[names[1]].replica.load()  # a reload (as after a trim or a rewind)
    assert_same_stats(total.model, type(total.model).from_stats(expect))
    assert total.resums == resums + 1


# ----------------------------------------------------------------------------- a shard away
class ShardDown:
    """A client that fails every command touching one shard's keys while ``down``."""

    def __init__(self, client, tag: str) -> None:
        self._client, self._tag, self.down = client, "{" + tag + "}", False

    def _touches(self, args) -> bool:
        return any(self._tag in (a.decode("utf-8", "replace") if isinstance(a, bytes) else str(a))
                   for a in args)

    def execute_command(self, *args, **kw):
        if self.down and self._touches(args):
            raise redis.ConnectionError("shard down (test)")
        return self._client.execute_command(*args, **kw)

    def pipeline(self, transaction=True):
        pipe = self._client.pipeline(transaction=transaction)
        real = pipe.execute

        def execute(*a, **kw):
            if self.down and any(self._touches(c[0]) for c in pipe.command_stack):
                pipe.reset()
                raise redis.ConnectionError("shard down (test)")
            return real(*a, **kw)

        pipe.execute = execute
        return pipe

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if callable(attr) and name not in ("pipeline",):
            def call(*a, _attr=attr, **kw):
                if self.down and self._touches(list(a) + list(kw.values())):
                    raise redis.ConnectionError("shard down (test)")
                return _attr(*a, **kw)
            return call
        return attr


class ClusterLike:
    """A connector that says "cluster" (one read a model, no pipelined commits) around
    one client."""

    cluster = True

    def __init__(self, client) -> None:
        self._client = client

    def client(self):
        return self._client

    def reader(self, block_ms):
        return self._client

    def describe(self):
        return "test"


def test_a_worker_serves_the_other_shards_while_one_is_away(redis_server):
    from prometheus_client import CollectorRegistry

    from streamnb_workers.observe.metrics import Metrics
    from streamnb_workers.worker.loop import Worker

    r = redis_server.client()
    names = shard_names("mail", 3)
    flaky = ShardDown(redis_server.client(), names[0])
    metrics = Metrics(CollectorRegistry())
    w = Worker(ClusterLike(flaky), [count_spec("mail", shards=3)], fast_options("w0"), metrics)
    first = token_messages(300, seed=7)
    sent = send(r, "mail", 3, first)
    w.run_until_idle()
    learnt = {n: w.models[n].replica.learnt for n in names}
    flaky.down = True
    second = token_messages(300, seed=8)
    second_by = send(r, "mail", 3, second)
    for _ in range(40):
        w.step(10)
    for j, name in enumerate(names):
        grew = w.models[name].replica.learnt - learnt[name]
        assert grew == (0 if j == 0 else len(second_by[name])), name
    reach = metrics.model_reachable.labels(model=names[0], worker="w0")._value.get()
    assert reach == 0 and names[0] in w.guard.outages
    errors = metrics.redis_errors.labels(model=names[0], worker="w0", kind="connection")
    assert errors._value.get() >= 1
    flaky.down = False
    w.run_until_idle()
    assert names[0] not in w.guard.outages
    assert metrics.model_reachable.labels(model=names[0], worker="w0")._value.get() == 1
    params = resolve_spec(count_spec()).model_params
    fcfg = {"bits": 10, "counts": "raw"}
    for name in names:
        msgs = sent[name] + second_by[name]
        assert_same_stats(w.models[name].replica.model,
                          offline_model("multinomial", params, fcfg, msgs))
        assert r.xpending(ModelKeys(name).input, GROUP)["pending"] == 0
    assert_same_stats(w.models[names[0]].predictor,
                      offline_model("multinomial", params, fcfg, first + second))


def test_a_sharded_model_comes_back_whole_after_redis_lost_everything(redis_server):
    r = redis_server.client()
    spec = count_spec("mail", shards=2)
    msgs = token_messages(200, seed=9)
    send(r, "mail", 2, msgs)
    w = url_worker(redis_server.url, [spec], fast_options("w0"))
    w.run_until_idle()
    r.flushall()
    w.check_keys = True  # as after a reconnect
    for _ in range(200):  # the groups are made again once the others could answer
        w.step(10)
        if not w.check_keys:
            break
    assert read_config(r, "mail").shards == 2  # a worker started later finds the shards
    for name in shard_names("mail", 2):
        assert read_config(r, name) is not None
    more = token_messages(100, seed=10)
    send(r, "mail", 2, more)
    w.run_until_idle()
    params = resolve_spec(count_spec()).model_params
    model, _ = load_model(r, "mail")
    assert_same_stats(model, offline_model("multinomial", params, {"bits": 10, "counts": "raw"},
                                           msgs + more))


def test_workers_serving_several_shards_never_wait_on_each_other_in_a_cycle(corpus_dir):
    """Each worker holds a batch of each shard it reads; were they processed in any
    order, a worker could wait (ordered predictions) for another's earlier batch of one
    shard while that one waits for its own of another, until ``order_wait_ms`` (seen
    here: 3 to 6 waits of 1 s given up in each run; the test waits 20 s, which only a
    cycle outlasts). Processed in one order every worker
    agrees on (workers/worker/intake.py ``in_stream_order``), announced as soon as read and
    none read ahead, no wait gives up. Three worker processes started together on the
    corpus (the synthetic mail is too light to make the cycle)."""
    import urllib.request

    from benchmarks._common import corpus_or_synthetic
    from benchmarks._worker_stats import metrics_port
    from benchmarks.end_to_end import (
        RedisServer,
        keys,
        prefill,
        repeated_messages,
        route_to_shards,
        wait_blocked,
        wait_until,
        workers,
    )

    msgs = repeated_messages(corpus_or_synthetic(str(corpus_dir), None), "tokens", 2)
    names, shares = route_to_shards(msgs, "mail", 3)
    with RedisServer() as server:
        client = server.client()
        for name, share in zip(names, shares, strict=True):
            prefill(client, name, share)
            client.xgroup_create(keys(name)["in"], GROUP, id="$")
        spec = {"name": "mail", "kind": "multinomial", "shards": 3}
        # a wait long enough that a loaded host's slow batch is not taken for a cycle (a
        # cycle waits it out whatever its length, and is counted)
        with workers(server.url, [[spec]], 3, {"order_wait_ms": 20_000},
                     metrics=True) as procs:
            assert wait_blocked(client, 3, 60, procs)
            gate = client.pipeline(transaction=True)  # all three start at once
            for name in names:
                gate.xgroup_setid(keys(name)["in"], GROUP, "0")
            gate.execute()
            assert wait_until(lambda: sum(client.xlen(keys(n)["out"]) for n in names)
                              >= len(msgs), 300, procs)
            gave_up = 0.0
            for proc in procs:
                url = f"http://127.0.0.1:{metrics_port(proc)}/metrics"
                with urllib.request.urlopen(url, timeout=10) as resp:
                    gave_up += sum(float(line.split()[-1]) for line in
                                   resp.read().decode().splitlines()
                                   if line.startswith("streamnb_order_wait_timeouts_total{"))
    assert gave_up == 0
