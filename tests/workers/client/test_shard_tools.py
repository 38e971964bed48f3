"""The ``streamnb`` commands on a model stored with 3 statistics shards, against a real
redis-server and a real worker: produce (each record in its shard's ``:in``, learnt keys
per shard, a delayed label in its message's shard), forget, the verdict client, predict
(one and many), tail (merged, --follow), status, export and import, explain."""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import pytest

from streamnb_workers.cli.launch import blas_env
from streamnb_workers.cli.main import main
from streamnb_workers.cli.predict_many import judge_many
from streamnb_workers.client import model_files, status
from streamnb_workers.client.forget import forget
from streamnb_workers.client.produce import produce, send_and_wait
from streamnb_workers.client.verdicts import VerdictClient
from streamnb_workers.replication.shards import (
    Router,
    keys_of,
    load_model,
    route_id,
    shard_names,
    shard_of,
)
from streamnb_workers.store.connection import RedisSettings
from streamnb_workers.wire.codec import DATA_FIELD, decode_input
from streamnb_workers.wire.outputs import decode_output, encode_output
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import parse_id
from tests.helpers.milter import mail, wait_for
from tests.helpers.redis_server import REDIS_SERVER, RedisServer
from tests.helpers.workers import (
    FCFG,
    PARAMS,
    PYTHON,
    ROOT,
    all_done,
    assert_same_stats,
    count_spec,
    fast_options,
    offline_model,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis

K = 3
SHARDS = keys_of("mail", K)


def sharded_worker(url: str, consumer: str = "w1"):
    return url_worker(url, [count_spec("mail", shards=K)], fast_options(consumer))


def shard_entries(client, keys_key: str) -> list[dict]:
    return [msgpack.unpackb(fields[b"data"], raw=False) for _, fields in client.xrange(keys_key)]


def outputs_of(client, j: int) -> dict[str, dict]:
    """The predictions in shard ``j``'s ``:out`` by message id."""
    return {out["id"]: out for out in (decode_output(f[b"data"])
                                       for _, f in client.xrange(SHARDS[j].out))}


def write_jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(rec) + "\n" for rec in records))
    return str(path)


# ----------------------------------------------------------------------- produce, forget
def test_produce_routes_each_record_to_its_shard_and_learns_it_once(redis_server, tmp_path):
    r = redis_server.client()
    w = sharded_worker(redis_server.url)
    w.start()  # the model's config and its shards'
    msgs = token_messages(60, classes=("spam", "ham"), seed=3, labelled_share=0.8)
    late = next(m for m in msgs if "label" not in m)
    records = msgs + [{"ref": late["id"], "label": "spam"}]
    path = write_jsonl(tmp_path / "m.jsonl", records)

    report = produce(r, "mail", [path])
    assert (report.sent, report.total, report.shards) == (61, 61, K)
    for j, keys in enumerate(SHARDS):
        got = [route_id(rec) for rec in shard_entries(r, keys.input)]
        assert got == [route_id(rec) for rec in records if shard_of(route_id(rec), K) == j]
        assert got, f"shard {j} got nothing"
    assert shard_of(route_id(records[-1]), K) == shard_of(late["id"], K)  # the label follows
    w.run_until_idle()

    # the delayed label was learnt: the sum is every labelled message's, the late one's too
    taught = [dict(m, label="spam") if m is late else m for m in msgs]
    assert_same_stats(load_model(r, "mail")[0], offline_model("multinomial", PARAMS, FCFG, taught))
    late_shard = shard_of(late["id"], K)
    assert int(r.get(SHARDS[late_shard].learnt)) == sum(
        1 for m in taught if "label" in m and shard_of(m["id"], K) == late_shard)

    # again: each labelled message is found learnt in its own shard and is not sent
    n_labelled = sum(1 for m in msgs if "label" in m)
    lengths = [r.xinfo_stream(keys.input)["entries-added"] for keys in SHARDS]
    again = produce(r, "mail", [path])
    assert (again.already_learnt, again.sent) == (n_labelled, 61 - n_labelled)
    added = [r.xinfo_stream(keys.input)["entries-added"] - n
             for keys, n in zip(SHARDS, lengths, strict=True)]
    assert added == [sum(1 for rec in records if "label" not in rec or "ref" in rec
                         if shard_of(route_id(rec), K) == j) for j in range(K)]
    w.shutdown()


