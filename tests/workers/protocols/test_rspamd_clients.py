"""``streamnb rspamd`` against the real ``rspamc`` (Debian's rspamd 3.4), a real
redis-server and a real worker: ``/checkv2`` with the explanation's tokens, learning with
a password and the statistics of one ``streamnb produce``; bad requests get HTTP errors,
slow clients are cut off, a seeded fuzz leaves the server up."""

from __future__ import annotations

import json
import random
import re
import socket
import time

import pytest

from streamnb_workers.replication.shards import load_model
from tests.helpers.milter import mail, wait_for
from tests.helpers.protocols import (
    RSPAMC,
    ServerProcess,
    ask,
    mangled,
    model_stats,
    protocol_servers,
    rspamc,
    run_client,
    same_stats,
)
from tests.helpers.workers import PYTHON

pytestmark = [pytest.mark.redis, pytest.mark.skipif(RSPAMC is None, reason="rspamc is not installed")]

PASSWORD = "s3cret"
MAX_SIZE = 65536


@pytest.fixture(scope="module")
def rspamd(tmp_path_factory):
    """A trained model whose worker explains 3 tokens, and ``streamnb rspamd`` with a
    learning password, 64 KiB mails and 0.5 s between reads."""
    logs = tmp_path_factory.mktemp("rspamd")
    (logs / "password").write_text(PASSWORD + "\n")
    with protocol_servers(logs, [("rspamd", "rspamd.log", (
            "--password-file", str(logs / "password"), "--max-size", str(MAX_SIZE),
            "--read-timeout", "0.5"))], explain=3) as (redis_server, (server,)):
        yield redis_server, server


def post(path: str, body: bytes, *headers: str) -> bytes:
    head = "".join(h + "\r\n" for h in headers)
    return (f"POST {path} HTTP/1.0\r\nContent-Length: {len(body)}\r\n{head}\r\n").encode() + body


def test_symbols_give_action_score_and_the_explained_tokens(rspamd):
    _, server = rspamd
    spam = rspamc(server, "symbols", mail_bytes=mail("spam", 901))
    ham = rspamc(server, "symbols", mail_bytes=mail("ham", 902))
    assert spam.returncode == ham.returncode == 0, (spam, ham)
    assert b"Action: add header\nSpam: true\nScore: " in spam.stdout
    assert b"Action: no action\nSpam: false\n" in ham.stdout
    symbol = next(line for line in spam.stdout.decode().splitlines() if line.startswith("Symbol:"))
    assert symbol.startswith("Symbol: STREAMNB_SPAM (") and symbol.count("=") == 3  # 3 tokens


