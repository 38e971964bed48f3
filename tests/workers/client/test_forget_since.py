"""``streamnb forget --source NAME --since TIME`` against a real redis-server: what the
source taught since the time is taken out exactly and once, identically on every replica
(the statistics digest of a run that learnt only the earlier part), its keys learnt since
then are released and those learnt before kept; what cannot be taken out exactly is
refused in one line, nothing written."""

from __future__ import annotations

import time

import pytest

from benchmarks.replay_digest import stats_arrays, stats_digest
from streamnb.exceptions import SettingsError
from streamnb_workers.client.forget_since import forget_source_since
from streamnb_workers.store.keys import ModelKeys, source_epochs_key
from streamnb_workers.wire.learn_keys import record_teacher
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.acl import cli
from tests.helpers.workers import (
    FCFG,
    PARAMS,
    count_spec,
    fast_options,
    learnt_model,
    offline_model,
    produce,
    run_in_threads,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis


def _workers(url, name, n=2, **kw):
    return [url_worker(url, [count_spec(name)], fast_options(f"w{i}", batch=13, **kw))
            for i in range(n)]


def _digest(model) -> str:
    return stats_digest(stats_arrays(model.stats))


def _replica_digests(ws, name):
    for w in ws:
        w.models[name].tail()
    return {_digest(w.models[name].replica.model) for w in ws}


def _as(msgs, source):
    return [{**m, "source": source} for m in msgs]


def _mixed(a, b):
    return [m for pair in zip(_as(a, "imap"), _as(b, "bulk"), strict=True) for m in pair]


def _labelled(msgs):
    return [m for m in msgs if m.get("label") is not None]


@pytest.fixture
def taught_across(redis_server):
    """Model "mail" taught by ``imap`` and ``bulk`` before a time T and after it, by two
    workers; (client, workers, T, imap before, imap after, bulk)."""
    r = redis_server.client()
    msgs = token_messages(240, classes=("spam", "ham"), seed=43, labelled_share=0.9)
    imap_before, bulk_before = msgs[0:80:2], msgs[1:80:2]
    imap_after, bulk_after = msgs[80::2], msgs[81::2]
    ws = _workers(redis_server.url, "mail")
    produce(r, "mail", _mixed(imap_before, bulk_before))
    run_in_threads(ws)
    time.sleep(0.01)
    since = int(time.time() * 1000)
    time.sleep(0.01)
    produce(r, "mail", _mixed(imap_after, bulk_after))
    run_in_threads(ws)
    return r, ws, since, imap_before, imap_after, bulk_before + bulk_after


def test_forget_since_leaves_the_statistics_of_a_run_that_learnt_only_the_earlier_part(
        redis_server, taught_across):
    r, ws, since, imap_before, imap_after, bulk = taught_across
    every = offline_model("multinomial", PARAMS, FCFG, imap_before + imap_after + bulk)
    assert _replica_digests(ws, "mail") == {_digest(every)}
    # the run that never learnt imap's later messages
    produce(r, "only", _mixed(imap_before, bulk[:len(imap_before)]) +
            _as(bulk[len(imap_before):], "bulk"))
    only = _workers(redis_server.url, "only")
    run_in_threads(only)
    want = _digest(learnt_model(r, "only")[0])
    assert want == _digest(offline_model("multinomial", PARAMS, FCFG, imap_before + bulk))

    (done,) = forget_source_since(r, "mail", "imap", since)
    assert done.released == len(_labelled(imap_after))
    assert done.kept == len(_labelled(imap_before))
    assert sum(done.weight.values()) == len(_labelled(imap_after))
    assert _replica_digests(ws, "mail") == {want}          # every replica, bit for bit
    assert _digest(learnt_model(r, "mail")[0]) == want     # and snapshot + log
    fresh = _workers(redis_server.url, "mail", 1)
    fresh[0].start()
    assert _replica_digests(fresh, "mail") == {want}

    k = ModelKeys("mail")
    assert int(r.hget(source_epochs_key(k), "imap")) == 1
    kept = _labelled(imap_before)[0]["key"]
    assert record_teacher(r.hget(k.learnt_keys, kept)) == ("imap", 1)
    assert r.hget(k.learnt_keys, _labelled(imap_after)[0]["key"]) is None
    # once: run again, nothing more is taken out (nothing taught since the time)
    (again,) = forget_source_since(r, "mail", "imap", since)
    assert again.entry is None and _replica_digests(ws, "mail") == {want}

    # an earlier message sent again is learnt already; a later one is learnt again
    earlier, later = _labelled(imap_before)[1], _labelled(imap_after)[1]
    produce(r, "mail", _as([{**earlier, "id": "e-again"}, {**later, "id": "l-again"}], "imap"))
    run_in_threads(ws)
    outs = {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in r.xrange(k.out))}
    assert outs["e-again"]["reason"] == "already_learnt" and outs["l-again"]["learned"]
    assert _replica_digests(ws, "mail") == {_digest(offline_model(
        "multinomial", PARAMS, FCFG, imap_before + bulk + [later]))}


