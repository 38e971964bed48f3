"""Separate rights to score and to train, under the shipped deploy/redis/users.acl on a
real ``redis-server``.

A model stored with ``training: train`` learns labels, delayed labels and forgets only
from its training stream ``:train`` (workers/store/training.py). The scorer user
(``streamnb-scorer``: milter, ``predict``, ``predict -p``) may write ``:in`` and nothing
else: every entry it can write leaves the statistics unchanged. The trainer user
(``streamnb-trainer``: ``produce``, ``forget``, Dovecot) may write ``:train`` and read no
model's ``:out``. Workers move ``:train`` into ``:in`` exactly once, so two workers and a
sharded model learn what one offline fit does.
"""

from __future__ import annotations

import json
import random
import secrets
import subprocess
import sys
import threading

import msgpack
import pytest
import redis

from streamnb.models.io import dumps
from streamnb_workers.client.status import collect, format_text
from streamnb_workers.replication.shards import shard_names
from streamnb_workers.store.keys import ModelKeys, source_epochs_key
from streamnb_workers.store.training import forward, token_key, train_stream
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.acl import (
    SCORER_PASSWORD,
    SCORER_USER,
    TRAINER_PASSWORD,
    TRAINER_USER,
    WORKER_PASSWORD,
    WORKER_USER,
    AclRedis,
    acl_refusals,
    cli,
    cli_env,
    write_acl,
)
from tests.helpers.redis_server import REDIS_SERVER
from tests.helpers.workers import (
    ROOT,
    assert_same_stats,
    count_spec,
    fast_options,
    learnt_model,
    offline_model,
    run_in_threads,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis

FCFG = {"bits": 10, "counts": "raw"}


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory):
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with AclRedis(write_acl(tmp_path_factory.mktemp("acl"))) as server:
        yield server


def _as(server, user, password):
    return server.client(username=user, password=password)


def _worker(server, name, consumer="w1", **spec_kw):
    spec = count_spec(name, training="train", classes="any", **spec_kw)
    return url_worker(server.url_for(WORKER_USER, WORKER_PASSWORD), [spec],
                      fast_options(consumer, batch=20))


def _jsonl(path, messages):
    path.write_text("".join(json.dumps(m) + "\n" for m in messages))
    return str(path)


def _taught_by_the_trainer(server, tmp_path, name, n, seed):
    """A started worker of model ``name`` that learnt ``n`` token messages sent by the
    trainer user through ``streamnb produce``: (the worker, the trainer's URL, the messages)."""
    w = _worker(server, name)
    w.start()
    url = server.url_for(TRAINER_USER, TRAINER_PASSWORD)
    msgs = token_messages(n, seed=seed)
    assert cli("produce", "--redis", url, "--model", name,
               _jsonl(tmp_path / "t.jsonl", msgs)).returncode == 0
    w.run_until_idle(timeout=60)
    return w, url, msgs