def test_the_json_reply_and_the_user_headers(rspamd):
    _, server = rspamd
    for header in ("Deliver-To: alice@example.org", "Rcpt: bob@example.org", "User: root"):
        head, _, body = ask(server, post("/checkv2", mail("spam", 903), header)).partition(
            b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200 ")
        reply = json.loads(body)
        assert reply["action"] == "add header" and reply["required_score"] == 5.0
        assert reply["score"] > 5.0
        assert reply["symbols"]["STREAMNB_SPAM"]["score"] == reply["score"]
        assert reply["milter"]["add_headers"]["X-Streamnb-Verdict"] == "spam"
    assert ask(server, b"GET /ping HTTP/1.0\r\n\r\n").endswith(b"\r\n\r\npong\r\n")


def test_learning_needs_the_password_and_leaves_the_statistics_of_produce(rspamd, tmp_path):
    redis_server, server = rspamd
    r = redis_server.client()
    m = mail("ham", 23_456)
    before = model_stats(r)
    assert b"HTTP error: 403" in rspamc(server, "learn_spam", mail_bytes=m).stdout
    assert rspamc(server, "-P", "wrong", "learn_spam", mail_bytes=m).returncode == 1
    same_stats(model_stats(r), before)
    learnt = rspamc(server, "-P", PASSWORD, "learn_spam", mail_bytes=m)
    assert learnt.returncode == 0 and b"success = true;" in learnt.stdout, learnt
    after_learn = model_stats(r)
    again = rspamc(server, "-P", PASSWORD, "learn_spam", mail_bytes=m)
    assert again.returncode == 0 and b"already learned as spam" in again.stdout  # 208
    # forgotten, then sent once by `streamnb produce`: the same statistics
    path = tmp_path / "m.eml"
    path.write_bytes(m)
    cli = [PYTHON, "-m", "streamnb_workers"]
    common = ["--redis", redis_server.url, "--model", "mail"]
    version = load_model(r, "mail")[1]
    assert run_client(cli + ["forget", *common, str(path)]).returncode == 0
    wait_for(lambda: load_model(r, "mail")[1] != version, 30, "the forget")
    same_stats(model_stats(r), before)
    version = load_model(r, "mail")[1]
    assert run_client(cli + ["produce", *common, "--label", "spam", str(path)]).returncode == 0
    wait_for(lambda: load_model(r, "mail")[1] != version, 30, "the produced mail")
    same_stats(model_stats(r), after_learn)
    corrected = rspamc(server, "-P", PASSWORD, "learn_ham", mail_bytes=m)
    assert b"success = true;" in corrected.stdout
    assert (model_stats(r)["features"]["spam"] == before["features"]["spam"]).all()


@pytest.mark.parametrize("request_bytes, status", [
    (b"BREW /pot HTCPCP/1.0\r\n\r\n", b"400"),
    (b"garbage\r\n\r\n", b"400"),
    (b"POST /checkv2 HTTP/1.0\r\n\r\n", b"411"),
    (b"POST /checkv2 HTTP/1.0\r\nContent-Length: 1x\r\n\r\n", b"411"),
    (b"POST /checkv2 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
     b"411"),
    (b"POST /checkv2 HTTP/1.0\r\nContent-Length: 500\r\n\r\nSubject: s\r\n\r\nshort", b"400"),
    (b"POST /checkv2 HTTP/1.0\r\n" + b"X-A: b\r\n" * 120 + b"\r\n", b"431"),
    (b"POST /checkv2 HTTP/1.0\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.0\r\n\r\n", b"414"),
    (b"POST /nowhere HTTP/1.0\r\nContent-Length: 0\r\n\r\n", b"404"),
    (post("/learnham", b"\x00\x01", f"Password: {PASSWORD}"), b"400"),
    (post("/learnspam", mail("spam", 5, n_words=40_000), f"Password: {PASSWORD}"), b"413"),
])
def test_a_bad_request_gets_an_http_error(rspamd, request_bytes, status):
    _, server = rspamd
    reply = ask(server, request_bytes)
    assert reply.startswith(b"HTTP/1.0 " + status), reply[:300]


def test_an_oversize_mail_is_checked_on_its_start(rspamd):
    _, server = rspamd
    big = mail("spam", 6, n_words=40_000)
    assert len(big) > 2 * MAX_SIZE
    head, _, body = ask(server, post("/checkv2", big)).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 ") and json.loads(body)["action"] == "add header"


def test_silent_and_dripping_clients_are_cut_off_without_holding_up_others(rspamd):
    _, server = rspamd
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as silent:
        silent.sendall(b"POST /checkv2 HTTP/1.0\r\n")
        start = time.monotonic()
        assert rspamc(server, "symbols", mail_bytes=mail("spam", 7)).returncode == 0
        assert silent.recv(1000) == b""  # closed at the read timeout
        assert time.monotonic() - start < 5
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as drip:
        drip.sendall(b"POST /checkv2 HTTP/1.0\r\nContent-Length: 100000\r\n\r\n")
        start, closed = time.monotonic(), False
        while not closed and time.monotonic() - start < 10:
            try:
                drip.sendall(b"X")
                drip.settimeout(0.1)
                closed = drip.recv(1000) == b"" or closed
            except TimeoutError:
                continue
            except OSError:
                closed = True
        assert closed and time.monotonic() - start < 5  # the request's deadline: 2 s
    assert server.proc.poll() is None


def _mutated(rng: random.Random) -> bytes:
    body = mail(rng.choice(["spam", "ham"]), rng.randrange(1000), n_words=rng.randrange(1, 60))
    path = rng.choice(["/checkv2", "/learnspam", "/learnham", "/ping", "/", "/x" * 50])
    headers = [f"Content-Length: {rng.choice([len(body), len(body) + 9, 0, rng.randrange(10**7)])}"]
    headers += rng.sample([f"Password: {PASSWORD}", "Password: x", "Deliver-To: a@b.c", "User: u",
                           "Rcpt: <>", "Transfer-Encoding: chunked", "X-\udcff: 1", ": v"],
                          rng.randrange(4))
    data = (f"{rng.choice(['POST', 'GET', 'PUT', 'HEAD', ''])} {path} "
            f"{rng.choice(['HTTP/1.0', 'HTTP/1.1', 'HTTP/2', 'HTTP/x'])}\r\n"
            + "".join(h + "\r\n" for h in headers) + "\r\n").encode("utf-8", "surrogateescape")
    data += body
    return mangled(rng, data)


def test_fuzzed_requests_are_answered_or_closed_and_the_server_stays_up(rspamd):
    _, server = rspamd
    rng = random.Random(20261207)
    for _ in range(150):
        data = _mutated(rng)
        reply = ask(server, data)
        assert reply == b"" or reply.startswith(b"HTTP/1.0 "), (data[:200], reply[:200])
    assert rspamc(server, "symbols", mail_bytes=mail("spam", 8)).returncode == 0
    assert server.proc.poll() is None


def test_a_mail_not_scored_gets_503(rspamd, tmp_path):
    """No worker serves model "idle": no verdict within the timeout; rspamc exits 1."""
    redis_server, _ = rspamd
    with ServerProcess("rspamd", redis_server.url, tmp_path / "idle.log", "--model", "idle",
                       timeout=0.3) as idle:
        reply = ask(idle, post("/checkv2", mail("spam", 961)))
        assert reply.startswith(b"HTTP/1.0 503 ") and reply.endswith(b'{"error": "not scored (timeout)"}')
        assert rspamc(idle, "symbols", mail_bytes=mail("spam", 962)).returncode == 1


def amavis_rspamd_request(port: int, raw: bytes, recipients: list[str]) -> bytes:
    """What amavis's ``Amavis::SpamControl::RspamdClient`` (amavisd-new 2.13.0, Debian
    bookworm) sends through LWP: ``POST /checkv2 HTTP/1.1``, the mail as an octet stream,
    the SMTP session's facts as headers, one ``Rcpt`` per recipient."""
    headers = [("TE", "deflate,gzip;q=0.3"), ("Connection", "TE, close"),
               ("Host", f"127.0.0.1:{port}"), ("User-Agent", "amavis/2.412"),
               ("Content-Length", str(len(raw))), ("Content-Type", "application/octet-stream"),
               ("Helo", "mx.example.net"), ("Hostname", "mx.example.net"), ("IP", "192.0.2.7"),
               ("MTA-Name", "mail.example.org"), ("From", "<sender@example.net>"),
               ("Queue-Id", "4XyZ1"), *(("Rcpt", r) for r in recipients)]
    return ("POST /checkv2 HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
            + "\r\n").encode() + raw


def amavis_rspamd_parse(reply: bytes) -> tuple[float, str, str]:
    """The score, verdict and tests amavis's RspamdClient takes from a reply: a 2xx
    status, JSON with ``score``, ``action`` (its verdict by action) and each symbol's
    ``name`` and ``score``."""
    head, _, body = reply.partition(b"\r\n\r\n")
    assert re.match(rb"HTTP/1\.[01] 2\d\d ", head), head
    answer = json.loads(body)
    verdict = {"add header": "Spam", "no action": "Ham", "reject": "Spam",
               "rewrite subject": "Spam", "discard": "Spam", "quarantine": "Spam",
               }.get(answer["action"], "Unknown")
    tests = ",".join(f"{s['name'].replace('=', '_').replace(',', '_')}={s['score']}"
                     for s in answer["symbols"].values())
    return float(answer["score"]), verdict, tests


def test_amavis_rspamdclient_request_and_its_parse_of_the_answer(rspamd):
    """amavis's Rspamd client, replayed byte for byte (no amavis binary): its verdict is
    the workers', its score the points, its tests the symbol."""
    _, server = rspamd
    for label, seed in (("spam", 980), ("ham", 981)):
        m = mail(label, seed)
        reply = ask(server, amavis_rspamd_request(server.port, m, ["<a@example.org>",
                                                                   "<b@example.org>"]))
        score, verdict, tests = amavis_rspamd_parse(reply)
        assert verdict == label.capitalize()
        assert (score > 5.0) is (label == "spam")
        assert tests == f"STREAMNB_{label.upper()}={score}"
