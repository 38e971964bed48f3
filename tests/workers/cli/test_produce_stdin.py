"""``streamnb produce ... -``: one mail on stdin, as Sieve, procmail and MTA pipes give it,
against a real redis-server and a worker: learnt (the statistics those of an offline fit),
already learnt (exit 0, not sent again), Redis down (exit 1, retry later), not mail or bad
usage (exit 2); never a byte on stdout, at most one line on stderr."""

from __future__ import annotations

import os
import subprocess

import pytest

from streamnb_workers.cli.launch import blas_env
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec, ensure_config
from tests.helpers.redis_server import free_port
from tests.helpers.workers import (
    FCFG,
    PARAMS,
    PYTHON,
    ROOT,
    assert_same_stats,
    count_spec,
    fast_options,
    learnt_model,
    offline_model,
    url_worker,
)

pytestmark = pytest.mark.redis

KEYS = ModelKeys("mail")


def mail(n: int, words: str, crlf: bool = False) -> bytes:
    text = (f"From: sender-{n}@example.org\nTo: box@example.net\nSubject: note {n}\n"
            f"Message-ID: <{n}@stdin.test>\n\n{words} {n}\n")
    return text.replace("\n", "\r\n").encode() if crlf else text.encode()


SPAM = mail(1, "cheap meds winner prize offer click")
HAM = mail(2, "meeting notes lunch project agenda review", crlf=True)


