"""``streamnb spamd`` against the real ``spamc`` (Debian's spamc 4.0.1), a real
redis-server and a real worker: checks, reports, symbols, learning and forgetting, with
the statistics a TELL leaves equal to those of one ``streamnb produce``."""

from __future__ import annotations

import re
import signal

import pytest

from streamnb_workers.client.verdicts import score_of
from streamnb_workers.protocols.mail_service import Scale
from streamnb_workers.replication.shards import load_model
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.milter import K, mail, wait_for
from tests.helpers.protocols import (
    SPAMC,
    ServerProcess,
    ask,
    model_stats,
    protocol_servers,
    run_client,
    same_stats,
    spamc,
)
from tests.helpers.workers import PYTHON

pytestmark = [pytest.mark.redis, pytest.mark.skipif(SPAMC is None, reason="spamc is not installed")]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A trained model, ``streamnb spamd --allow-tell`` and one without TELL."""
    with protocol_servers(tmp_path_factory.mktemp("spamd"), [
            ("spamd", "spamd.log", ("--allow-tell", "--read-timeout", "1")),
            ("spamd", "spamd-no-tell.log", ())]) as (redis_server, (tell, no_tell)):
        yield redis_server, tell, no_tell


def test_check_exits_1_for_spam_and_0_for_ham_with_points_over_the_threshold(servers):
    _, tell, _ = servers
    spam = spamc(tell, "-c", mail_bytes=mail("spam", 901))
    ham = spamc(tell, "-c", mail_bytes=mail("ham", 902))
    assert spam.returncode == 1 and ham.returncode == 0, (spam, ham)
    s_points, s_req = map(float, spam.stdout.decode().strip().split("/"))
    h_points, h_req = map(float, ham.stdout.decode().strip().split("/"))
    assert s_req == h_req == 5.0
    assert s_points > 5.0 > h_points


def test_the_points_are_the_workers_score_on_the_documented_scale(servers):
    redis_server, tell, _ = servers
    r = redis_server.client()
    reply = ask(tell, b"PROCESS SPAMC/1.5\r\nContent-length: %d\r\n\r\n%s"
                        % (len(m := mail("spam", 903)), m))
    head, _, message = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"SPAMD/1.1 0 EX_OK\r\n")
    spam_line = re.search(rb"Spam: (True|False) ; (\S+) / (\S+)", head)
    msg_id = re.search(rb"X-Streamnb-Id: (\S+)", message)[1].decode()
    prediction = next(o for o in (decode_output(f[b"data"]) for _, f in r.xrange(K.out))
                      if o.get("id") == msg_id)
    assert spam_line[1] == (b"True" if prediction["label"] == "spam" else b"False")
    assert float(spam_line[2]) == pytest.approx(Scale().points(score_of(prediction)), abs=0.051)
    assert b"X-Streamnb-Verdict: %s" % prediction["label"].encode() in message
    assert message.endswith(m[m.index(b"\r\n\r\n") + 4:])  # the body unchanged


def test_report_symbols_headers_and_ping(servers):
    _, tell, _ = servers
    report = spamc(tell, "-R", mail_bytes=mail("spam", 904))
    assert report.returncode == 0
    first, rest = report.stdout.decode().split("\n", 1)
    assert re.fullmatch(r"-?\d+\.\d/5\.0", first) and "STREAMNB_SPAM" in rest
    assert spamc(tell, "-r", mail_bytes=mail("ham", 905)).stdout == b""  # REPORT_IFSPAM, ham
    assert spamc(tell, "-y", mail_bytes=mail("ham", 906)).stdout == b"STREAMNB_HAM"
    headers = spamc(tell, "--headers", mail_bytes=mail("ham", 907)).stdout
    assert b"X-Streamnb-Verdict: ham" in headers
    assert spamc(tell, "-K").stdout == b"SPAMD/1.5 0\n"


def test_a_user_header_picks_the_global_model_for_names_and_addresses(servers):
    _, tell, _ = servers
    for user in ("alice@example.org", "root", "Bob <bob@example.org>"):
        assert spamc(tell, "-c", "-u", user, mail_bytes=mail("spam", 908)).returncode == 1


def test_tell_learns_forgets_and_corrects_as_produce_does(servers, tmp_path):
    redis_server, tell, _ = servers
    r = redis_server.client()
    m = mail("ham", 12_345)
    before = model_stats(r)
    learn = spamc(tell, "-L", "spam", mail_bytes=m)
    assert learn.stdout == b"Message successfully un/learned\n", learn
    after_tell = model_stats(r)
    assert spamc(tell, "-L", "spam", mail_bytes=m).stdout == b"Message was already un/learned\n"
    forget = spamc(tell, "-L", "forget", mail_bytes=m)
    assert forget.stdout == b"Message successfully un/learned\n"
    same_stats(model_stats(r), before)
    assert spamc(tell, "-L", "forget", mail_bytes=m).stdout == b"Message was already un/learned\n"
    # the same mail through one `streamnb produce - --label spam`
    path = tmp_path / "m.eml"
    path.write_bytes(m)
    version = load_model(r, "mail")[1]
    run_client([PYTHON, "-m", "streamnb_workers", "produce", "--redis", redis_server.url,
                "--model", "mail", "--label", "spam", str(path)])
    wait_for(lambda: load_model(r, "mail")[1] != version, 30, "the produced mail")
    same_stats(model_stats(r), after_tell)
    assert spamc(tell, "-L", "spam", mail_bytes=m).stdout == b"Message was already un/learned\n"
    # a correction: the ham label moves the mail's counts from spam to ham
    assert spamc(tell, "-L", "ham", mail_bytes=m).stdout == b"Message successfully un/learned\n"
    corrected = model_stats(r)
    assert (corrected["features"]["spam"] == before["features"]["spam"]).all()
    assert (corrected["features"]["ham"] != before["features"]["ham"]).any()
    # report (Set: local,remote): learnt locally; there is no remote network to report to
    reported = spamc(tell, "-C", "report", mail_bytes=mail("spam", 12_346))
    assert reported.stdout == b"Unable to report/revoke message\n"


def test_tell_is_refused_without_allow_tell(servers):
    redis_server, _, no_tell = servers
    r = redis_server.client()
    before = model_stats(r)
    m = mail("spam", 12_400)
    refused = ask(no_tell, b"TELL SPAMC/1.5\r\nMessage-class: spam\r\nSet: local\r\n"
                          b"Content-length: %d\r\n\r\n%s" % (len(m), m))
    assert refused.startswith(b"SPAMD/1.0 69 Service Unavailable: TELL commands are not enabled")
    out = spamc(no_tell, "-L", "spam", mail_bytes=m)
    # spamc reads the one error line, then the closed connection: no output, exit not 0
    assert out.stdout == b"" and out.returncode != 0, out
    same_stats(model_stats(r), before)


def test_exims_request_and_exims_parse_of_the_answer(servers):
    """The request Exim's ``spam =`` sends (src/spam.c: ``REPORT SPAMC/1.2``, ``User:``,
    ``Content-length``, then a half-close) and the two formats it parses, in order."""
    _, tell, _ = servers
    for label, spam in (("spam", True), ("ham", False)):
        m = mail(label, 950)
        reply = ask(tell, b"REPORT SPAMC/1.2\r\nUser: nobody\r\nContent-length: %d\r\n"
                            b"\r\n%s" % (len(m), m))
        assert not re.match(rb"SPAMD/\S{1,7} 0 EX_OK\r\nContent-length: \d+\r\n\r\n", reply)
        parsed = re.match(rb"SPAMD/\S{1,7} 0 EX_OK\r\nSpam: \S+ ; (\S+) / (\S+)\r\n\r\n", reply)
        assert parsed, reply
        points, threshold = float(parsed[1]), float(parsed[2])
        assert (points >= threshold) is spam  # Exim's own rule
        assert b"STREAMNB_" + label.upper().encode() in reply[parsed.end():]  # $spam_report


def test_sigterm_stops_the_server_with_exit_code_0(servers, tmp_path):
    redis_server, _, _ = servers
    with ServerProcess("spamd", redis_server.url, tmp_path / "spamd.log") as server:
        assert spamc(server, "-K").stdout == b"SPAMD/1.5 0\n"
        assert server.stop(signal.SIGTERM) == 0, server.log()


def test_a_mail_not_scored_gets_69_and_spamc_falls_back(servers, tmp_path):
    """No worker serves model "idle": no verdict within the timeout."""
    redis_server, _, _ = servers
    with ServerProcess("spamd", redis_server.url, tmp_path / "idle.log", "--model", "idle",
                       timeout=0.3) as idle:
        m = mail("spam", 960)
        reply = ask(idle, b"CHECK SPAMC/1.5\r\nContent-length: %d\r\n\r\n%s" % (len(m), m))
        assert reply == b"SPAMD/1.0 69 Service Unavailable: not scored (timeout)\r\n"
        fallback = spamc(idle, "-c", mail_bytes=m)
        assert (fallback.returncode, fallback.stdout) == (0, b"0/0\n")
        passed = spamc(idle, mail_bytes=m)
        assert passed.returncode == 0 and passed.stdout == m  # the mail unchanged


def amavis_spamd_request(raw: bytes, sender: str, recipients: list[str], size: int) -> bytes:
    """What amavis's ``Amavis::SpamControl::SpamdClient`` (amavisd-new 2.13.0, Debian
    bookworm) sends: ``SYMBOLS SPAMC/1.3``, no ``User:``, its pseudo header lines in front
    of the mail (``raw``, CRLF line ends), the Content-length counting both."""
    prefix = (f"Return-Path: {sender}\r\nX-Envelope-To: " + ",\r\n ".join(recipients)
              + f"\r\nX-Amavis-PolicyBank: \r\nX-Amavis-MessageSize: {size}\r\n").encode()
    return b"SYMBOLS SPAMC/1.3\r\nContent-length: %d\r\n\r\n%s%s" % (
        len(prefix) + len(raw), prefix, raw)


def amavis_spamd_parse(reply: bytes) -> tuple[str | None, str, str | None]:
    """The score, verdict and tests amavis's SpamdClient takes from a reply (its parse:
    the status line's code must be 0, ``name: value`` header lines up to a blank line,
    the body's size equal to the Content-length, the score from ``Spam:``)."""
    lines = reply.split(b"\r\n")
    version, code, _ = lines[0].decode().split(None, 2)
    attrs, i = {}, 1
    while lines[i] != b"":
        name, value = re.match(rb"^([^:]*?)[ \t]*:[ \t]*(.*)$", lines[i]).groups()
        attrs[name.decode().lower()] = value.decode()
        i += 1
    assert version.startswith("SPAMD/") and code == "0", lines[0]
    body = b"\r\n".join(lines[i + 1:])
    assert len(body) == int(attrs["content-length"])  # else amavis logs a size mismatch
    spam = re.search(r"(\S+) ; (\S+) / (\S+)", attrs["spam"])
    verdict = "Spam" if attrs["spam"].startswith("True") else (
        "Ham" if attrs["spam"].startswith("False") else "Unknown")
    return (spam[2] if spam else None), verdict, body.decode().splitlines()[-1]


def test_amavis_spamdclient_request_and_its_parse_of_the_answer(servers):
    """amavis's spamd client, replayed byte for byte (no amavis binary): its verdict is
    the workers', its score the points, its tests the symbol."""
    _, tell, _ = servers
    for label, seed in (("spam", 970), ("ham", 971)):
        m = mail(label, seed)
        request = amavis_spamd_request(m, "<sender@example.net>",
                                       ["<a@example.org>", "<b@example.org>"], len(m))
        score, verdict, tests = amavis_spamd_parse(ask(tell, request, half_close=False))
        assert verdict == label.capitalize()
        assert (float(score) > 5.0) is (label == "spam")
        assert tests == "STREAMNB_" + label.upper()