def _random_entries(learnt, n, seed=7):
    """``n`` entries of every shape a writer of ``:in`` may send: labels, delayed labels
    (to learnt ids too), forgets of learnt keys, corrections, extreme weights, guessed
    tokens, extra fields, entries that are no msgpack or have no data."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        m = rng.choice(learnt)
        obj = rng.choice([
            {"tokens": m["tokens"]}, {"tokens": [f"w{rng.randrange(50)}"]},
            {"text": "cheap meds"}, {"features": {"cheap": 3.0}}, {"ref": m["id"]},
            {"hashes": b"\x01" * 8}])
        for key, values in (("label", ["spam", "ham", "news", 1, "", None]),
                            ("forget", [True, False, None]), ("key", [m["key"], None]),
                            ("weight", [1.0, 1e6, 1e-300, None]), ("id", [m["id"], None])):
            value = rng.choice(values)
            if value is not None:
                obj[key] = value
        fields = {"data": msgpack.packb(obj, use_bin_type=True)}
        if rng.random() < 0.5:
            fields["auth"] = rng.choice(["", "0" * 32, "auth", secrets.token_hex(16)])
        if rng.random() < 0.05:
            fields = rng.choice([{"data": b"\xc1"}, {"other": b"x"}, {"data": b"", "x": b"y"}])
        out.append(fields)
    return out


def _stats(server, name):
    admin = server.client()
    model, _version = learnt_model(admin, name)
    return dumps(model), int(admin.get(ModelKeys(name).learnt) or 0)


def test_every_entry_the_scorer_can_write_leaves_the_statistics_unchanged(acl_server, tmp_path):
    name = "rights-scorer"
    k = ModelKeys(name)
    w = _worker(acl_server, name)
    w.start()
    msgs = token_messages(40, seed=3)
    trained = cli("produce", "--redis", acl_server.url_for(TRAINER_USER, TRAINER_PASSWORD),
                  "--model", name, _jsonl(tmp_path / "train.jsonl", msgs))
    assert trained.returncode == 0, trained.stderr
    w.run_until_idle(timeout=60)
    before = _stats(acl_server, name)
    assert before[1] == 40

    scorer = _as(acl_server, SCORER_USER, SCORER_PASSWORD)
    learnt = msgs[0]
    hostile = [  # by hand, then drawn: every entry a writer of :in may send
        {"tokens": ["cheap", "pills"], "label": "spam"},                   # a label
        {"tokens": ["cheap", "pills"], "label": "ham", "weight": 1e6},
        {**learnt, "label": "ham" if learnt["label"] != "ham" else "spam"},  # a correction
        {"ref": msgs[1]["id"], "label": "spam"},                            # a delayed label
        {"tokens": learnt["tokens"], "key": learnt["key"], "forget": True},  # a forget
        {"tokens": ["x"], "label": "news", "forget": False},
        {"forget_source": "default"},                                      # a source's forget
        {"forget_class": "spam"},                                          # a class removal
    ]
    for m in hostile:
        data = msgpack.packb(m, use_bin_type=True)
        scorer.xadd(k.input, {"data": data})
        scorer.xadd(k.input, {"data": data, "auth": "0" * 32})  # a guessed token
        scorer.xadd(k.input, {"data": data, "auth": ""})
    drawn = _random_entries(msgs, 300)
    for fields in drawn:
        scorer.xadd(k.input, fields)
    scorer.xadd(k.input, {"data": msgpack.packb({"id": "plain", "tokens": ["cheap"]})})
    # ... and nowhere else: not :train, the log, the snapshot, the keys, the config, the token
    for key in [train_stream(k), k.log, k.out, k.dead, k.events]:
        with pytest.raises(redis.exceptions.NoPermissionError):
            scorer.xadd(key, {"data": msgpack.packb({"tokens": ["a"], "label": "spam"})})
    for key in [k.snapshot, k.learnt_keys, k.config, k.inflight, k.workers]:
        with pytest.raises(redis.exceptions.NoPermissionError):
            scorer.hset(key, "f", "v")
    for call in (lambda: scorer.get(token_key(k)), lambda: scorer.set(k.learnt, "0"),
                 lambda: scorer.xrange(k.input), lambda: scorer.xrange(train_stream(k)),
                 lambda: scorer.eval("return 1", 1, k.input)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            call()
    w.run_until_idle(timeout=60)

    assert _stats(acl_server, name) == before
    admin = acl_server.client()
    reasons = [decode_output(f[b"data"])["reason"] for _, f in admin.xrange(k.dead)]
    assert reasons[:3 * len(hostile)] == ["label_not_allowed"] * (3 * len(hostile))
    assert reasons.count("label_not_allowed") > 3 * len(hostile) + 100  # most drawn ones
    outs = [decode_output(f[b"data"]) for _, f in admin.xrange(k.out)]
    assert outs[-1]["id"] == "plain" and "true_label" not in outs[-1]
    assert acl_refusals(admin, TRAINER_USER) == []


def test_the_trainer_trains_and_forgets_and_reads_no_outputs(acl_server, tmp_path):
    name = "rights-trainer"
    k = ModelKeys(name)
    w, url, msgs = _taught_by_the_trainer(acl_server, tmp_path, name, 30, 4)
    assert int(acl_server.client().get(k.learnt)) == 30
    gone = cli("forget", "--redis", url, "--model", name, _jsonl(tmp_path / "f.jsonl", msgs[:10]))
    assert gone.returncode == 0, gone.stderr
    w.run_until_idle(timeout=60)
    model, _ = learnt_model(acl_server.client(), name)
    assert_same_stats(model, offline_model("multinomial", w.models[name].config.model_params,
                                           FCFG, msgs[10:]))
    assert acl_refusals(acl_server.client(), TRAINER_USER) == []
    trainer = _as(acl_server, TRAINER_USER, TRAINER_PASSWORD)
    trainer.xadd(train_stream(k), {"data": msgpack.packb({"tokens": ["z"], "label": "ham"})})
    info = collect(acl_server.client(), name)
    assert info["config"]["training"] == "train" and info["training_waiting"] == 1
    assert "training   from :train, 1 waiting" in format_text(info)
    w.run_until_idle(timeout=60)
    assert collect(acl_server.client(), name)["training_waiting"] == 0

    trainer = _as(acl_server, TRAINER_USER, TRAINER_PASSWORD)
    other = ModelKeys("rights-scorer")
    for key in (k.out, other.out, k.dead, k.input, train_stream(k), k.log):
        with pytest.raises(redis.exceptions.NoPermissionError):
            trainer.xrange(key)
        with pytest.raises(redis.exceptions.NoPermissionError):
            trainer.xread({key: "0"})
    for call in (lambda: trainer.get(token_key(k)), lambda: trainer.hgetall(k.snapshot),
                 lambda: trainer.xadd(k.input, {"data": b"x"}),
                 lambda: trainer.xadd(k.out, {"data": b"x"})):
        with pytest.raises(redis.exceptions.NoPermissionError):
            call()


def test_the_scorer_predicts_and_the_pipe_filters(acl_server, tmp_path):
    name = "rights-predict"
    w = _worker(acl_server, name)
    w.start()
    assert cli("produce", "--redis", acl_server.url_for(TRAINER_USER, TRAINER_PASSWORD),
               "--model", name, _jsonl(tmp_path / "t.jsonl", token_messages(60, seed=5))
               ).returncode == 0
    w.run_until_idle(timeout=60)
    acl_server.client().execute_command("ACL", "LOG", "RESET")
    stop = threading.Event()
    serving = threading.Thread(target=lambda: [w.step(50) for _ in iter(stop.is_set, True)])
    serving.start()
    try:
        url = acl_server.url_for(SCORER_USER, SCORER_PASSWORD)
        mail = tmp_path / "m.eml"
        mail.write_bytes(b"From: a@b\r\nSubject: cheap pills\r\n\r\ncheap pills now\r\n")
        got = cli("predict", "--redis", url, "--model", name, "--json", str(mail))
        assert got.returncode == 0, got.stderr
        assert "label" in json.loads(got.stdout)
        piped = subprocess.run([sys.executable, "-m", "streamnb_workers", "predict", "--redis",
                                url, "--model", name, "-p", "-e", "-"], input=mail.read_bytes(),
                               capture_output=True, timeout=60, env=cli_env(), cwd=ROOT)
        assert piped.returncode == 0, piped.stderr
        assert b"X-Streamnb-" in piped.stdout
        assert acl_refusals(acl_server.client(), SCORER_USER) == []  # all the scorer needs
        # a scorer producing labels for a model that trains from :train is refused by Redis
        refused = cli("produce", "--redis", url, "--model", name, "--label", "spam", str(mail))
        assert refused.returncode == 1 and "no permissions" in refused.stderr
        assert "sent 0 of 1" in refused.stderr
    finally:
        stop.set()
        serving.join()


def test_two_workers_and_shards_learn_the_training_stream_once(acl_server, tmp_path):
    name = "rights-shards"
    msgs = token_messages(200, seed=6)
    workers = [_worker(acl_server, name, f"w{i}", shards=2) for i in range(2)]
    for w in workers:
        w.start()
    url = acl_server.url_for(TRAINER_USER, TRAINER_PASSWORD)
    assert cli("produce", "--redis", url, "--model", name,
               _jsonl(tmp_path / "t.jsonl", msgs)).returncode == 0
    run_in_threads(workers)
    admin = acl_server.client()
    assert sum(int(admin.get(ModelKeys(s).learnt) or 0) for s in shard_names(name, 2)) == 200
    assert all(admin.xlen(train_stream(ModelKeys(s))) == 0 for s in shard_names(name, 2))
    model, _ = learnt_model(admin, name)
    assert_same_stats(model, offline_model("multinomial", workers[0].models[
        shard_names(name, 2)[0]].config.model_params, FCFG, msgs))
    assert dumps(workers[0].models[shard_names(name, 2)[1]].replica.model) == dumps(
        workers[1].models[shard_names(name, 2)[1]].replica.model)


def test_a_model_stored_before_training_takes_labels_on_in_until_migrated(acl_server):
    """docs/operations.md, "Separate rights: migration": a config without ``training``
    reads as ``in``; a worker given ``train`` refuses it (one ConfigConflict); once the
    stored setting is ``train``, labels on ``:in`` are dead letters and ``:train`` teaches."""
    from streamnb.exceptions import ConfigConflict

    name = "rights-old"
    k = ModelKeys(name)
    admin = acl_server.client()
    url = acl_server.url_for(WORKER_USER, WORKER_PASSWORD)
    old = url_worker(url, [count_spec(name, classes="any")], fast_options("w1"))
    old.start()
    admin.hdel(k.config, "training")  # as a model stored before the setting existed
    producer = [{"tokens": ["cheap", "pills"], "label": "spam", "key": "a"}]
    for m in producer:
        admin.xadd(k.input, {"data": msgpack.packb(m)})
    old.run_until_idle(timeout=30)
    assert int(admin.get(k.learnt)) == 1
    with pytest.raises(ConfigConflict, match="training: stored 'in', given 'train'"):
        _worker(acl_server, name).start()

    admin.hset(k.config, "training", "train")  # step 4 of the migration
    new = _worker(acl_server, name, "w2")
    new.start()
    admin.xadd(k.input, {"data": msgpack.packb({"tokens": ["x"], "label": "ham", "key": "b"})})
    trainer = _as(acl_server, TRAINER_USER, TRAINER_PASSWORD)
    trainer.xadd(train_stream(k), {"data": msgpack.packb({"tokens": ["y"], "label": "ham",
                                                           "key": "c"})})
    new.run_until_idle(timeout=30)
    assert int(admin.get(k.learnt)) == 2
    assert [decode_output(f[b"data"])["reason"] for _, f in admin.xrange(k.dead)] == [
        "label_not_allowed"]


def _taught_by_ref(server, name, attack):
    """A model taught by the trainer: labelled messages, unlabelled ones (ids ``t*``) and,
    later, a delayed label for each; the scorer meanwhile scores mail of its own (ids
    ``s*``). With ``attack``, the scorer reads every id from ``:out`` and sends a payload
    of its own under it, before the delayed labels and beside one of them in its batch.
    (the model's bytes, ``:learnt``, the dead letters' reasons by entry)."""
    k = ModelKeys(name)
    w = _worker(server, name)
    w.start()
    trainer = _as(server, TRAINER_USER, TRAINER_PASSWORD)
    scorer = _as(server, SCORER_USER, SCORER_PASSWORD)

    def train(obj):
        trainer.xadd(train_stream(k), {"data": msgpack.packb(obj)})

    for m in token_messages(30, seed=8):
        train(m)
    for i in range(4):
        train({"id": f"t{i}", "tokens": ["meeting", "notes", f"w{i}"]})
        scorer.xadd(k.input, {"data": msgpack.packb({"id": f"s{i}", "tokens": ["lunch", f"v{i}"]})})
    w.run_until_idle(timeout=60)
    evil = {"tokens": ["unsubscribe", "invoice", "evil"] * 5}
    if attack:
        seen = [decode_output(f[b"data"])["id"] for _, f in scorer.xrange(k.out)]
        assert {"t0", "t3", "s0"} <= set(seen)  # the scorer reads every id it needs
        for msg_id in ("t0", "t1", "t2", "s0", "s1"):
            scorer.xadd(k.input, {"data": msgpack.packb({**evil, "id": msg_id})})
        w.run_until_idle(timeout=60)
        # ... and beside the delayed label in one batch
        scorer.xadd(k.input, {"data": msgpack.packb({**evil, "id": "t3"})})
        scorer.xadd(k.input, {"data": msgpack.packb({**evil, "id": "s2"})})
    for i in range(4):
        train({"ref": f"t{i}", "label": "spam"})
        train({"ref": f"s{i}", "label": "ham"})
    w.run_until_idle(timeout=60)
    # the trainer's message, the scorer's under its id and the trainer's label for it, in
    # that order in one batch (moved from :train by hand, as a worker does)
    admin = server.client()
    train({"id": "t9", "tokens": ["meeting", "agenda", "w9"]})
    forward(admin, k, 10)
    if attack:
        scorer.xadd(k.input, {"data": msgpack.packb({**evil, "id": "t9"})})
    train({"ref": "t9", "label": "ham"})
    forward(admin, k, 10)
    w.run_until_idle(timeout=60)
    dead = [decode_output(f[b"data"]) for _, f in admin.xrange(k.dead)]
    model, _ = learnt_model(admin, name)
    return dumps(model), int(admin.get(k.learnt)), sorted(
        (d["reason"], d.get("detail", "")[:40]) for d in dead)


def test_the_scorer_cannot_choose_what_a_delayed_label_teaches(acl_server):
    """The scorer reads the ids of ``:out`` and sends its own payload under them; the
    trainer's later delayed labels (``ref``) still teach the rows the trainer's own
    messages were cached with, and the scorer's own messages are never taught by one: the
    statistics are byte for byte those of the run without the scorer's entries."""
    honest = _taught_by_ref(acl_server, "rights-ref-honest", attack=False)
    attacked = _taught_by_ref(acl_server, "rights-ref-attacked", attack=True)
    assert honest[1] == attacked[1] == 35  # 30 labelled, 5 delayed labels of t*
    assert attacked[0] == honest[0]
    assert attacked[2] == honest[2]  # the refs to s* expire in both: never cached
    assert [r for r, _ in honest[2]] == ["ref_expired"] * 4


