"""``streamnb tail`` against a real redis-server: the last N predictions or dead letters as
lines or JSON, paging, an undecodable entry, and --follow until Ctrl-C (exit 0)."""

from __future__ import annotations

import base64
import json
import time

import msgpack
import pytest

from streamnb_workers.cli.commands import tail
from streamnb_workers.cli.main import main
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec, ensure_config
from streamnb_workers.wire.outputs import encode_dead, encode_output
from tests.helpers.tail import follow_tail

pytestmark = pytest.mark.redis

K = ModelKeys("mail")


def fill(client, n_out: int = 15, n_dead: int = 4) -> None:
    ensure_config(client, ModelSpec("mail", kind="multinomial"))
    pipe = client.pipeline(transaction=False)
    for i in range(n_out):
        spam = i % 3 == 0
        lp = {"ham": -5.0 if spam else -0.01, "spam": -0.01 if spam else -5.0}
        pipe.xadd(K.out, {"data": encode_output(f"m{i}", f"{i + 1}-0", "spam" if spam else "ham", lp,
                                                "9-0", "host-1", true_label="ham" if i == 4 else None,
                                                learned=True if i == 4 else None)})
    for i in range(n_dead):
        payload = msgpack.packb({"id": f"d{i}", "x": [1.0]}) if i % 2 == 0 else b"\xc1junk"
        pipe.xadd(K.dead, {"data": encode_dead(f"{100 + i}-0", "incompatible_payload" if i % 2 == 0
                                               else "not_msgpack", "an x vector sent to a count model",
                                               payload)})
    pipe.execute()


def run(capsys, *args: str) -> tuple[int, list[str]]:
    code = main(["tail", *args], env={})
    return code, capsys.readouterr().out.splitlines()


def test_the_last_n_predictions_oldest_first(redis_server, capsys):
    fill(redis_server.client())
    code, lines = run(capsys, "--redis", redis_server.url, "--model", "mail", "--count", "5")
    assert code == 0
    assert [ln.split()[2] for ln in lines] == [f"id=m{i}" for i in range(10, 15)]
    fields = dict(kv.split("=", 1) for kv in lines[2].split()[2:])  # m12: spam
    assert fields == {"id": "m12", "label": "spam", "score": "4.99", "version": "9-0",
                      "worker": "host-1"}
    assert lines[0].split()[0].endswith("Z")  # the entry's time, UTC
    code, lines = run(capsys, "--redis", redis_server.url, "--model", "mail", "-n", "11")
    assert "true=ham learnt=yes" in lines[0] and "score=-4.99" in lines[0]  # m4
    code, lines = run(capsys, "--redis", redis_server.url, "--model", "mail", "-n", "0")
    assert code == 0 and lines == []


def test_a_prediction_with_an_explanation_shows_its_tokens():
    obj = {"id": "m1", "label": "spam", "log_proba": {"ham": -3.0, "spam": -0.05},
           "model_version": "4-0", "worker": "w1",
           "explain": {"classes": ["ham", "spam"], "bias": -0.5, "other": 0.1,
                       "tokens": [["viagra", 2.25], ["meeting", -1.0]]}}
    line = tail.format_entry("1700000000000-0", obj, dead=False)
    assert line.endswith('worker=w1 tokens="viagra=+2.25 meeting=-1.00"')


def test_a_prediction_with_an_operating_point_shows_threshold_and_proba():
    obj = {"id": "m1", "label": "ham", "log_proba": {"ham": -0.2, "spam": -1.7}, "score": -0.05,
           "threshold": -0.035, "proba": 0.18253, "model_version": "4-0", "worker": "w1"}
    line = tail.format_entry("1700000000000-0", obj, dead=False)
    assert "label=ham score=-0.05 threshold=-0.035 proba=0.1825 version=4-0" in line
    obj.update(prior=0.37512)  # with --prior-half-life
    line = tail.format_entry("1700000000000-0", obj, dead=False)
    assert "threshold=-0.035 proba=0.1825 prior=0.3751 version=4-0" in line


def test_dead_letters_readable_and_as_json(redis_server, capsys):
    fill(redis_server.client())
    code, lines = run(capsys, "--redis", redis_server.url, "--model", "mail", "--dead")
    assert code == 0 and len(lines) == 4
    assert lines[0].split()[2:6] == ["reason=incompatible_payload", "entry=100-0", "id=d0", "bytes=19"]
    assert lines[0].endswith('detail="an x vector sent to a count model"')
    assert "reason=not_msgpack" in lines[1] and " id=" not in lines[1]
    code, lines = run(capsys, "--redis", redis_server.url, "--model", "mail", "--dead", "--json")
    objs = [json.loads(ln) for ln in lines]
    assert base64.b64decode(objs[1]["payload_b64"]) == b"\xc1junk"
    assert objs[0]["reason"] == "incompatible_payload" and objs[0]["entry"] == "100-0"
    code, lines = run(capsys, "--redis", redis_server.url, "--model", "mail", "--json", "-n", "1")
    obj = json.loads(lines[0])
    assert obj["id"] == "m14" and obj["log_proba"] == {"ham": -0.01, "spam": -5.0}
    assert obj["score"] == pytest.approx(-4.99, abs=1e-12)
    assert obj["stream_id"] == redis_server.client().xrevrange(K.out, count=1)[0][0].decode()


def test_any_count_is_read_in_pages(redis_server, capsys, monkeypatch):
    fill(redis_server.client(), n_out=25, n_dead=0)
    monkeypatch.setattr(tail, "PAGE", 3)
    for n, want in ((10, range(15, 25)), (100, range(25)), (3, range(22, 25))):
        code, lines = run(capsys, "--redis", redis_server.url, "--model", "mail", "-n", str(n))
        assert [ln.split()[2] for ln in lines] == [f"id=m{i}" for i in want], n


def test_an_undecodable_entry_is_a_line_not_a_crash(redis_server, capsys):
    r = redis_server.client()
    ensure_config(r, ModelSpec("mail", kind="multinomial"))
    r.xadd(K.out, {"data": b"\xc1"})
    fill(r, n_out=1, n_dead=0)
    code, lines = run(capsys, "--redis", redis_server.url, "--model", "mail")
    assert code == 0 and len(lines) == 2
    assert "undecodable=not_msgpack" in lines[0] and "id=m0" in lines[1]
    code, lines = run(capsys, "--redis", redis_server.url, "--model", "mail", "--json")
    assert json.loads(lines[0])["error"].startswith("not_msgpack")


def test_bad_arguments_are_one_line_exit_2(redis_server, capsys):
    with pytest.raises(SystemExit) as info:
        main(["tail", "--redis", redis_server.url, "--model", "mail", "--count", "-1"], env={})
    assert info.value.code == 2
    assert main(["tail", "--redis", redis_server.url], env={}) == 2
    assert main(["tail", "--redis", redis_server.url, "--model", "mial"], env={}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and "'mial' does not exist" in err


def test_follow_prints_new_entries_and_ctrl_c_exits_0(redis_server):
    r = redis_server.client()
    fill(r, n_out=5, n_dead=0)
    with follow_tail(redis_server.url, "mail", 2) as lines:
        deadline = time.monotonic() + 30
        while len(lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [ln.split()[2] for ln in lines] == ["id=m3", "id=m4"]
        for i in range(3):
            r.xadd(K.out, {"data": encode_output(f"new{i}", "1-0", "ham", {"ham": -0.1, "spam": -2.4},
                                                 "9-0", "host-2")})
        while len(lines) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [ln.split()[2] for ln in lines[2:]] == ["id=new0", "id=new1", "id=new2"]
