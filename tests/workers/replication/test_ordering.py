"""Ordered predictions across workers (workers/replication/ordering.py) against a real redis-server.

Worker A reads the first labelled batch and is slow to predict it; worker B reads the
next batch meanwhile. With ordering (the default), B waits for A's commit, so B's
predictions are exactly the one-at-a-time test-then-train predictions (those of a single
worker); with ``order_wait_ms=0`` they miss A's labels and differ.
"""

from __future__ import annotations

import threading
import time

import msgpack
import numpy as np
import pytest

import streamnb_workers.worker.process as process_module
from streamnb.features import Featurizer
from streamnb.models import make_model
from streamnb_workers.replication.ordering import InflightBoard, wait_for_earlier
from streamnb_workers.store.commit import CommitRequest, commit_batch
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.model_config import resolve_spec
from streamnb_workers.wire.codec import decode_input
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import (
    FCFG,
    count_spec,
    fast_options,
    produce,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis

BATCH = 40


def _one_at_a_time(msgs: list[dict]) -> list[dict]:
    """Log posteriors of each message by a model that learnt every labelled one before it."""
    f = Featurizer.from_config(FCFG)
    model = make_model("multinomial", **resolve_spec(count_spec()).model_params)
    X = f.stack([f.featurize(decode_input(msgpack.packb(m), "0-0").as_payload()) for m in msgs])
    pred = model.predict_log_proba_prequential(X, [m.get("label") for m in msgs])
    return [{c: float(pred.log_proba[i, j]) for j, c in enumerate(pred.classes)
             if np.isfinite(pred.log_proba[i, j])} for i in range(len(msgs))]


def _b_while_a_holds_the_first_batch(url: str, order_wait_ms: int, hold_s: float = 0.5,
                                     monkeypatch=None):
    """Worker A reads the first batch and holds it in its prediction for ``hold_s``; worker
    B meanwhile reads the next batch and processes it. Returns (A, B, B's seconds)."""
    spec = count_spec()
    a = url_worker(url, [spec], fast_options("a", batch=BATCH, order_wait_ms=order_wait_ms))
    b = url_worker(url, [spec], fast_options("b", batch=BATCH, order_wait_ms=order_wait_ms))
    a.start()
    b.start()
    inside = threading.Event()
    predict = process_module.predict_items

    def slow_predict(rt, *args, **kw):  # A has read and announced batch 1; hold it
        if rt is a.models["mail"]:
            inside.set()
            time.sleep(hold_s)
        return predict(rt, *args, **kw)

    monkeypatch.setattr(process_module, "predict_items", slow_predict)
    ta = threading.Thread(target=a.step, kwargs={"block_ms": 100})
    ta.start()
    assert inside.wait(10)
    t0 = time.monotonic()
    b.step(block_ms=100)  # reads batch 2, waits or not, predicts it, commits
    b_seconds = time.monotonic() - t0
    ta.join(10)
    return a, b, b_seconds


def _race(url: str, client, order_wait_ms: int, monkeypatch,
          ) -> tuple[list[dict], dict[str, dict], float]:
    msgs = token_messages(2 * BATCH, seed=7)
    produce(client, "mail", msgs)
    _, _, b_seconds = _b_while_a_holds_the_first_batch(url, order_wait_ms, monkeypatch=monkeypatch)
    outs = {o["id"]: o for o in (decode_output(f[b"data"])
                                 for _, f in client.xrange(ModelKeys("mail").out))}
    assert len(outs) == 2 * BATCH
    assert {outs[m["id"]]["worker"] for m in msgs[BATCH:]} == {"b"}
    return msgs, outs, b_seconds


def test_a_worker_waits_for_the_earlier_labelled_batch_of_another(redis_server, monkeypatch):
    client = redis_server.client()
    msgs, outs, b_seconds = _race(redis_server.url, client, order_wait_ms=5000,
                                  monkeypatch=monkeypatch)
    expected = _one_at_a_time(msgs)
    for m, exp in zip(msgs, expected, strict=True):
        got = outs[m["id"]]["log_proba"]
        assert set(got) == set(exp), m["id"]
        np.testing.assert_allclose([got[c] for c in exp], list(exp.values()), rtol=1e-9,
                                   atol=1e-9, err_msg=m["id"])
    assert b_seconds >= 0.3  # B did wait for A's commit
    assert client.hgetall(ModelKeys("mail").inflight) == {}  # both withdrew after committing


def test_without_ordering_the_second_batch_misses_the_first(redis_server, monkeypatch):
    client = redis_server.client()
    msgs, outs, _ = _race(redis_server.url, client, order_wait_ms=0, monkeypatch=monkeypatch)
    expected = _one_at_a_time(msgs)
    second = [m for m in msgs[BATCH:]]
    differs = sum(set(outs[m["id"]]["log_proba"]) != set(e) or not np.allclose(
        [outs[m["id"]]["log_proba"].get(c, np.nan) for c in e], list(e.values()))
        for m, e in zip(second, expected[BATCH:], strict=True))
    assert differs >= BATCH // 2


def test_an_unlabelled_batch_is_withdrawn_before_it_is_featurized(redis_server):
    """Others wait for a batch only while it may hold labels: an unlabelled one is
    withdrawn once decoded; a labelled one stays announced until its commit."""
    client = redis_server.client()
    keys = ModelKeys("mail")
    w = url_worker(redis_server.url, [count_spec()], fast_options("u"))
    w.start()
    rt = w.models["mail"]
    seen = []
    featurize_batch = rt.featurizer.featurize_batch

    def spy(msgs, *options):
        seen.append(sorted(client.hgetall(keys.inflight)))
        return featurize_batch(msgs, *options)

    object.__setattr__(rt.featurizer, "featurize_batch", spy)
    produce(client, "mail", token_messages(30, seed=1, labelled_share=0.0))
    w.step(block_ms=100)
    produce(client, "mail", token_messages(5, seed=2))
    w.step(block_ms=100)
    assert seen[0] == [] and [f.rpartition(b"|")[0] for f in seen[1]] == [b"u"]
    assert client.hgetall(keys.inflight) == {}
    assert len(list(client.xrange(keys.out))) == 35


def test_a_stale_announcement_is_not_waited_for(redis_server):
    client = redis_server.client()
    keys = ModelKeys("mail")
    # a worker that died mid-batch 11 s ago, with a batch before everything
    InflightBoard(client, keys, "dead-worker").announce("0-1", 5, now=time.time() - 11)
    produce(client, "mail", token_messages(20, seed=2))
    w = url_worker(redis_server.url, [count_spec()], fast_options("w", order_wait_ms=5000))
    t0 = time.monotonic()
    w.step(block_ms=100)
    assert time.monotonic() - t0 < 4  # not the 5 s wait
    assert client.hgetall(keys.inflight) == {}  # removed as stale, own one withdrawn


def test_labels_of_another_type_than_the_earlier_batch_defined_are_dead_letters(redis_server,
                                                                                 monkeypatch):
    """B decodes its batch (str labels) on an empty model while A holds the first batch
    (int labels); after waiting for A, B's labels no longer fit the model: bad_label."""
    client = redis_server.client()
    first = [{"id": f"a{i}", "key": f"a{i}", "tokens": ["x", "y"], "label": i % 2}
             for i in range(BATCH)]
    second = [{"id": f"b{i}", "tokens": ["x", "z"], "label": "spam"} for i in range(5)]
    produce(client, "mail", first + second)
    _, b, _ = _b_while_a_holds_the_first_batch(redis_server.url, order_wait_ms=5000, hold_s=0.3,
                                               monkeypatch=monkeypatch)
    keys = ModelKeys("mail")
    dead = [decode_output(f[b"data"]) for _, f in client.xrange(keys.dead)]
    assert sorted(d["reason"] for d in dead) == ["bad_label"] * 5
    assert "but this model's labels are int" in dead[0]["detail"]
    assert b.models["mail"].replica.model.stats["classes"].labels == [0, 1]


class _CountingBoard(InflightBoard):
    """An :class:`InflightBoard` that counts its looks at ``:inflight`` once ``done`` is
    set (just before the other worker's batch is committed or withdrawn), and says when
    it has looked once (``looked``)."""

    __slots__ = ("done", "looked", "looks_after")

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.done = threading.Event()
        self.looked = threading.Event()
        self.looks_after = 0

    def earlier(self, first_id, now=None):
        self.looks_after += self.done.is_set()
        found = super().earlier(first_id, now)
        self.looked.set()
        return found


def _waiting_for_a(client, keys: ModelKeys, then, poll_ms: int) -> tuple[object, _CountingBoard]:
    """B waits for A's announced batch while a thread does ``then(field, entry id)`` 50 ms
    after B's first look; B's catch-up collects the announcements named by the log entries
    it reads. ``done`` is set before ``then``, so every look that can find the batch gone
    is counted (set after, a look in between would end the wait uncounted)."""
    client.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
    eid = client.xadd(keys.input, {"data": b"x"}).decode()
    client.xreadgroup(GROUP, "a", {keys.input: ">"})
    name = InflightBoard(client, keys, "a").announce(eid, 1)
    b = _CountingBoard(client, keys, "b")
    version = ["0-0"]

    def catch_up(batches: set[str], block_ms: int) -> int:
        read = client.xread({keys.log: version[0]}, block=block_ms)
        entries = read[0][1] if read else []
        for entry_id, fields in entries:
            version[0] = entry_id.decode()
            if b"inflight" in fields:
                batches.add(fields[b"inflight"].decode())
        return len(entries)

    def act() -> None:
        assert b.looked.wait(10)  # B has seen A's batch: it is waiting for it
        time.sleep(0.05)
        b.done.set()
        then(name, eid)

    actor = threading.Thread(target=act)
    actor.start()
    res = wait_for_earlier(b, "9999999999999-0", 5.0, catch_up, poll_ms=poll_ms)
    actor.join()
    return res, b


def test_the_wait_ends_on_the_log_entry_of_the_batch_it_waits_for(redis_server):
    """The commit's log entry names its announcement: applying it ends the wait, with no
    second look at ``:inflight`` and nothing left for the caller to catch up."""
    client, keys = redis_server.client(), ModelKeys("mail")

    def commit(name: str, eid: str) -> None:
        assert commit_batch(client, keys, "a", CommitRequest(
            ids=[eid], log_data=b"d", n_learnt=1, inflight_key=keys.inflight,
            inflight_field=name)).ok

    res, b = _waiting_for_a(client, keys, commit, poll_ms=3000)  # blocked when it lands
    assert res.waited_for == 1 and res.caught_up and not res.timed_out
    assert 0.04 < res.seconds < 4 and b.looks_after == 0


def test_a_batch_withdrawn_without_a_log_entry_ends_the_wait_at_the_next_look(redis_server):
    client, keys = redis_server.client(), ModelKeys("mail")
    res, b = _waiting_for_a(client, keys, lambda name, eid: client.hdel(keys.inflight, name),
                            poll_ms=20)
    assert res.waited_for == 1 and not res.caught_up and not res.timed_out
    assert 0.04 < res.seconds < 4 and b.looks_after >= 1


def _read_announced(r, consumer, models, count=5, block_ms=0):
    from streamnb_workers.worker import intake

    boards = [(keys, InflightBoard(r, keys, consumer)) for keys in models]
    return boards, intake.read_announced(r, r, consumer, boards, count, block_ms)


def test_every_delivered_batch_is_announced_before_a_later_read_returns(redis_server):
    """A read and its announcement are one step (read.lua and XREADGROUP in one MULTI):
    once worker A's read has returned, a worker B that read the next entries after it
    finds A's batch in flight, however long A takes to get to it."""
    from streamnb_workers.worker import intake

    r = redis_server.client()
    keys = ModelKeys("atomic")
    r.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
    intake.READ_SCRIPT.load(r)
    for i in range(10):
        r.xadd(keys.input, {"data": f"m{i}".encode()})
    ((_, board_a),), ((_, batch_a),) = _read_announced(r, "a", [keys])
    ((_, board_b),), ((_, batch_b),) = _read_announced(r, "b", [keys])
    start_a, start_b = (batch.entries[0][0].decode() for batch in (batch_a, batch_b))
    assert batch_a.announced == f"a|{start_a}" and batch_b.announced == f"b|{start_b}"
    assert board_b.earlier(start_b) == [batch_a.announced] and board_a.earlier(start_a) == []
    # with nothing to read it waits on XREAD (which reads nothing) and reads once more
    t = threading.Timer(0.2, lambda: r.xadd(keys.input, {"data": b"late"}))
    t.start()
    t0 = time.monotonic()
    _, ((_, late),) = _read_announced(r, "a", [keys], block_ms=5000)
    assert time.monotonic() - t0 < 4 and late.entries[0][1] == {b"data": b"late"}
    assert r.hexists(keys.inflight, late.announced)
    assert _read_announced(r, "b", [keys], block_ms=50)[1] == []
    r.delete(keys.input, keys.inflight)


def test_several_models_are_read_and_announced_in_one_step(redis_server):
    from streamnb_workers.worker import intake

    r = redis_server.client()
    models = [ModelKeys("multi1"), ModelKeys("multi2"), ModelKeys("multi3")]
    for keys in models:
        r.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
    intake.READ_SCRIPT.load(r)
    for keys in models[:2]:
        r.xadd(keys.input, {"data": b"x"})
    _, got = _read_announced(r, "a", models)
    assert [i for i, _ in got] == [0, 1]
    for i, batch in got:
        assert r.hget(models[i].inflight, batch.announced) is not None
    assert not r.exists(models[2].inflight)
    r.script_flush()  # as after a restart of Redis: announced in a round trip of its own
    r.xadd(models[2].input, {"data": b"y"})
    ((_, board),), ((_, batch),) = _read_announced(r, "a", models[2:])
    assert r.hexists(models[2].inflight, batch.announced) and batch.announced in board.fields
    assert r.script_exists(intake.READ_SCRIPT.sha) == [True]
    r.delete(*(k for m in models for k in (m.input, m.inflight)))


def test_a_worker_of_many_models_announces_each_batch_right_after_its_read(redis_server):
    """More models than intake.ANNOUNCED_AT_ONCE: one plain read of every stream, each
    batch announced right after it (the script a model would cost too much)."""
    from streamnb_workers.worker import intake

    r = redis_server.client()
    models = [ModelKeys(f"many{i}") for i in range(intake.ANNOUNCED_AT_ONCE + 4)]
    for keys in models:
        r.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
    for i in (2, 9):
        r.xadd(models[i].input, {"data": b"x"})
    boards, got = _read_announced(r, "a", models)
    assert [i for i, _ in got] == [2, 9]
    for i, batch in got:
        assert r.hget(models[i].inflight, batch.announced) is not None
        assert batch.announced in boards[i][1].fields
    assert sum(r.exists(m.inflight) for m in models) == 2
    # the group moved back (XGROUP SETID): read again, as any undelivered entry
    r.xgroup_setid(models[2].input, GROUP, "0")
    _, again = _read_announced(r, "b", models, block_ms=50)
    assert [i for i, _ in again] == [2]
    r.delete(*(k for m in models for k in (m.input, m.inflight)))


def test_a_worker_announces_its_batches_at_the_read_whenever_ordered(redis_server):
    one = url_worker(redis_server.url, [count_spec("one")], fast_options("a"))
    unordered = url_worker(redis_server.url, [count_spec("one")],
                           fast_options("b", order_wait_ms=0))
    assert one._announce_reads and not unordered._announce_reads
