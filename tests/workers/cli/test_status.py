"""``streamnb status`` against a real redis-server and a real worker process: counts,
recent accuracy and throughput, the model version as learnt count and time, per-class
counts and the live workers from their heartbeats."""

from __future__ import annotations

import json
import time

import msgpack
import pytest

from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.wire.stream_ids import entry_time
from tests.helpers.acl import cli, cli_env, drained, start_worker_cli, stop, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]

K = ModelKeys("st")
SPAM = ["cheap", "meds", "winner", "prize", "offer"]
HAM = ["meeting", "notes", "agenda", "lunch", "report"]


def messages(n: int) -> list[dict]:
    """Alternating spam and ham; every third one unlabelled. Texts repeat, so each
    message carries its own learn-once key."""
    out = []
    for i in range(n):
        words, label = (SPAM, "spam") if i % 2 else (HAM, "ham")
        m = {"id": f"m{i}", "key": f"k{i}",
             "text": " ".join(words[j % 5] for j in range(i % 4 + 2))}
        if i % 3:
            m["label"] = label
        out.append(m)
    return out


def status(url: str, *extra: str) -> dict:
    p = cli("status", "--redis", url, "--model", "st", "--json", *extra)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_status_reports_counts_accuracy_version_classes_and_workers(redis_server, tmp_path):
    r = redis_server.client()
    msgs = messages(30)
    log = tmp_path / "w.log"
    proc = start_worker_cli(redis_server.url, "st", "st-1", log, env=cli_env())
    try:
        wait_until(lambda: r.exists(K.config), 30, "the model created", [proc], [log])
        t0 = time.time()
        for m in msgs:
            r.xadd(K.input, {"data": msgpack.packb(m)})
        wait_until(lambda: drained(r, "st"), 60, "every message handled", [proc], [log])
        wait_until(lambda: r.hexists(K.workers, "st-1"), 10, "a heartbeat", [proc], [log])
        info = status(redis_server.url, "--last", "20")
        text = cli("status", "--redis", redis_server.url, "--model", "st").stdout
    finally:
        assert stop([proc]) == [0]

    labelled = [m for m in msgs if "label" in m]
    assert info["learnt"] == len(labelled) == 20
    assert info["received"] == info["predicted"] == 30
    # class weights: 10 messages each, a message learnt after a wrong verdict counting twice
    assert set(info["classes"]) == {"spam", "ham"}
    assert all(10.0 <= w <= 20.0 for w in info["classes"].values())
    last_log = r.xrevrange(K.log, count=1)[0][0].decode()
    assert info["model_version"] == {"learnt": 20, "log_id": last_log, "time": entry_time(last_log)}
    # recent accuracy, counted here from the last 20 outputs
    outs = [decode_output(f[b"data"]) for _, f in r.xrevrange(K.out, count=20)]
    judged = [o for o in outs if o.get("true_label") is not None]
    right = sum(o["label"] == o["true_label"] for o in judged)
    rec = info["recent"]
    assert rec["outputs"] == 20 and rec["labelled"] == len(judged) > 0
    assert rec["accuracy"] == round(right / len(judged), 4)
    assert rec["per_second"] > 0 and 0 <= rec["last_age_s"] < time.time() - t0 + 1
    assert [w["name"] for w in info["workers"]] == ["st-1"]
    assert "20 learnt, last at" in text and "accuracy" in text and "1 live" in text

    after = status(redis_server.url)  # the worker left: its heartbeat went with it
    assert after["workers"] == [] and after["learnt"] == 20
    assert after["recent"]["outputs"] == 30