def test_the_trainer_forgets_a_source_through_the_workers(acl_server, tmp_path):
    """``forget --source NAME`` as the trainer: sent through ``:train`` as an entry
    ``{"forget_source": NAME}``, logged by the workers' commit with the source's next
    epoch; the statistics are those of the messages of the other sources. ``--since``
    reads the log: the admin's, refused in one line to the trainer."""
    name = "rights-source"
    w = _worker(acl_server, name)
    w.start()
    url = acl_server.url_for(TRAINER_USER, TRAINER_PASSWORD)
    msgs = token_messages(40, seed=9)
    for path, part, more in (("imap.jsonl", msgs[:20], ["--source", "imap"]),
                             ("rest.jsonl", msgs[20:], [])):
        assert cli("produce", "--redis", url, "--model", name, *more,
                   _jsonl(tmp_path / path, part)).returncode == 0
    w.run_until_idle(timeout=60)
    admin = acl_server.client()
    admin.execute_command("ACL", "LOG", "RESET")
    got = cli("forget", "--redis", url, "--model", name, "--source", "imap")
    assert got.returncode == 0, got.stderr
    assert "the workers log it" in got.stdout
    w.run_until_idle(timeout=60)
    model, _ = learnt_model(admin, name)
    assert_same_stats(model, offline_model("multinomial", w.models[name].config.model_params,
                                           FCFG, msgs[20:]))
    assert int(admin.hget(source_epochs_key(ModelKeys(name)), "imap")) == 1
    assert acl_refusals(admin, TRAINER_USER) == []
    since = cli("forget", "--redis", url, "--model", name, "--source", "imap", "--since",
                "2026-01-01")
    assert since.returncode == 2 and "streamnb-admin" in since.stderr
    assert len(since.stderr.strip().splitlines()) == 1


