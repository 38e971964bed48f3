"""Redis shut down without saving (``SHUTDOWN NOSAVE``) and restarted empty under two
running workers: they show Redis down (``streamnb_redis_up`` 0), write the model back
(config, group, the snapshot from a replica) once it answers, serve and learn what is
produced next, and log no traceback; nothing they had learnt is lost."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from streamnb_workers.replication.shards import load_model
from tests.faults.harness import FCFG, NAME, PARAMS, K, wait_for
from tests.helpers.workers import produce, token_messages

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
    loggers = [logging.getLogger(), logging.getLogger("streamnb")]  # streamnb_workers.*: root
    levels = [lg.level for lg in loggers]
    loggers[0].addHandler(handler)
    for lg in loggers:
        lg.setLevel(logging.INFO)
    yield handler.records
    loggers[0].removeHandler(handler)
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)


def _redis_up(threads, consumer: str) -> float | None:
    return threads.registries[consumer].get_sample_value("streamnb_redis_up", {"worker": consumer})


def _lag(threads, consumer: str) -> float | None:
    return threads.registries[consumer].get_sample_value("streamnb_group_lag_entries",
                                                         {"model": NAME})


def test_workers_restore_the_model_and_go_on_after_redis_restarts_empty(
        redis_factory, threads, records):
    from tests.helpers.workers import assert_same_stats, offline_model

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


def test_worker_processes_with_default_timings_come_back_within_30s(redis_factory, tmp_path):
    """The acceptance run: two ``streamnb worker`` processes with the default backoff and
    heartbeat, Redis shut down without saving and started empty."""
    from tests.helpers.acl import cli_env, start_worker_cli, stop
    from tests.helpers.http import get, sample
    from tests.helpers.redis_server import free_port

    server = redis_factory()
    r = server.client()
    ports = {c: free_port() for c in ("p1", "p2")}
    logs = {c: tmp_path / f"{c}.log" for c in ports}
    # error weight 1: the class weights count the messages learnt
    procs = [start_worker_cli(server.url, "acc", c, logs[c], "--metrics-port", str(ports[c]),
                              "--error-weight", "1", env=cli_env()) for c in ports]
    keys = type(K)("acc")
    msgs = token_messages(300, seed=9, labelled_share=1.0)

    def up(c: str) -> float | None:
        return sample(get(ports[c], "/metrics")[1], "streamnb_redis_up", worker=c)

    def learnt() -> float:
        try:
            return load_model(r, "acc")[0].stats["classes"].total
        except (LookupError, redis.RedisError):
            return -1.0
    try:
        wait_for(lambda: all(up(c) == 1.0 for c in ports), 30, "both workers up")
        produce(r, "acc", msgs[:200])
        wait_for(lambda: learnt() == 200 and r.xlen(keys.out) == 200, 60, "the first 200 learnt")
        time.sleep(1.0)  # let the other worker apply the last log entries
        try:
            r.shutdown(nosave=True)
        except redis.ConnectionError:
            pass
        server.proc.wait(10)
        wait_for(lambda: all(up(c) == 0.0 for c in ports), 20, "redis_up 0 on both")
        server.start()
        t0 = time.monotonic()
        r = server.client()
        produce(r, "acc", msgs[200:])  # a pipeline that goes on at once (no --allow-new check)
        wait_for(lambda: learnt() == 300 and r.xlen(keys.out) == 100, 30,
                 "the 100 after the restart served and learnt, the 200 before kept")
        took = time.monotonic() - t0
        assert took < 30
        assert all(up(c) == 1.0 for c in ports)
        print(f"served and learnt again {took:.1f} s after Redis came back empty")
    finally:
        codes = stop(procs)
    text = "".join(log.read_text(errors="replace") for log in logs.values())
    assert codes == [0, 0], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert text.count("NOGROUP") <= 2, "a NOGROUP loop"  # at most one line per worker
    assert "wrote back its" in text and "from this worker" in text
