"""``streamnb milter`` as a process, spoken to over the milter protocol as Postfix does
(benchmarks.milter_client), with a real redis-server and a real worker."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time

import pytest

from benchmarks.milter_client import MilterClient
from streamnb.features.truncate import truncated_size
from streamnb_workers.client.verdicts import format_score, score_of
from streamnb_workers.wire.codec import decode_input
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.milter import (
    K,
    MilterProcess,
    mail,
    start_worker,
    stop,
    train,
    training_mails,
    wait_for,
)
from tests.helpers.redis_server import REDIS_SERVER, RedisServer

pytest.importorskip("Milter", reason="streamnb milter needs pymilter: pip install 'streamnb[milter]'")
pytestmark = [pytest.mark.redis, pytest.mark.slow]

VERDICT, SCORE, ID = "X-Streamnb-Verdict", "X-Streamnb-Score", "X-Streamnb-Id"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A redis-server with model "mail" learnt from 60 mails and a worker serving it."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    logs = tmp_path_factory.mktemp("trained")
    with RedisServer() as server:
        r = server.client()
        worker = start_worker(server.url, r, logs / "worker.log")
        try:
            train(r, training_mails(60))
            yield server
        finally:
            stop(worker)


def _output(r, msg_id):
    """The prediction of ``msg_id`` in ``:out``."""
    outs = [decode_output(f[b"data"]) for _, f in r.xrange(K.out)]
    return next(o for o in outs if o.get("id") == msg_id)


def test_verdict_headers_and_the_reject_policy(trained, tmp_path):
    r = trained.client()
    with MilterProcess(trained.url, tmp_path / "milter.log", "--verdict-action", "spam=reject") as m, \
            MilterClient(m.address) as mta:
        ham = mta.send_mail(mail("ham", 500), queue_id="4XyZ1")
        spam = mta.send_mail(mail("spam", 501), queue_id="4XyZ2")
    assert ham.action == "accept" and ham.reply is None and ham.quarantine is None
    assert ham.header(VERDICT) == "ham"
    msg_id = ham.header(ID)
    assert msg_id.startswith("milter-4XyZ1-")
    out = _output(r, msg_id)  # the header is the worker's prediction, its score the log-odds
    assert out["label"] == "ham"
    assert ham.header(SCORE) == format_score(score_of(out)) and float(ham.header(SCORE)) < 0
    assert spam.action == "reject" and spam.reply == "550 5.7.1 Message rejected as spam"
    assert spam.header(VERDICT) == "spam" and float(spam.header(SCORE)) > 0


def test_quarantine_and_a_reply_of_ones_own(trained, tmp_path):
    with MilterProcess(trained.url, tmp_path / "milter.log", "--verdict-action", "spam=quarantine",
                       "--verdict-action", "ham=reject",
                       "--reject-reply", "554 5.7.0 Not here") as m, MilterClient(m.address) as mta:
        spam = mta.send_mail(mail("spam", 502))
        ham = mta.send_mail(mail("ham", 503))
    assert spam.action == "accept" and spam.quarantine == "streamnb: verdict spam"
    assert spam.header(VERDICT) == "spam"
    assert ham.action == "reject" and ham.reply == "554 5.7.0 Not here"


def test_a_senders_own_streamnb_headers_are_removed(trained, tmp_path):
    raw = mail("spam", 504, extra_headers={"X-Streamnb-Verdict": "ham"})
    raw = raw.replace(b"\r\n\r\n", b"\r\nx-streamnb-verdict: ham\r\nX-Streamnb-Score: -99\r\n\r\n", 1)
    with MilterProcess(trained.url, tmp_path / "milter.log") as m, MilterClient(m.address) as mta:
        result = mta.send_mail(raw)
    # each occurrence removed, the last first (removing one renumbers those after it)
    assert result.changed_headers == [(2, "X-Streamnb-Verdict", ""), (1, "X-Streamnb-Verdict", ""),
                                      (1, "X-Streamnb-Score", "")]
    assert result.header(VERDICT) == "spam"


def test_many_concurrent_sessions(trained, tmp_path):
    results: list[tuple[str, str | None]] = []
    errors: list[BaseException] = []

    def session(n: int, address) -> None:
        try:
            with MilterClient(address) as mta:
                for i in range(5):
                    label = ["spam", "ham"][(n + i) % 2]
                    got = mta.send_mail(mail(label, 600 + 10 * n + i), queue_id=f"Q{n}x{i}")
                    results.append((label, got.header(VERDICT)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with MilterProcess(trained.url, tmp_path / "milter.log", timeout=10.0) as m:
        threads = [threading.Thread(target=session, args=(n, m.address)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors[0]
    assert len(results) == 80
    assert all(want == got for want, got in results), results


def test_a_mail_over_max_size_is_cut_as_produce_cuts_it(trained, tmp_path):
    """Its start, at a line end within --max-size, behind the X-Streamnb-Truncated marker
    with the whole mail's size: the tokenizer then adds defect:truncated."""
    r = trained.client()
    raw = mail("spam", 505, n_words=300_000)  # about 1.7 MB
    assert len(raw) > 1_000_000
    with MilterProcess(trained.url, tmp_path / "milter.log", "--max-size", "65536") as m, \
            MilterClient(m.address) as mta:
        result = mta.send_mail(raw)
    assert result.header(VERDICT) == "spam"
    entry = next(f for _, f in r.xrange(K.input)
                 if decode_input(f[b"data"], "0-0").id == result.header(ID))
    sent = decode_input(entry[b"data"], "0-0").payload
    assert truncated_size(sent) == len(raw) and len(sent) <= 65536
    body = sent.split(b"\r\n", 1)[1]
    assert raw.startswith(body[:200].split(b"\r\n")[0]) and body.endswith(b"\n")


