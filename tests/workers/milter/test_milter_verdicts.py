"""VerdictClient against a real redis-server: each caller gets the prediction of its own
mail, from a stand-in responder and from a real worker; deadlines, Redis down, Redis back."""

from __future__ import annotations

import math
import random
import threading
import time

import pytest

from streamnb_workers.client.produce import send_and_wait
from streamnb_workers.client.verdicts import NotScored, VerdictClient, log_odds
from streamnb_workers.store.connection import RedisSettings
from streamnb_workers.wire.codec import decode_input
from streamnb_workers.wire.outputs import encode_output
from streamnb_workers.wire.replies import as_str
from tests.helpers.milter import K, mail, start_worker, stop, train, training_mails, wait_for

pytestmark = pytest.mark.redis


class Responder:
    """Answers every mail of ``:in`` as a worker would, in shuffled order within each read,
    mixed with predictions of other producers' messages: spam when it is from a spam sender
    (see :func:`_milter_helpers.mail`)."""

    def __init__(self, client, delay: float = 0.0, seed: int = 0) -> None:
        self.client = client
        self.delay = delay
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.answered = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        last = self.start
        while not self.stop_event.is_set():
            reply = self.client.xread({K.input: last}, count=50, block=50)
            for _stream, entries in reply or []:
                last = as_str(entries[-1][0])
                entries = list(entries)
                self.rng.shuffle(entries)
                time.sleep(self.delay)
                pipe = self.client.pipeline(transaction=False)
                for entry_id, fields in entries:
                    msg = decode_input(fields[b"data"], as_str(entry_id))
                    spam = b"From: spam-sender" in msg.payload
                    lp = {"spam": math.log(0.9 if spam else 0.2), "ham": math.log(0.1 if spam else 0.8)}
                    pipe.xadd(K.out, {"data": encode_output(
                        f"other-{self.answered}", "0-1", "ham", {"ham": 0.0}, 1, "fake")})
                    pipe.xadd(K.out, {"data": encode_output(
                        msg.id, as_str(entry_id), "spam" if spam else "ham", lp, 1, "fake")})
                    self.answered += 1
                pipe.execute()

    def __enter__(self) -> Responder:
        # From the last entry now, not "$": a mail sent before its first XREAD counts
        last = self.client.xrevrange(K.input, count=1)
        self.start = as_str(last[0][0]) if last else "0-0"
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(5)


def _client(server, **kw) -> VerdictClient:
    return VerdictClient(RedisSettings(server.url), "mail", block_ms=100, **kw)


def test_concurrent_callers_each_get_the_prediction_of_their_own_mail(redis_server):
    r = redis_server.client()
    results: dict[str, tuple[str, str]] = {}
    errors: list[BaseException] = []

    def caller(n: int) -> None:
        try:
            for i in range(8):
                label = "spam" if (n + i) % 2 else "ham"
                pending = client.submit(mail(label, seed=100 * n + i), hint=f"t{n}")
                out = pending.result(10.0)
                results[pending.id] = (label, out["label"])
                assert out["id"] == pending.id
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with Responder(redis_server.client()) as responder, _client(redis_server) as client:
        threads = [threading.Thread(target=caller, args=(n,)) for n in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors[0]
        assert responder.answered == 96
    assert len(results) == 96
    assert all(want == got for want, got in results.values())
    assert all(i.startswith("mail-t") for i in results)
    assert client.in_flight == 0
    assert r.xlen(K.out) == 192  # half of them other producers' predictions, ignored


def test_no_prediction_within_the_deadline_is_a_timeout(redis_server):
    with _client(redis_server) as client:
        pending = client.submit(mail("ham"))
        start = time.monotonic()
        with pytest.raises(NotScored) as info:
            pending.result(0.3)
        took = time.monotonic() - start
    assert info.value.reason == "timeout"
    assert 0.29 <= took < 1.0
    assert client.in_flight == 0


def test_a_late_prediction_is_dropped_and_the_next_mail_still_answered(redis_server):
    with Responder(redis_server.client(), delay=0.5) as _, _client(redis_server) as client:
        with pytest.raises(NotScored):
            client.submit(mail("spam", 1)).result(0.1)
        pending = client.submit(mail("spam", 2))
        assert pending.result(5.0)["label"] == "spam"
        wait_for(lambda: client.in_flight == 0, 5, "nothing in flight")


def test_redis_down_fails_at_once(redis_server):
    client = _client(redis_server, send_timeout=2.0).start()
    try:
        redis_server.stop()
        start = time.monotonic()
        with pytest.raises(NotScored) as info:
            client.submit(mail("ham"))
        assert info.value.reason == "redis-unavailable"
        assert time.monotonic() - start < 0.5
        assert client.in_flight == 0
    finally:
        client.close()


def test_a_stuck_redis_costs_at_most_the_send_timeout(redis_server):
    import signal

    client = _client(redis_server, send_timeout=0.5).start()
    try:
        client.ping()
        redis_server.signal(signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(NotScored) as info:
            client.submit(mail("ham"))
        took = time.monotonic() - start
        assert info.value.reason == "redis-unavailable"
        assert 0.45 <= took < 1.5
    finally:
        redis_server.signal(signal.SIGCONT)
        client.close()


def test_the_reader_comes_back_with_redis(redis_server):
    client = _client(redis_server).start()
    try:
        with Responder(redis_server.client()):
            assert client.submit(mail("spam")).result(5.0)["label"] == "spam"
        redis_server.restart()  # nothing kept: both streams start again, empty
        with Responder(redis_server.client()):
            start = time.monotonic()
            out = client.submit(mail("spam", 3)).result(10.0)
            assert out["label"] == "spam"
            assert time.monotonic() - start < 5.0
    finally:
        client.close()


def test_close_releases_callers_still_waiting(redis_server):
    client = _client(redis_server).start()
    pending = client.submit(mail("ham"))
    client.close()
    with pytest.raises(NotScored) as info:
        pending.result(1.0)
    assert info.value.reason == "error"


@pytest.mark.slow
def test_predictions_of_a_real_worker_are_those_of_predict(redis_server, tmp_path):
    """The mails go through a real worker; each verdict and score is the one the same mail
    gets through ``streamnb predict`` (send_and_wait), the model being fixed."""
    r = redis_server.client()
    worker = start_worker(redis_server.url, r, tmp_path / "worker.log")
    try:
        train(r, training_mails(60))
        with _client(redis_server) as client:
            for i, label in enumerate(["spam", "ham", "spam", "ham"]):
                raw = mail(label, seed=1000 + i)
                out = client.submit(raw).result(10.0)
                path = tmp_path / f"m{i}.eml"
                path.write_bytes(raw)
                ref = send_and_wait(r, "mail", str(path), timeout=10.0)
                assert out["label"] == ref["label"] == label
                assert log_odds(out["log_proba"]) == pytest.approx(log_odds(ref["log_proba"]),
                                                                   rel=1e-12)
                assert (log_odds(out["log_proba"]) > 0) == (label == "spam")
    finally:
        assert stop(worker) == 0