def test_forget_goes_to_the_shard_that_learnt_the_message(redis_server, tmp_path):
    r = redis_server.client()
    w = sharded_worker(redis_server.url)
    w.start()
    msgs = token_messages(40, classes=("spam", "ham"), seed=5)
    produce(r, "mail", [write_jsonl(tmp_path / "all.jsonl", msgs)])
    w.run_until_idle()
    gone = msgs[:9]
    before = [r.xinfo_stream(keys.input)["entries-added"] for keys in SHARDS]

    report = forget(r, "mail", [write_jsonl(tmp_path / "gone.jsonl", gone)], stderr=io.StringIO())
    assert (report.sent, report.not_learnt, report.shards) == (9, [], K)
    added = [r.xinfo_stream(keys.input)["entries-added"] - n
             for keys, n in zip(SHARDS, before, strict=True)]
    assert added == [sum(1 for m in gone if shard_of(m["id"], K) == j) for j in range(K)]
    w.run_until_idle()
    assert_same_stats(load_model(r, "mail")[0],
                      offline_model("multinomial", PARAMS, FCFG, msgs[9:]))
    w.shutdown()


def test_produce_and_forget_through_the_cli_name_the_shards(redis_server, tmp_path, capsys):
    w = sharded_worker(redis_server.url)
    w.start()
    path = write_jsonl(tmp_path / "m.jsonl", token_messages(5, seed=8))
    assert main(["produce", "--redis", redis_server.url, "--model", "mail", path], env={}) == 0
    out = capsys.readouterr().out
    assert out.startswith("sent 5 of 5 messages (5 labelled) to the :in of the 3 shards of "
                          "model 'mail'")
    w.run_until_idle()
    assert main(["forget", "--redis", redis_server.url, "--model", "mail", path], env={}) == 0
    assert "forgetting 5 of 5 messages (sent to the :in of the 3 shards of model 'mail')" in \
        capsys.readouterr().out
    w.shutdown()


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 11, 29, 30, 31, 100])
def test_the_last_n_of_several_streams_are_read_in_pages(monkeypatch, n):
    import fakeredis

    from streamnb_workers.cli.commands import tail

    monkeypatch.setattr(tail, "PAGE", 4)
    r = fakeredis.FakeRedis()
    keys = [keys.out for keys in SHARDS]
    for i in range(30):  # stream j gets the entries i with i % 7 in its share
        r.xadd(keys[min(i % 7, K - 1)], {"n": i}, id=f"{100 + i}-0")
    got = [(key, as_str(entry_id), int(fields[b"n"]))
           for key, entry_id, fields in tail.last_of_streams(r, keys, n)]
    want = [(keys[min(i % 7, K - 1)], f"{100 + i}-0", i) for i in range(30)][max(0, 30 - n):]
    assert got == (want if n else [])


# ----------------------------------------------------------------- a served sharded model
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A 3-shard model of mail learnt by a worker that keeps running, and its server."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        r = server.client()
        w = sharded_worker(server.url)
        w.start()
        router = Router("mail", K)
        pipe = r.pipeline(transaction=False)
        for i in range(60):
            label = ("spam", "ham")[i % 2]
            rec = {"id": f"train-{i}", "raw": mail(label, 100 + i), "label": label}
            pipe.xadd(router.keys_for(rec["id"]).input, {DATA_FIELD: msgpack.packb(rec)})
        pipe.execute()
        thread = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
        thread.start()
        try:
            wait_for(lambda: all(all_done(r, 1, keys) for keys in SHARDS), 60, "the training")
            yield server, r
        finally:
            w.request_stop()
            thread.join(20)


def test_the_verdict_client_gets_every_verdict_from_every_shard(served):
    server, r = served
    with VerdictClient(RedisSettings(server.url), "mail", block_ms=100) as client:
        def judge(i: int) -> tuple[str, str, str]:
            label = ("spam", "ham")[i % 2]
            msg_id, out = client.predict(mail(label, 500 + i), timeout=30.0, hint=str(i))
            return label, msg_id, out["label"]

        with ThreadPoolExecutor(12) as pool:
            results = list(pool.map(judge, range(36)))
        assert client.shards == K
    assert all(want == got for want, _, got in results)
    shards = [shard_of(msg_id, K) for _, msg_id, _ in results]
    assert set(shards) == set(range(K))
    for (_, msg_id, _), j in zip(results, shards, strict=True):
        assert msg_id in outputs_of(r, j)  # sent to its shard, answered there


