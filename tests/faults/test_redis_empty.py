"""Redis shut down without saving (``SHUTDOWN NOSAVE``) and restarted empty under two
running workers: they show Redis down (``streamnb_redis_up`` 0), write the model back
(config, group, the snapshot from a replica) once it answers, serve and learn what is
produced next, and log no traceback; nothing they had learnt is lost."""

from __future__ import annotations

import logging
import time

import pytest
import redis
from _worker_helpers import produce, token_messages

from faults.harness import FCFG, NAME, PARAMS, K, wait_for
from streamnb_workers.replica import load_model

pytestmark = [pytest.mark.slow, pytest.mark.redis]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records():
    handler = _Records()
    root = logging.getLogger("streamnb")
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler.records
    root.removeHandler(handler)
    root.setLevel(old_level)


def _redis_up(threads, consumer: str) -> float | None:
    return threads.registries[consumer].get_sample_value("streamnb_redis_up", {"worker": consumer})


def _lag(threads, consumer: str) -> float | None:
    return threads.registries[consumer].get_sample_value("streamnb_group_lag_entries",
                                                         {"model": NAME})


def test_workers_restore_the_model_and_go_on_after_redis_restarts_empty(
        redis_factory, threads, records):
    from _worker_helpers import assert_same_stats, offline_model

    server = redis_factory()  # no persistence: a restart comes back empty
    r = server.client()
    msgs = token_messages(800, seed=5, labelled_share=0.8)
    before, after = msgs[:500], msgs[500:]
    produce(r, NAME, before)
    a, b = threads.spawn(server.url, "a"), threads.spawn(server.url, "b")
    n_before = sum(1 for m in before if m.get("label"))

    def learnt_before() -> bool:
        try:
            return (r.xlen(K.out) >= len(before)
                    and load_model(r, NAME)[0].stats["classes"].total == n_before)
        except LookupError:  # no config yet
            return False
    wait_for(learnt_before, 30, "the first messages learnt")
    wait_for(lambda: any(_lag(threads, c) is not None for c in "ab"), 10, "a lag gauge sampled")
    assert {_redis_up(threads, c) for c in "ab"} == {1.0}

    try:
        r.shutdown(nosave=True)
    except redis.ConnectionError:
        pass
    server.proc.wait(10)
    wait_for(lambda: {_redis_up(threads, c) for c in "ab"} == {0.0}, 10, "redis_up 0 on both")
    assert all(_lag(threads, c) is None for c in "ab"), "a lag read from Redis served while down"
    time.sleep(1.0)
    server.start()
    t0 = time.monotonic()
    r = server.client()
    produce(r, NAME, after)

    reference = offline_model("multinomial", PARAMS, FCFG, msgs)
    n_all = sum(1 for m in msgs if m.get("label"))

    def served_and_learnt() -> bool:
        try:
            return (r.xlen(K.out) >= len(after)
                    and load_model(r, NAME)[0].stats["classes"].total == n_all)
        except LookupError:
            return False
    wait_for(served_and_learnt, 30, "the messages after the restart served and learnt")
    assert time.monotonic() - t0 < 30
    assert {_redis_up(threads, c) for c in "ab"} == {1.0}
    model, version = load_model(r, NAME)
    assert_same_stats(model, reference)  # nothing learnt before the restart was lost
    wait_for(lambda: {a.models[NAME].replica.version, b.models[NAME].replica.version} == {version},
             10, "both replicas at the log's last entry")
    for w in (a, b):
        assert_same_stats(w.models[NAME].replica.model, reference)
    restores = sum(threads.metric(c, "redis_restores") for c in "ab")
    assert restores >= 1
    assert sum(threads.metric(c, "redis_errors", kind="nogroup") for c in "ab") <= 2
    threads.stop_all()
    tracebacks = [rec for rec in records if rec.exc_info]
    assert not tracebacks, [rec.getMessage() for rec in tracebacks]
    assert not [rec for rec in records if rec.levelno >= logging.ERROR]
    restored = [rec.getMessage() for rec in records if "wrote" in rec.getMessage()
                and "back" in rec.getMessage()]
    assert 1 <= len(restored) <= 4, restored  # at most config+snapshot, then group, per worker
