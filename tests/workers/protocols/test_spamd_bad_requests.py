"""Bad requests to ``streamnb spamd``: each gets spamd's error line (or the connection is
closed), and the server goes on answering ``spamc``; slow clients are cut off without
holding up the others; a seeded fuzz of requests leaves the server up."""

from __future__ import annotations

import random
import socket
import threading
import time
import zlib

import pytest

from tests.helpers.milter import mail
from tests.helpers.protocols import (
    SPAMC,
    ask,
    mangled,
    protocol_servers,
    run_client,
)

pytestmark = [pytest.mark.redis, pytest.mark.skipif(SPAMC is None, reason="spamc is not installed")]

MAX_SIZE = 65536


@pytest.fixture(scope="module")
def spamd(tmp_path_factory):
    """A trained model and ``streamnb spamd`` with small limits: 64 KiB mails, 0.5 s
    between reads (2 s a request), two connections at once."""
    with protocol_servers(tmp_path_factory.mktemp("spamd-bad"), [("spamd", "spamd.log", (
            "--allow-tell", "--max-size", str(MAX_SIZE), "--read-timeout", "0.5",
            "--max-connections", "2"))]) as (_, (server,)):
        yield server


def still_up(server) -> None:
    assert server.proc.poll() is None, server.log()
    ok = run_client([SPAMC, "-d", "127.0.0.1", "-p", str(server.port), "-c"], mail("spam", 1))
    assert ok.returncode == 1, ok


def check(body: bytes, *headers: bytes) -> bytes:
    return b"CHECK SPAMC/1.5\r\n" + b"".join(h + b"\r\n" for h in headers) + \
        b"Content-length: %d\r\n\r\n" % len(body) + body


@pytest.mark.parametrize("request_bytes, answer", [
    (b"GET / HTTP/1.0\r\n\r\n", b"SPAMD/1.0 76 Bad header line: GET / HTTP/1.0"),
    (b"CHECK SPAMC/x\r\n\r\n", b"SPAMD/1.0 76 Bad header line: CHECK SPAMC/x"),
    (b"CHECK SPAMC/1.5\r\nno colon here\r\n\r\n", b"SPAMD/1.0 76 Bad header line: (header not"),
    (b"CHECK SPAMC/1.5\r\nContent-length: 12a\r\n\r\n",
     b"SPAMD/1.0 76 Bad header line: (Content-Length contains non-numeric bytes)"),
    (b"CHECK SPAMC/1.5\r\nContent-length: 500\r\n\r\nSubject: short\r\n\r\nx",
     b"SPAMD/1.0 76 Bad header line: (Content-Length mismatch: Expected 500 bytes, got 19 bytes)"),
    (b"CHECK SPAMC/1.5\r\n" + b"X-A: b\r\n" * 101 + b"\r\n",
     b"SPAMD/1.0 76 Bad header line: (too many headers)"),
    (b"CHECK SPAMC/1.5\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
     b"SPAMD/1.0 76 Bad header line: (header line too long)"),
    (b"CHECK SPAMC/1.5\r\nCompress: gzip\r\nContent-length: 1\r\n\r\nx",
     b"SPAMD/1.0 76 Bad header line: (compression type not supported: gzip)"),
    (b"CHECK SPAMC/1.5\r\nCompress: zlib\r\nContent-length: 5\r\n\r\nnotzl",
     b"SPAMD/1.0 69 Service Unavailable: zlib"),
    (b"CHECK SPAMC/1.5\r\nContent-le", b"SPAMD/1.0 76 Bad header line: (EOF during headers)"),
    (b"TELL SPAMC/1.5\r\nSet: local\r\nRemove: local\r\nMessage-class: spam\r\n"
     b"Content-length: 0\r\n\r\n", b"SPAMD/1.0 76 Bad header line: Unable to set local and"),
    (b"TELL SPAMC/1.5\r\nMessage-class: eggs\r\n\r\n",
     b"SPAMD/1.0 76 Bad header line: (Message-class header contains invalid class)"),
    (b"TELL SPAMC/1.5\r\nMessage-class: spam\r\nSet: local\r\nContent-length: 4\r\n\r\n\x00\x01\x02\x03",
     b"SPAMD/1.0 65 Data error: "),
    (b"SKIP SPAMC/1.5\r\n\r\n", b""),
])
def test_a_bad_request_gets_spamds_error_line(spamd, request_bytes, answer):
    reply = ask(spamd, request_bytes)
    assert reply.startswith(answer), reply
    assert reply.count(b"\r\n") <= 1


