"""``streamnb milter`` behind a real Postfix: mail sent over SMTP is delivered with the
verdict headers, spam is rejected or held as the policy says, and with Redis stopped mail
is still delivered (not scored) or tempfailed within the deadline.

Needs Postfix (Debian package postfix), root, pymilter and redis-server; skipped
otherwise. The Postfix instance is private (benchmarks/postfix_instance.py) and stopped whatever
happens."""

from __future__ import annotations

import email
import signal
import smtplib

import pytest

from benchmarks.postfix_instance import PostfixInstance, unavailable
from tests.helpers.milter import (
    MilterProcess,
    mail,
    start_worker,
    stop,
    train,
    training_mails,
    wait_for,
)
from tests.helpers.redis_server import REDIS_SERVER, RedisServer, free_port

pytest.importorskip("Milter", reason="streamnb milter needs pymilter: pip install 'streamnb[milter]'")
if unavailable() is not None:
    pytest.skip(unavailable(), allow_module_level=True)
pytestmark = [pytest.mark.redis, pytest.mark.slow]

#: The milter's deadline in these tests, seconds.
DEADLINE = 2.0


class Setup:
    """Redis (kept on disk, so it can be stopped and started), a trained worker, the milter
    and Postfix; :meth:`milter_with` restarts the milter with other options."""

    def __init__(self, tmp) -> None:
        self.tmp = tmp
        self.redis = RedisServer(appendfsync="always").start()
        self.r = self.redis.client()
        self.worker = start_worker(self.redis.url, self.r, tmp / "worker.log")
        train(self.r, training_mails(60))
        self.milter_port = free_port()
        self.milter: MilterProcess | None = None
        self.milter_with("--verdict-action", "spam=reject")
        self.postfix = PostfixInstance(free_port(), f"inet:127.0.0.1:{self.milter_port}").start()

    def milter_with(self, *args: str) -> MilterProcess:
        if self.milter is not None:
            self.milter.stop(signal.SIGKILL)
        self.milter = MilterProcess(self.redis.url, self.tmp / "milter.log", *args,
                                    port=self.milter_port, timeout=DEADLINE).start()
        return self.milter

    def close(self) -> None:
        try:
            self.postfix.stop()
        finally:
            if self.milter is not None:
                self.milter.stop(signal.SIGKILL)
            stop(self.worker)
            self.redis.__exit__()

    def delivery(self, raw: bytes, n_before: int) -> email.message.Message:
        """The mailbox's newest message once ``raw`` has arrived after ``n_before`` others."""
        wait_for(lambda: len(self.postfix.delivered()) > n_before, 30,
                 f"delivery (Postfix log: {self.postfix.log()[-2000:]})")
        got = email.message_from_bytes(self.postfix.delivered()[-1])
        assert got["Subject"] == email.message_from_bytes(raw)["Subject"]
        return got


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    s = Setup(tmp_path_factory.mktemp("postfix"))
    try:
        yield s
    finally:
        s.close()


def test_ham_is_delivered_with_the_verdict_headers(setup):
    n = len(setup.postfix.delivered())
    raw = mail("ham", 700)
    setup.postfix.send(raw)
    got = setup.delivery(raw, n)
    assert got["X-Streamnb-Verdict"] == "ham"
    assert float(got["X-Streamnb-Score"]) < 0
    assert got["X-Streamnb-Id"].startswith("milter-")
    assert got["Delivered-To"] == "box@streamnb.test"


def test_spam_is_rejected_when_the_policy_says_so(setup):
    n = len(setup.postfix.delivered())
    with pytest.raises(smtplib.SMTPDataError) as info:
        setup.postfix.send(mail("spam", 701))
    assert info.value.smtp_code == 550
    assert info.value.smtp_error == b"5.7.1 Message rejected as spam"
    assert "milter-reject: END-OF-MESSAGE" in setup.postfix.log()
    assert len(setup.postfix.delivered()) == n


def test_a_forged_verdict_is_replaced(setup):
    n = len(setup.postfix.delivered())
    raw = mail("ham", 702, extra_headers={"X-Streamnb-Verdict": "spam", "X-Streamnb-Score": "99"})
    setup.postfix.send(raw)
    got = setup.delivery(raw, n)
    assert got.get_all("X-Streamnb-Verdict") == ["ham"]
    assert len(got.get_all("X-Streamnb-Score")) == 1 and float(got["X-Streamnb-Score"]) < 0


def test_spam_is_held_when_the_policy_quarantines(setup):
    try:
        setup.milter_with("--verdict-action", "spam=quarantine")
        held, n = setup.postfix.held(), len(setup.postfix.delivered())
        setup.postfix.send(mail("spam", 703))
        wait_for(lambda: setup.postfix.held() == held + 1, 30, "the hold queue")
        assert len(setup.postfix.delivered()) == n
    finally:
        setup.milter_with("--verdict-action", "spam=reject")


def test_with_redis_stopped_mail_is_delivered_not_scored_or_tempfailed(setup):
    setup.redis.stop()
    try:
        n = len(setup.postfix.delivered())
        raw = mail("spam", 704)
        took = setup.postfix.send(raw)
        got = setup.delivery(raw, n)
        assert got["X-Streamnb-Verdict"] == "not-scored (redis-unavailable)"
        assert got["X-Streamnb-Score"] is None
        assert took < DEADLINE

        setup.milter_with("--verdict-action", "spam=reject", "--on-failure", "tempfail")
        with pytest.raises(smtplib.SMTPDataError) as info:
            setup.postfix.send(mail("ham", 705))
        assert info.value.smtp_code == 451
        assert info.value.smtp_error == b"4.7.1 Message not scored by streamnb, try again later"
        assert len(setup.postfix.delivered()) == n + 1
    finally:
        setup.redis.start()
        setup.milter_with("--verdict-action", "spam=reject")
    seeds = iter(range(706, 800))

    def scored_again() -> bool:  # once the worker is back too
        n, raw = len(setup.postfix.delivered()), mail("ham", next(seeds))
        setup.postfix.send(raw)
        return setup.delivery(raw, n)["X-Streamnb-Verdict"] == "ham"

    wait_for(scored_again, 60, "mail scored again")


def test_with_no_worker_mail_waits_the_deadline_then_goes_unscored(setup):
    assert stop(setup.worker) == 0
    try:
        n = len(setup.postfix.delivered())
        raw = mail("spam", 707)
        took = setup.postfix.send(raw)
        got = setup.delivery(raw, n)
        assert got["X-Streamnb-Verdict"] == "not-scored (timeout)"
        assert DEADLINE <= took < DEADLINE + 2.0
    finally:
        setup.worker = start_worker(setup.redis.url, setup.r, setup.tmp / "worker2.log",
                                    consumer="w2")