def test_unix_socket_with_its_mode(trained, tmp_path):
    path = tmp_path / "milter.sock"
    with MilterProcess(trained.url, tmp_path / "milter.log", "--socket-mode", "600",
                       listen=f"unix:{path}") as m:
        assert m.address == str(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with MilterClient(str(path)) as mta:
            assert mta.send_mail(mail("ham", 506)).header(VERDICT) == "ham"


def test_sigterm_and_sigint_stop_it_with_exit_0(trained, tmp_path):
    for sig in (signal.SIGTERM, signal.SIGINT):
        m = MilterProcess(trained.url, tmp_path / "milter.log").start()
        with MilterClient(m.address) as mta:
            assert mta.send_mail(mail("ham", 507)).header(VERDICT) == "ham"
        start = time.monotonic()
        assert m.stop(sig) == 0, m.log()
        assert time.monotonic() - start < 10  # libmilter looks for a stop every 5 s
    assert "milter stopped" in m.log()


def test_not_scored_untrained_timeout_redis_down_and_back(tmp_path):
    """Accept with the reason, or tempfail, per --on-failure; scored again once Redis and
    a worker are back."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer(appendfsync="always") as server:
        r = server.client()
        worker = start_worker(server.url, r, tmp_path / "worker.log")
        accept = MilterProcess(server.url, tmp_path / "accept.log", timeout=1.0).start()
        tempfail = MilterProcess(server.url, tmp_path / "tempfail.log", "--on-failure", "tempfail",
                                 timeout=1.0).start()
        try:
            with MilterClient(accept.address) as mta:  # a model that has learnt nothing yet
                assert mta.send_mail(mail("spam", 1)).header(VERDICT) == "not-scored (untrained)"
            train(r, training_mails(40))
            with MilterClient(accept.address) as mta:
                assert mta.send_mail(mail("spam", 2)).header(VERDICT) == "spam"

            assert stop(worker) == 0  # Redis up, nobody to predict: the deadline
            for milter, want in ((accept, "accept"), (tempfail, "tempfail")):
                with MilterClient(milter.address) as mta:
                    start = time.monotonic()
                    result = mta.send_mail(mail("spam", 3))
                    took = time.monotonic() - start
                assert result.action == want and 1.0 <= took < 3.0
            assert result.reply == "451 4.7.1 Message not scored by streamnb, try again later"

            server.stop()  # Redis down: at once
            for milter, want in ((accept, "accept"), (tempfail, "tempfail")):
                with MilterClient(milter.address) as mta:
                    start = time.monotonic()
                    result = mta.send_mail(mail("spam", 4))
                    assert time.monotonic() - start < 0.5
                assert result.action == want
                if want == "accept":
                    assert result.header(VERDICT) == "not-scored (redis-unavailable)"
                    assert result.header(ID) is None  # never sent

            server.start()
            worker = start_worker(server.url, r, tmp_path / "worker2.log", consumer="w2")
            with MilterClient(accept.address) as mta:
                wait_for(lambda: mta.send_mail(mail("spam", 5)).header(VERDICT) == "spam",
                         20, "scoring again")
        finally:
            accept.stop(signal.SIGKILL)
            tempfail.stop(signal.SIGKILL)
            stop(worker)


def test_a_busy_port_is_one_line_and_exit_2(trained, tmp_path):
    import subprocess

    from tests.helpers.workers import PYTHON, ROOT

    busy = trained.port  # redis-server listens there
    proc = subprocess.run([PYTHON, "-m", "streamnb_workers", "milter", "--redis", trained.url,
                           "--model", "mail", "--listen", f"inet:{busy}@127.0.0.1",
                           "--log-level", "WARNING"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == (f"streamnb: error: --listen inet:{busy}@127.0.0.1: cannot listen "
                           "there (Address already in use)\n")


def test_the_benchmark_runs_on_a_few_mails():
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    from benchmarks import milter as bench
    from benchmarks._common import synthetic_mail

    runs = bench.bench_milter(synthetic_mail(60, seed=3), n_train=40, n_mails=20,
                              worker_counts=[1], n_sessions=2)
    assert [(r.system, r.workers, r.sessions, r.mails) for r in runs] == [
        ("streamnb milter", 1, 2, 20), ("streamnb milter", 1, 1, 20)]
    for run in runs:
        assert run.not_scored == 0 and run.right >= 15
        assert len(run.eod) == run.mails and all(0 < e <= w for e, w in zip(run.eod, run.whole,
                                                                            strict=True))
        row = run.row()
        assert row[4] > 0 and row[5] <= row[6]  # mails/s; p50 <= p99


def test_the_scorer_acl_user_is_all_the_milter_needs(tmp_path):
    """Under deploy/redis/users.acl the milter logs in as streamnb-scorer: mail is scored
    and Redis refuses it nothing; a wrong password stops it at start, one line, exit 2."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    from tests.helpers.acl import (
        SCORER_PASSWORD,
        SCORER_USER,
        WORKER_PASSWORD,
        WORKER_USER,
        AclRedis,
        acl_refusals,
        cli,
        one_line_failure,
        start_worker_cli,
        write_acl,
    )

    with AclRedis(write_acl(tmp_path)) as server:
        admin = server.client()
        worker = start_worker_cli(server.url_for(WORKER_USER, WORKER_PASSWORD), "mail", "w1",
                                  tmp_path / "worker.log")
        try:
            wait_for(lambda: admin.hlen(K.workers) == 1, 60, "the worker")
            train(admin, training_mails(40))
            url = server.url_for(SCORER_USER, SCORER_PASSWORD)
            with MilterProcess(url, tmp_path / "milter.log") as m, MilterClient(m.address) as mta:
                assert mta.send_mail(mail("spam", 800)).header(VERDICT) == "spam"
            assert acl_refusals(admin, SCORER_USER) == []
            line = one_line_failure(cli("milter", "--redis", server.url_for(SCORER_USER, "wrong"),
                                        "--model", "mail", "--listen",
                                        f"inet:{m.port}@127.0.0.1"))
            assert line.startswith("streamnb: error: Redis refused the credentials")
        finally:
            stop(worker)