def test_a_compressed_mail_is_checked(spamd):
    # as spamc -z sends it (Debian's spamc is built without zlib: -z is a usage error there)
    small = zlib.compress(mail("spam", 2))
    reply = ask(spamd, b"CHECK SPAMC/1.5\r\nCompress: zlib\r\nContent-length: %d\r\n\r\n%s"
                % (len(small), small))
    assert reply.startswith(b"SPAMD/1.1 0 EX_OK\r\nSpam: True ; "), reply
    big = mail("ham", 3, n_words=200_000)  # inflates past the limit: scored on its start
    reply = ask(spamd, b"CHECK SPAMC/1.5\r\nCompress: zlib\r\nContent-length: %d\r\n\r\n%s"
                % (len(zb := zlib.compress(big)), zb))
    assert reply.startswith(b"SPAMD/1.1 0 EX_OK\r\nSpam: False ; "), reply


def test_an_oversize_mail_is_checked_on_its_start_and_refused_for_process(spamd):
    big = mail("spam", 4, n_words=40_000)
    assert len(big) > 2 * MAX_SIZE
    assert ask(spamd, check(big)).startswith(b"SPAMD/1.1 0 EX_OK\r\nSpam: True ; ")
    processed = ask(spamd, check(big).replace(b"CHECK", b"PROCESS", 1))
    assert processed.startswith(b"SPAMD/1.0 65 Data error: message over 65536 bytes")
    still_up(spamd)


def test_silent_and_dripping_clients_are_cut_off_without_holding_up_others(spamd):
    with socket.create_connection(("127.0.0.1", spamd.port), timeout=10) as silent:
        silent.sendall(b"CHECK SPAMC/1.5\r\n")
        start = time.monotonic()
        still_up(spamd)  # answered while the silent client waits
        assert silent.recv(1000).startswith(b"SPAMD/1.0 79 Timeout: ")
        assert time.monotonic() - start < 5
    with socket.create_connection(("127.0.0.1", spamd.port), timeout=10) as drip:
        drip.sendall(b"CHECK SPAMC/1.5\r\n")
        start, reply = time.monotonic(), b""
        while not reply and time.monotonic() - start < 10:
            try:
                drip.sendall(b"X")
            except OSError:
                break
            drip.settimeout(0.1)
            try:
                reply = drip.recv(1000)
            except TimeoutError:
                continue
        assert reply.startswith(b"SPAMD/1.0 79 Timeout: (the request took too long")
        assert time.monotonic() - start < 5  # the request's deadline: 4 x 0.5 s
    still_up(spamd)


def test_connections_over_the_bound_wait_then_hear_busy(spamd):
    holders = [socket.create_connection(("127.0.0.1", spamd.port), timeout=10) for _ in range(2)]
    stop = threading.Event()

    def drip() -> None:  # keep both slots busy until their requests' deadline
        while not stop.wait(0.1):
            for h in holders:
                try:
                    h.sendall(b"X-Drip: 1\r\n")
                except OSError:
                    pass

    for h in holders:
        h.sendall(b"CHECK SPAMC/1.5\r\n")
    time.sleep(0.1)
    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        reply = ask(spamd, b"PING SPAMC/1.5\r\n\r\n")
        assert reply == b"SPAMD/1.0 75 Service busy: too many connections\r\n"
    finally:
        stop.set()
        thread.join()
        for h in holders:
            h.close()
    still_up(spamd)


def _mutated(rng: random.Random) -> bytes:
    body = mail(rng.choice(["spam", "ham"]), rng.randrange(1000), n_words=rng.randrange(1, 60))
    command = rng.choice(["CHECK", "SYMBOLS", "REPORT", "REPORT_IFSPAM", "PROCESS", "HEADERS",
                          "PING", "SKIP", "TELL", "BOGUS", ""])
    headers = [b"Content-length: %d" % rng.choice([len(body), len(body) + 7, 0,
                                                   rng.randrange(10**6)])]
    headers += rng.sample([b"User: root", b"Message-class: spam", b"Set: local", b"Remove: local",
                           b"Compress: zlib", b"X-\xff: \x00", b": empty", b"User:"],
                          rng.randrange(4))
    data = f"{command} SPAMC/{rng.choice(['1.5', '1.2', '1.0', '9', '-1'])}\r\n".encode() + \
        b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body
    return mangled(rng, data)


def test_fuzzed_requests_are_answered_or_closed_and_the_server_stays_up(spamd):
    rng = random.Random(20261207)
    for _ in range(150):
        data = _mutated(rng)
        reply = ask(spamd, data)
        assert reply == b"" or reply.startswith(b"SPAMD/"), (data[:200], reply[:200])
    still_up(spamd)
