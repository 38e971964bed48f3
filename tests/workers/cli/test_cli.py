"""The streamnb command: help, one-line errors, status, export/import, predict, supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import pytest

from streamnb.models import load as load_model_file
from streamnb_workers.cli.main import build_parser, main
from streamnb_workers.replication.shards import load_model
from streamnb_workers.store.connection import RedisSettings, UrlConnector
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec, ensure_config, read_config
from streamnb_workers.wire.codec import decode_input, encode_input
from streamnb_workers.worker import Worker, WorkerOptions

COMMANDS = ["worker", "produce", "forget", "predict", "status", "export", "import", "demo"]
TRAIN = [("cheap meds online now", "spam"), ("win money cheap pills", "spam"),
         ("meeting notes for monday", "ham"), ("cheap viagra money", "spam"),
         ("lunch on monday with the team", "ham")]
STATUS_KEYS = {"model", "exists", "redis", "kind", "config", "classes", "learnt_total", "version",
               "streams", "lag", "lag_exact", "pending", "dead_letters", "snapshot", "workers",
               "learnt", "received", "predicted", "model_version", "recent", "shards", "sources",
               "training_waiting"}


def cli(*args, env=None, timeout=60):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "streamnb_workers", *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def one_line_error(proc, code=2):
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def learn(url, model="m", messages=TRAIN, kind="multinomial"):
    """Send text messages and process them with an in-process worker."""
    r = RedisSettings(url).make_client()
    for text, label in messages:
        r.xadd(ModelKeys(model).input, {"data": encode_input("text", text, label=label)})
    # error weight 1: every message learnt with weight 1, so class weights count messages
    w = Worker(UrlConnector(RedisSettings(url)),
               [ModelSpec(model, kind=kind, featurizer_config={"bits": 10}, error_weight=1)],
               WorkerOptions(consumer="t1", block_ms=50))
    w.run_until_idle(timeout=30)
    w.shutdown()
    return r


# ------------------------------------------------------------------------------ parsing
@pytest.mark.parametrize("command", COMMANDS)
def test_help_on_every_command(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: streamnb {command}") and "--redis" in out


def test_top_level_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert all(c in out for c in COMMANDS)


BAD_ARGUMENTS = [
    (["worker", "--bogus"], "unrecognized arguments: --bogus"),
    (["worker", "--batch", "0"], "expected a whole number >= 1, got 0"),
    (["worker", "--kind", "svm"], "invalid choice: 'svm'"),
    (["worker", "--unsure-band", "0.9,0.1"], "0 <= lo <= hi <= 1"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["status", "--model", "m", "--redis", "http://localhost"], "expects a redis://, rediss:// or unix:// URL"),
    (["status", "--redis", "redis://127.0.0.1:1/0"], "--model NAME is required"),
    (["status", "--model", "bad name", "--redis", "redis://127.0.0.1:1/0"], "model name must be"),
    (["worker", "--model", "m", "--config", "/nonexistent/streamnb.toml"], "does not exist"),
    (["worker", "--model", "m", "--kind", "gaussian", "--alpha", "1", "--redis", "redis://127.0.0.1:1/0"],
     "--alpha does not apply to a gaussian model"),
    (["worker", "--order-wait-ms", "-5"], "expected a whole number >= 0, got -5"),
    (["produce", "--model", "m", "--source", "bad name", "x"], "source must be 1..100 characters"),
    (["forget", "--model", "m", "--source", "x y"], "source must be 1..100 characters"),
    (["forget", "--model", "m", "--redis", "redis://127.0.0.1:1/0"],
     "forget takes PATH... or --class LABEL or --source NAME"),
    (["worker", "--max-sources", "0"], "expected a whole number >= 1, got 0"),
    (["worker", "--target-fpr", "1.5"], "--target-fpr expects a rate between 0 and 1"),
    (["worker", "--calibration", "beta"], "invalid choice: 'beta'"),
    (["worker", "--score-window", "10"], "expected 100..1000000 messages, got 10"),
    (["worker", "--model", "m", "--target-fpr", "0.01", "--threshold", "1",
      "--redis", "redis://127.0.0.1:1/0"], "give --target-fpr or --threshold/--loss-matrix"),
    (["worker", "--model", "m", "--calibration", "isotonic", "--shards", "2",
      "--redis", "redis://127.0.0.1:1/0"], "need a model of one shard"),
]


@pytest.mark.parametrize("args, expected", BAD_ARGUMENTS)
def test_bad_arguments_exit_2_with_one_line(args, expected, capsys):
    try:
        code = main(args, env={})
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("streamnb") and expected in err


@pytest.mark.parametrize("args, expected", [BAD_ARGUMENTS[0], BAD_ARGUMENTS[5], BAD_ARGUMENTS[9]])
def test_bad_arguments_as_a_subprocess(args, expected):
    line = one_line_error(cli(*args))
    assert line.startswith("streamnb") and expected in line


def test_bad_value_from_environment_is_one_line():
    line = one_line_error(cli("worker", "--model", "m", env={"STREAMNB_BLOCK_MS": "soon"}))
    assert "environment variable STREAMNB_BLOCK_MS" in line


def test_unreachable_redis_exits_3():
    line = one_line_error(cli("status", "--model", "m", "--redis", "redis://127.0.0.1:1/0"), code=3)
    assert "cannot reach Redis" in line


# ----------------------------------------------------------------------------- redis
@pytest.mark.redis
def test_config_conflict_says_what_differs(redis_server):
    ensure_config(redis_server.client(), ModelSpec("m", kind="multinomial", model_params={"alpha": 1.0}))
    line = one_line_error(cli("worker", "--redis", redis_server.url, "--model", "m", "--kind", "bernoulli",
                              "--metrics-port", "0"))
    assert "kind: stored 'multinomial', given 'bernoulli'" in line
    line = one_line_error(cli("worker", "--redis", redis_server.url, "--model", "m", "--alpha", "0.5",
                              "--metrics-port", "0"))
    assert "model_params.alpha: stored 1.0, given 0.5" in line


@pytest.mark.redis
def test_wrong_password_and_acl_refusal_exit_2_without_leaking(redis_server, tmp_path):
    server = redis_server
    server.client().config_set("requirepass", "right-pass-123")
    if True:
        port = server.port
        url = f"redis://:wrong-pass-456@127.0.0.1:{port}/0"
        for command in (["status"], ["worker", "--metrics-port", "0"]):
            p = cli(*command, "--redis", url, "--model", "m")
            line = one_line_error(p)
            assert "refused the credentials" in line and "wrong-pass-456" not in p.stderr + p.stdout
        pw = tmp_path / "pw"
        pw.write_text("right-pass-123\n")
        p = cli("status", "--redis", f"redis://127.0.0.1:{port}/0", "--redis-password-file", str(pw),
                "--model", "m")
        assert p.returncode == 2 and "'m' does not exist" in p.stderr  # reached Redis
        from streamnb_workers.store.model_config import ModelSpec, ensure_config
        ensure_config(server.client(password="right-pass-123"), ModelSpec("shown", kind="multinomial"))
        p = cli("status", "--json", "--model", "shown", env={
            "STREAMNB_REDIS_URL": f"redis://default:right-pass-123@127.0.0.1:{port}/0"})
        info = json.loads(p.stdout)
        assert info["redis"] == f"redis://default:***@127.0.0.1:{port}/0"
        assert "right-pass-123" not in p.stdout + p.stderr
        # an ACL user that may only read: the worker cannot create the config
        r = server.client(password="right-pass-123")
        r.execute_command("ACL", "SETUSER", "reader", "on", ">reader-pw", "~*", "+@read", "+@connection")
        p = cli("worker", "--redis", f"redis://reader:reader-pw@127.0.0.1:{port}/0", "--model", "m",
                "--kind", "multinomial", "--metrics-port", "0")
        line = one_line_error(p)
        assert "ACL refused" in line and "reader-pw" not in p.stderr


@pytest.mark.redis
def test_status_json_keys_and_counts(redis_server):
    learn(redis_server.url)
    r = redis_server.client()
    r.xadd(ModelKeys("m").input, {"data": encode_input("text", "unread")})  # not yet delivered
    p = cli("status", "--redis", redis_server.url, "--model", "m", "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert set(info) == STATUS_KEYS
    assert info["exists"] and info["kind"] == "multinomial"
    assert info["classes"] == {"spam": 3.0, "ham": 2.0} and info["learnt_total"] == 5.0
    assert info["sources"] == {"default": {"spam": 3.0, "ham": 2.0}}
    assert info["streams"] == {"in": 6, "out": 5, "dead": 0, "log": r.xlen(ModelKeys("m").log)}
    assert info["lag"] == 1 and info["pending"] == 0 and info["dead_letters"] == 0
    last_log = r.xrevrange(ModelKeys("m").log, count=1)[0][0].decode()
    assert info["version"] == last_log
    assert [sh["name"] for sh in info["shards"]] == ["m"]  # not sharded: one, the model
    assert info["shards"][0]["streams"] == info["streams"]
    text = cli("status", "--redis", redis_server.url, "--model", "m")
    assert text.returncode == 0 and "multinomial" in text.stdout and "lag 1" in text.stdout


@pytest.mark.redis
def test_produce_and_forget_by_source(redis_server, tmp_path):
    learn(redis_server.url)
    box = tmp_path / "imap.jsonl"
    box.write_text('{"text": "cheap pills imap", "label": "spam"}\n'
                   '{"text": "lunch notes imap", "label": "ham"}\n')
    p = cli("produce", "--redis", redis_server.url, "--model", "m", "--source", "imap", str(box))
    assert p.returncode == 0, p.stderr
    learn(redis_server.url, messages=[])
    status = lambda: json.loads(cli("status", "--redis", redis_server.url, "--model", "m",  # noqa: E731
                                    "--json").stdout)
    assert status()["sources"] == {"default": {"spam": 3.0, "ham": 2.0},
                                   "imap": {"spam": 1.0, "ham": 1.0}}
    p = cli("forget", "--redis", redis_server.url, "--model", "m", "--source", "imap")
    assert p.returncode == 0 and "forgetting everything source 'imap'" in p.stdout, p.stderr
    info = status()
    assert info["sources"] == {"default": {"spam": 3.0, "ham": 2.0}}
    assert info["classes"] == {"spam": 3.0, "ham": 2.0}


def test_export_import_round_trip_and_offline_predict(redis_server, tmp_path):
    r = learn(redis_server.url)
    f = tmp_path / "m.snb"
    p = cli("export", "--redis", redis_server.url, "--model", "m", "-o", str(f))
    assert p.returncode == 0, p.stderr
    exported = load_model_file(f)  # the plain library loader reads it
    live, version = load_model(r, "m")
    X = np.eye(1024)[:20]
    np.testing.assert_array_equal(exported.predict_log_proba(X), live.predict_log_proba(X))
    assert exported.stats["classes"].as_dict() == {"spam": 3.0, "ham": 2.0}

    p = cli("import", "--redis", redis_server.url, "--model", "copy", str(f))
    assert p.returncode == 0, p.stderr
    copy, _ = load_model(r, "copy")
    np.testing.assert_array_equal(copy.predict_log_proba(X), live.predict_log_proba(X))
    assert read_config(r, "copy").featurizer == read_config(r, "m").featurizer

    # a second import into a model that holds statistics is refused; --add, --replace
    line = one_line_error(cli("import", "--redis", redis_server.url, "--model", "copy", str(f)))
    assert "holds statistics already (5 learnt): give --add" in line
    assert load_model(r, "copy")[0].stats["classes"].as_dict() == {"spam": 3.0, "ham": 2.0}
    p = cli("import", "--redis", redis_server.url, "--model", "copy", "--add", str(f))
    assert p.returncode == 0, p.stderr
    doubled = load_model(r, "copy")[0]
    assert doubled.stats["classes"].as_dict() == {"spam": 6.0, "ham": 4.0}
    np.testing.assert_array_equal(doubled.stats["features"].toarray(),
                                  2 * exported.stats["features"].toarray())
    r.hset(ModelKeys("copy").learnt_keys, "k", b"x")
    p = cli("import", "--redis", redis_server.url, "--model", "copy", "--replace", str(f))
    assert p.returncode == 0 and "replaced the model's statistics" in p.stdout, p.stderr
    swapped = load_model(r, "copy")[0]
    assert swapped.stats["classes"].as_dict() == {"spam": 3.0, "ham": 2.0}
    np.testing.assert_array_equal(swapped.stats["features"].toarray(),
                                  exported.stats["features"].toarray())
    assert not r.exists(ModelKeys("copy").learnt_keys)
    assert one_line_error(cli("import", "--add", "--replace", "--model", "copy", str(f)))

    ensure_config(r, ModelSpec("other", kind="bernoulli"))
    line = one_line_error(cli("import", "--redis", redis_server.url, "--model", "other", str(f)))
    assert "kind: stored 'bernoulli', given 'multinomial'" in line

    # offline prediction equals the exported model applied to the featurized message
    mail = tmp_path / "msg.eml"
    mail.write_bytes(b"From: x@example.com\nSubject: cheap meds\n\ncheap money pills now\n")
    p = cli("predict", "--snapshot", str(f), str(mail), "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    featurizer = read_config(r, "m").make_featurizer()
    msg = decode_input(encode_input("raw", mail.read_bytes()), "1-0")
    X = featurizer.stack([featurizer.featurize(msg.as_payload())])
    lp = exported.predict_log_proba(X)[0]
    classes = list(exported.classes_)
    assert got["label"] == "unsure"  # 2 ham learnt: less than the mail default of 3
    # the score: spam log-odds per feature of the message
    assert got["score"] == pytest.approx((lp[1] - lp[0]) / X.sum(), abs=1e-12)
    for c, v in zip(classes, lp, strict=True):
        assert got["log_proba"][c] == pytest.approx(v, abs=1e-12)
    line = one_line_error(cli("predict", "--snapshot", str(mail), str(mail)))
    assert "not a streamnb model file" in line


@pytest.mark.redis
def test_online_predict_waits_for_the_worker(redis_server, tmp_path):
    learn(redis_server.url)
    w = Worker(UrlConnector(RedisSettings(redis_server.url)), [ModelSpec("m")],
               WorkerOptions(consumer="t2", block_ms=50))
    t = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
    t.start()
    try:
        mail = tmp_path / "q.eml"
        mail.write_bytes(b"Subject: hello\n\ncheap meds money\n")
        p = cli("predict", "--redis", redis_server.url, "--model", "m", str(mail), "--json")
        assert p.returncode == 0, p.stderr
        got = json.loads(p.stdout)
        assert got["label"] == "unsure" and set(got["log_proba"]) == {"spam", "ham"}
        assert got["id"].startswith("predict-") and "true_label" not in got
    finally:
        w.request_stop()
        t.join(10)
    p = cli("predict", "--redis", redis_server.url, "--model", "m", str(mail), "--timeout", "0.5")
    assert one_line_error(p, code=1).endswith("is a worker running for model 'm'?")


# ------------------------------------------------------------------------ supervisor
def heartbeats(r, model):
    out = {}
    for k, v in r.hgetall(ModelKeys(model).workers).items():
        out[k.decode()] = msgpack.unpackb(v, raw=False)
    return out


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.redis
def test_supervisor_restarts_a_killed_child_and_shuts_down_warm(redis_server):
    r = redis_server.client()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")}
    sup = subprocess.Popen(
        [sys.executable, "-m", "streamnb_workers", "worker", "--redis", redis_server.url, "--model", "m",
         "--kind", "multinomial", "--bits", "8", "--processes", "2", "--metrics-port", "0",
         "--block-ms", "100", "--consumer", "sup"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        hb = wait_for(lambda: (h := heartbeats(r, "m")) and len(h) == 2 and h, what="two workers")
        assert set(hb) == {"sup-0", "sup-1"}
        victim = hb["sup-1"]["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: heartbeats(r, "m").get("sup-1", {}).get("pid") not in (None, victim),
                 what="a restarted sup-1")
        # the restarted worker serves: a message sent now is predicted
        r.xadd(ModelKeys("m").input, {"data": encode_input("text", "cheap", label="spam")})
        wait_for(lambda: r.xlen(ModelKeys("m").out) == 1, what="a prediction")
        sup.send_signal(signal.SIGTERM)
        _, err = sup.communicate(timeout=20)
        assert sup.returncode == 0, err
        assert "died with signal 9; restarting" in err
        assert r.xpending(ModelKeys("m").input, "workers")["pending"] == 0
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