def test_the_trainer_removes_a_class_checked_by_the_workers(acl_server, tmp_path):
    """``forget --class LABEL`` as the trainer, which cannot read the model: sent with
    ``force`` as given; without ``--force`` the workers refuse a class that holds weight
    (a dead letter ``class_holds_weight``, the statistics unchanged), with it they remove
    the class (the statistics of the other classes' messages)."""
    name = "rights-class"
    w, url, msgs = _taught_by_the_trainer(acl_server, tmp_path, name, 45, 10)
    before = _stats(acl_server, name)
    admin = acl_server.client()
    admin.execute_command("ACL", "LOG", "RESET")
    got = cli("forget", "--redis", url, "--model", name, "--class", "news")
    assert got.returncode == 0, got.stderr
    assert "not read: the workers remove it if the model holds it, without weight" in got.stdout
    w.run_until_idle(timeout=60)
    assert _stats(acl_server, name) == before
    dead = [decode_output(f[b"data"]) for _, f in admin.xrange(ModelKeys(name).dead)]
    assert [d["reason"] for d in dead] == ["class_holds_weight"]
    # the only refusals: its read of the model (the snapshot, its trim mark and the log's
    # first read, in one round trip), which leaves the check to the workers
    refused = {e["object"] for e in acl_refusals(admin, TRAINER_USER)}
    assert refused == {"hgetall", "xrange", ModelKeys(name).snapshot}
    got = cli("forget", "--redis", url, "--model", name, "--class", "news", "--force")
    assert got.returncode == 0, got.stderr
    w.run_until_idle(timeout=60)
    model, _ = learnt_model(admin, name)
    assert_same_stats(model, offline_model("multinomial", w.models[name].config.model_params,
                                           FCFG, [m for m in msgs if m["label"] != "news"]))