def test_predict_one_and_many_on_a_sharded_model(served, tmp_path):
    _, r = served
    box = tmp_path / "box"
    box.mkdir()
    for i in range(12):
        label = ("spam", "ham")[i % 2]
        (box / f"{i:02d}-{label}.eml").write_bytes(mail(label, 700 + i))
    one = send_and_wait(r, "mail", str(box / "00-spam.eml"), timeout=30)
    assert one is not None and one["label"] == "spam"
    assert one["id"] in outputs_of(r, shard_of(one["id"], K))

    out = io.StringIO()
    assert judge_many(r, "mail", str(box), out, timeout=30) == (12, 0)
    lines = [line.split("\t") for line in out.getvalue().splitlines()]
    names = [Path(name).name for name, _, _ in lines]
    assert names == sorted(p.name for p in box.iterdir())
    assert all(name.split("-")[1] == f"{verdict}.eml" for name, (_, verdict, _) in zip(
        names, lines, strict=True))
    assert len({shard_of(out["id"], K) for j in range(K) for out in outputs_of(r, j).values()
                if out["id"].startswith("predict-")}) == K


def test_predict_stdin_filters_a_mail_through_its_shard(served):
    server, r = served
    env = blas_env({k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")})
    for i, label in enumerate(("spam", "ham", "spam", "ham")):
        proc = subprocess.run([PYTHON, "-m", "streamnb_workers", "predict", "--redis", server.url,
                               "--model", "mail", "--json", "-"], input=mail(label, 800 + i),
                              cwd=ROOT, env=env, capture_output=True, timeout=60)
        out = json.loads(proc.stdout)
        assert (proc.returncode, out["label"]) == ({"spam": 0, "ham": 1}[label], label), proc.stderr
        assert out["id"] in outputs_of(r, shard_of(out["id"], K))


def test_tail_merges_the_shards_outputs_in_entry_order(served, capsys):
    server, r = served
    every = sorted(((parse_id(i), as_str(i)) for keys in SHARDS for i, _ in r.xrange(keys.out)))
    assert main(["tail", "--redis", server.url, "--model", "mail", "-n", "25"], env={}) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == [sid for _, sid in every[-25:]]
    assert main(["tail", "--redis", server.url, "--model", "mail", "-n", "5000", "--json"],
                env={}) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(every)


def test_tail_follow_prints_new_outputs_of_every_shard(served):
    from tests.helpers.tail import follow_tail

    server, r = served
    with follow_tail(server.url, "mail", 0) as lines:
        # tail has taken each stream's newest entry once it blocks in XREAD
        wait_for(lambda: any(c.get("cmd") == "xread" and c.get("name", "").startswith(
            "streamnb-tail-") for c in r.client_list()), 30, "tail to follow")
        for i in range(6):  # in different milliseconds: ids of different streams order them
            r.xadd(SHARDS[i % K].out, {"data": encode_output(
                f"new{i}", "1-0", "ham", {"ham": -0.1, "spam": -2.4}, "9-0", "host-2")})
            time.sleep(0.003)
        wait_for(lambda: len(lines) >= 6, 30, "the new outputs")
        assert [line.split()[2] for line in lines] == [f"id=new{i}" for i in range(6)]


def test_status_sums_the_shards_and_lists_each(served, capsys):
    server, r = served
    info = status.collect(r, "mail")
    shards = info["shards"]
    assert [sh["name"] for sh in shards] == shard_names("mail", K)
    for key in ("learnt", "received", "predicted", "pending", "lag"):
        assert info[key] == sum(sh[key] for sh in shards), key
    assert info["streams"]["out"] == sum(sh["streams"]["out"] for sh in shards)
    assert info["learnt"] >= 60 and all(sh["learnt"] > 0 for sh in shards)
    assert info["version"] == ",".join(sh["version"] for sh in shards)
    model, version = load_model(r, "mail")
    assert version == info["version"] and info["learnt_total"] == model.stats["classes"].total
    assert [w["name"] for w in info["workers"]] == ["w1"]
    assert info["recent"]["outputs"] == min(info["predicted"], status.DEFAULT_LAST)

    assert main(["status", "--redis", server.url, "--model", "mail", "--json"], env={}) == 0
    assert len(json.loads(capsys.readouterr().out)["shards"]) == K
    assert main(["status", "--redis", server.url, "--model", "mail"], env={}) == 0
    text = capsys.readouterr().out
    assert "shards     3 (figures above: their sums)" in text
    assert all(f"  {name} " in text for name in shard_names("mail", K))


def test_export_is_the_sum_and_import_goes_to_the_first_shard(served, tmp_path, capsys):
    server, r = served
    path = tmp_path / "mail.snb"
    assert main(["export", "--redis", server.url, "--model", "mail", "--output", str(path)],
                env={}) == 0
    exported, env = model_files.read_envelope(path)
    summed, version = load_model(r, "mail")
    if env["log_id"] == version:  # else the worker learnt meanwhile (it learns nothing here)
        assert_same_stats(exported, summed)
    assert env["log_id"].count(",") == K - 1

    copy = url_worker(server.url, [count_spec("copy", shards=K)], fast_options("w2"))
    copy.start()
    copy.shutdown()
    assert main(["import", "--redis", server.url, "--model", "copy", str(path)], env={}) == 0
    assert "imported as log entry" in capsys.readouterr().out
    assert [r.xlen(keys.log) for keys in keys_of("copy", K)] == [1, 0, 0]
    assert_same_stats(load_model(r, "copy")[0], exported)

    assert main(["import", "--redis", server.url, "--model", "copy", "--replace", str(path)],
                env={}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has 3 shards: --replace cannot swap" in err
    assert main(["import", "--redis", server.url, "--model", "copy", str(path)], env={}) == 2
    assert "holds statistics already" in capsys.readouterr().err


def test_explain_uses_the_sum_of_the_shards(served, tmp_path, capsys):
    server, r = served
    path = tmp_path / "m.eml"
    path.write_bytes(mail("spam", 900))
    assert main(["explain", "--redis", server.url, "--model", "mail", "--json", str(path)],
                env={}) == 0
    res = json.loads(capsys.readouterr().out)
    model, version = load_model(r, "mail")
    assert res["model_version"] == version
    e = res["explain"]
    featurizer = count_spec("mail").featurizer_config
    from streamnb.features import Featurizer

    f = Featurizer.from_config(featurizer)
    msg = decode_input(msgpack.packb({"raw": path.read_bytes()}), "0-0")
    X = f.stack([f.featurize(msg.as_payload())])
    total = e["bias"] + sum(w for _, w in e["tokens"]) + e["other"]
    assert total == pytest.approx(float(model.decision_function(X)[0]), abs=1e-9)


# ------------------------------------------------------------------------------ a cluster


def test_on_a_cluster_each_shard_is_read_by_itself(cluster, tmp_path, capsys):  # noqa: F811
    """The shards are on three masters: the verdict client (as the producer ACL user), tail
    and predict many read each shard's streams with commands of their own."""
    from streamnb_workers.store.connection import UrlConnector
    from streamnb_workers.worker import Worker
    from tests.helpers.acl import PRODUCER_PASSWORD, PRODUCER_USER
    from tests.helpers.cluster import slot_of

    assert len({cluster.owner(slot_of(keys.input)) for keys in SHARDS}) == K
    admin = cluster.admin()
    w = Worker(UrlConnector(RedisSettings(cluster.url(), cluster=True)),
               [count_spec("mail", shards=K)], fast_options("c1"))
    w.start()
    for label in ("spam", "ham"):  # produce on a cluster: a pipeline over three slots
        (tmp_path / label).mkdir()
        for i in range(20):
            (tmp_path / label / f"{i}.eml").write_bytes(mail(label, 100 + i))
        report = produce(admin, "mail", [str(tmp_path / label)], label=label)
        assert (report.sent, report.labelled) == (20, 20)
    thread = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: sum(int(admin.get(keys.learnt) or 0) for keys in SHARDS) == 40, 60,
                 "the training")
        producer = RedisSettings(cluster.url(PRODUCER_USER, PRODUCER_PASSWORD), cluster=True)
        with VerdictClient(producer, "mail", block_ms=100) as client:
            with ThreadPoolExecutor(8) as pool:
                results = list(pool.map(lambda i: (("spam", "ham")[i % 2], client.predict(
                    mail(("spam", "ham")[i % 2], 500 + i), timeout=30.0)), range(24)))
        assert all(want == out["label"] for want, (_, out) in results)
        assert {shard_of(msg_id, K) for _, (msg_id, _) in results} == set(range(K))

        box = tmp_path / "box"
        box.mkdir()
        for i in range(9):
            (box / f"{i}.eml").write_bytes(mail(("spam", "ham")[i % 2], 700 + i))
        out = io.StringIO()
        assert judge_many(admin, "mail", str(box), out, timeout=30) == (9, 0)

        assert main(["tail", "--redis", cluster.url(), "--cluster", "--model", "mail", "-n", "200"],
                    env={}) == 0
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 40 + 24 + 9
        ids = [line.split()[1] for line in lines]
        assert ids == sorted(ids, key=parse_id)
        info = status.collect(admin, "mail")
        assert (info["learnt"], len(info["shards"])) == (40, K)

        gone = forget(admin, "mail", [str(tmp_path / "spam" / "0.eml")], stderr=io.StringIO())
        assert (gone.sent, gone.not_learnt) == (1, [])
        wait_for(lambda: load_model(admin, "mail")[0].stats["classes"].as_dict()["spam"] == 19,
                 30, "the forget")
    finally:
        w.request_stop()
        thread.join(20)