def test_what_cannot_be_taken_out_exactly_is_refused_with_nothing_written(
        redis_server, taught_across):
    r, ws, since, imap_before, imap_after, bulk = taught_across
    k = ModelKeys("mail")
    # a forget of one message imap taught, after the time: its key's record would be wrong
    gone = _labelled(imap_before)[0]
    produce(r, "mail", [{**gone, "forget": True, "id": "f1"}])
    run_in_threads(ws)
    length = r.xlen(k.log)
    with pytest.raises(SettingsError, match="forgets or corrections"):
        forget_source_since(r, "mail", "imap", since)
    # a log trimmed past the time
    r.hset(k.snapshot, "trimmed", f"{int(time.time() * 1000)}-0")
    with pytest.raises(SettingsError, match="reaches back to"):
        forget_source_since(r, "mail", "bulk", since)
    assert r.xlen(k.log) == length and r.hget(source_epochs_key(k), "imap") is None
    r.hdel(k.snapshot, "trimmed")
    # bulk subtracted nothing since the time: it can be taken out
    (done,) = forget_source_since(r, "mail", "bulk", since)
    assert done.entry is not None and done.kept == len(_labelled(bulk[:40]))


def test_the_command_line(redis_server, taught_across):
    r, ws, since, *_ = taught_across
    url = redis_server.url
    for args, says in ((["--source", "imap", "--since", "yesterday"], "ISO 8601"),
                       (["--source", "imap", "--since", "2999-01-01"], "not in the future"),
                       (["--since", "2026-01-01"], "--since goes with --source")):
        got = cli("forget", "--redis", url, "--model", "mail", *args)
        assert got.returncode == 2 and says in got.stderr
        assert len(got.stderr.strip().splitlines()) == 1
    got = cli("forget", "--redis", url, "--model", "mail", "--source", "imap", "--since",
              str(since / 1000))
    assert got.returncode == 0, got.stderr
    assert "forgetting what source 'imap' taught 'mail' since" in got.stdout
    assert "learn-once keys released" in got.stdout


def test_a_sharded_model_forgets_the_default_source_since_a_time_in_every_shard(redis_server):
    """Plain deltas (the default source's first epoch, no parts) at times 1 s and 5 s in
    each of two shards; forgetting the default source since 3 s leaves the first ones."""
    import numpy as np

    from streamnb_workers.replication.replica import encode_delta
    from streamnb_workers.replication.shards import keys_of, load_replicas, shard_spec
    from streamnb_workers.store.model_config import ModelSpec, ensure_config
    from streamnb_workers.wire.learn_keys import encode_record

    r = redis_server.client()
    cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 2},
                                     shards=2))
    for j, keys in enumerate(keys_of("doc", 2)):
        shard = ensure_config(r, shard_spec(cfg, keys.name)).make_model()
        for at, row, key in ((1000, [1.0 + j, 0, 0, 1], "old"), (5000, [0, 2.0, 0, 0], "new")):
            stats = shard.batch_stats(np.array([row]), ["ham"])
            r.xadd(keys.log, {"data": encode_delta(stats, None, 1, "w", "b")}, id=f"{at}-0")
            r.hset(keys.learnt_keys, key, encode_record("ham", 1.0))
            r.zadd(keys.key_order, {key: at})
    done = forget_source_since(r, "doc", "default", 3000)
    assert [(d.released, d.kept, d.weight) for d in done] == [(1, 1, {"ham": 1.0})] * 2
    model, _, replicas = load_replicas(r, "doc")
    assert model.stats["features"].toarray().tolist() == [[3.0, 0.0, 0.0, 2.0]]
    assert all(rep.epochs == {"default": 1} for rep in replicas)
    for keys in keys_of("doc", 2):
        assert r.hget(keys.learnt_keys, "new") is None
        assert record_teacher(r.hget(keys.learnt_keys, "old")) == ("default", 1)


def test_the_challenger_forgets_what_the_source_taught_it_since_the_time(redis_server):
    """A challenger (workers/replication/challenger.py) keeps its parts by source as the
    model does: after the forget it holds what it would have learnt without imap's later
    messages, as the model does."""
    r = redis_server.client()
    msgs = token_messages(160, classes=("spam", "ham"), seed=47)
    before, after = _mixed(msgs[0:60:2], msgs[1:60:2]), _mixed(msgs[60::2], msgs[61::2])
    ws = _workers(redis_server.url, "mail", 1, challenger="alpha=1.0")
    produce(r, "mail", before)
    run_in_threads(ws)
    time.sleep(0.01)
    since = int(time.time() * 1000)
    time.sleep(0.01)
    produce(r, "mail", after)
    run_in_threads(ws)
    only = _workers(redis_server.url, "only", 1, challenger="alpha=1.0")
    produce(r, "only", before + [m for m in after if m["source"] == "bulk"])
    run_in_threads(only)
    (done,) = forget_source_since(r, "mail", "imap", since)
    assert done.entry is not None
    ws[0].models["mail"].tail()
    got, want = ws[0].models["mail"].replica, only[0].models["only"].replica
    assert _digest(got.model) == _digest(want.model)
    assert _digest(got.challenger.model) == _digest(want.challenger.model)