def streamnb(*args: str, stdin: bytes = b"", url: str | None = None) -> subprocess.CompletedProcess:
    env = blas_env({k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")})
    redis = ["--redis", url] if url else []
    return subprocess.run([PYTHON, "-m", "streamnb_workers", *args, *redis], input=stdin,
                          cwd=ROOT, env=env, capture_output=True, timeout=60)


def learn(url: str, label: str, raw: bytes, *extra: str) -> subprocess.CompletedProcess:
    return streamnb("produce", "--model", "mail", "--label", label, *extra, "-", stdin=raw, url=url)


@pytest.fixture
def model(redis_server):
    """Model "mail" (no worker running yet) on a fresh redis-server; yields its client."""
    client = redis_server.client()
    ensure_config(client, count_spec("mail"))
    return client


def run_worker(url: str) -> None:
    url_worker(url, [count_spec("mail")], fast_options("w-stdin")).run_until_idle()


def test_stdin_is_learnt_with_its_label(redis_server, model):
    for label, raw in (("spam", SPAM), ("ham", HAM)):
        proc = learn(redis_server.url, label, raw)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b""), proc.stderr
    assert model.xlen(KEYS.input) == 2
    run_worker(redis_server.url)
    learnt, _ = learnt_model(model, "mail")
    expected = offline_model("multinomial", PARAMS, FCFG, [{"raw": SPAM, "label": "spam"},
                                                           {"raw": HAM, "label": "ham"}])
    assert_same_stats(learnt, expected)
    assert sorted(learnt.classes_) == ["ham", "spam"]


def test_already_learnt_exits_0_and_is_not_sent_again(redis_server, model):
    assert learn(redis_server.url, "spam", SPAM).returncode == 0
    run_worker(redis_server.url)
    before, _ = learnt_model(model, "mail")
    proc = learn(redis_server.url, "spam", SPAM)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
    assert model.xlen(KEYS.input) == 1  # not sent a second time
    # -v says what happened, on stderr, in one line
    proc = learn(redis_server.url, "spam", SPAM, "-v")
    assert proc.returncode == 0 and proc.stdout == b""
    assert proc.stderr.decode().splitlines() == [
        "streamnb produce: 1 message from stdin already learnt, not sent to streamnb:{mail}:in"]
    run_worker(redis_server.url)
    assert_same_stats(learnt_model(model, "mail")[0], before)


def test_the_same_mail_twice_before_a_worker_runs_is_learnt_once(redis_server, model):
    """Both are sent (nothing is learnt yet); the worker's learn-once key drops the second."""
    assert learn(redis_server.url, "spam", SPAM).returncode == 0
    assert learn(redis_server.url, "spam", SPAM).returncode == 0
    run_worker(redis_server.url)
    expected = offline_model("multinomial", PARAMS, FCFG, [{"raw": SPAM, "label": "spam"}])
    assert_same_stats(learnt_model(model, "mail")[0], expected)


def test_redis_down_exits_1_to_be_retried():
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = learn(url, "spam", SPAM)
    assert proc.returncode == 1
    assert proc.stdout == b""
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and "cannot reach Redis" in err, err


@pytest.mark.parametrize(("raw", "why"), [
    (b"", "empty, not mail"),
    (b"\n \n", "empty, not mail"),
    (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", "binary (NUL bytes in the headers)"),
    (b"\x89PNG\r\n\x1a\n", "does not start with a header line"),
    (b"Subject: x\nX-Bin: a\0b\n\nbody\n", "binary (NUL bytes in the headers)"),
    (b"hello, this is not a mail\n", "does not start with a header line"),
])
def test_input_that_is_not_mail_exits_2_and_sends_nothing(redis_server, model, raw, why):
    proc = learn(redis_server.url, "spam", raw)
    assert proc.returncode == 2 and proc.stdout == b""
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and why in err and err.startswith("streamnb: error: produce -:")
    assert model.xlen(KEYS.input) == 0


def test_not_mail_is_exit_2_even_when_redis_is_down():
    """Bad input is not worth a retry: it is judged before Redis is asked."""
    proc = learn(f"redis://127.0.0.1:{free_port()}/0", "spam", b"")
    assert proc.returncode == 2 and "empty, not mail" in proc.stderr.decode()


@pytest.mark.parametrize("args", [
    ["-", "other.eml"],
    ["--index", "index.tsv", "-"],
    ["--label", "spam", "--chunk", "0", "-"],
])
def test_bad_usage_exits_2_in_one_line(redis_server, model, args):
    proc = streamnb("produce", "--model", "mail", *args, stdin=SPAM, url=redis_server.url)
    assert proc.returncode == 2 and proc.stdout == b""
    assert proc.stderr.decode().count("\n") == 1, proc.stderr
    assert model.xlen(KEYS.input) == 0


def test_a_label_outside_the_declared_classes_exits_2(redis_server):
    client = redis_server.client()
    ensure_config(client, ModelSpec("mail", kind="multinomial", classes=["spam", "ham"]))
    proc = learn(redis_server.url, "Spam", SPAM)
    assert proc.returncode == 2 and proc.stdout == b""
    assert "'Spam' is not one of model 'mail''s classes" in proc.stderr.decode()
    assert client.xlen(KEYS.input) == 0


def test_a_model_that_does_not_exist_exits_2(redis_server, model):
    proc = streamnb("produce", "--model", "nobody", "--label", "spam", "-", stdin=SPAM,
                    url=redis_server.url)
    assert proc.returncode == 2 and proc.stdout == b""
    assert "'nobody' does not exist" in proc.stderr.decode()


def test_a_mail_over_max_bytes_is_cut_and_keyed_as_a_whole(redis_server, model):
    """As a file would be: the key is the whole mail's (its Message-ID here), the entry cut."""
    big = mail(3, "word " * 4000)
    proc = learn(redis_server.url, "spam", big, "--max-bytes", "2048")
    assert proc.returncode == 0, proc.stderr
    import msgpack

    (_, fields), = model.xrange(KEYS.input)
    sent = msgpack.unpackb(fields[b"data"], raw=False)
    assert sent["key"] == "mid:<3@stdin.test>" or "3@stdin.test" in sent["key"]
    assert len(sent["raw"]) <= 2048 + 100 and sent["label"] == "spam"
    assert sent["id"] == f"stdin:{sent['key']}"


# -- predict - on input that is not mail, and quiet commands ------------------------------

@pytest.mark.parametrize("raw", [b"", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\n\nmore\n"])
def test_predict_stdin_refuses_what_is_not_mail(redis_server, model, raw):
    """As ``predict FILE`` refuses it; in pipe mode the input comes back unchanged after one
    not-scored line, exit 3 (also with -e); nothing is sent to the workers."""
    proc = streamnb("predict", "--model", "mail", "-p", "-e", "-", stdin=raw, url=redis_server.url)
    assert proc.returncode == 3
    mark = b"X-Streamnb-Verdict: not-scored (not-mail)"
    assert proc.stdout in (mark + b"\n" + raw, mark + b"\r\n" + raw)  # the input's line end
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and "not scored: stdin:" in err and "not mail" in err
    proc = streamnb("predict", "--model", "mail", "-", stdin=raw, url=redis_server.url)
    assert (proc.returncode, proc.stdout) == (3, b"")
    assert model.xlen(KEYS.input) == 0


def test_commands_are_quiet_on_stderr_unless_asked(redis_server, model):
    """status loads the model from its snapshot, which logs an INFO line: only with -v or
    --log-level INFO (or DEBUG); a warning or an error would still show."""
    assert learn(redis_server.url, "spam", SPAM).returncode == 0
    url_worker(redis_server.url, [count_spec("mail")],
               fast_options("w-snap", snapshot_every=1, snapshot_interval_s=0.0)).run_until_idle()
    assert model.exists(KEYS.snapshot)
    proc = streamnb("status", "--model", "mail", url=redis_server.url)
    assert proc.returncode == 0 and proc.stdout and proc.stderr == b"", proc.stderr
    for loud in (["-v"], ["--log-level", "INFO"], ["--log-level", "debug"]):
        proc = streamnb("status", "--model", "mail", *loud, url=redis_server.url)
        assert proc.returncode == 0
        assert b"loaded snapshot" in proc.stderr, (loud, proc.stderr)
    proc = streamnb("status", "--model", "mail", "-v", "--log-level", "ERROR", url=redis_server.url)
    assert proc.stderr == b""  # --log-level wins over -v
