"""Fixtures and checks shared by the fault tests (real redis-server, worker processes/threads).

Every fault test ends with :func:`check_guarantees`: learnt counts equal the labelled
messages exactly, every input has a prediction or a dead letter, every worker is at the
log's last version, and the statistics (snapshot + log, and each in-process replica) equal
an offline fit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prometheus_client import CollectorRegistry

from streamnb.encoding import loads
from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.replication.shards import Router, route_id
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import parse_id
from streamnb_workers.worker import Worker, WorkerOptions
from tests.helpers.redis_server import REDIS_SERVER, RedisServer
from tests.helpers.workers import (
    FCFG,
    PARAMS,
    all_done,
    assert_same_stats,
    count_spec,
    learnt_model,
    offline_model,
    spawn_worker,
    url_worker,
)

NAME = "mail"
K = ModelKeys(NAME)
#: Options of the worker processes/threads: short timeouts so faults resolve in seconds.
#: ``:in`` is not trimmed: the guarantees are checked against every input entry, read back
#: at the end (its trim is tested in tests/workers/worker/test_bounded_streams.py).
FAST = {"batch": 25, "block_ms": 50, "heartbeat_s": 0.2, "claim_idle_ms": 1000,
        "lease_ms": 1500, "snapshot_every": 25, "snapshot_interval_s": 1.0, "trim_margin_ms": 0,
        "backoff_base_s": 0.05, "backoff_cap_s": 0.5, "stale_s": 3.0, "input_trim_s": 0}
#: Every GARBAGE_EVERY-th input is not msgpack at all: it must end in :dead.
GARBAGE_EVERY = 97


def wait_for(cond: Callable[[], bool], timeout: float = 60.0, what: str = "condition",
             poll: float = 0.05, state: Callable[[], str] | None = None) -> None:
    """Poll ``cond`` until true; on timeout fail with ``what`` and, if given, ``state()``
    (what the streams and workers were doing: a failure in CI then says what was stuck)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            detail = ""
            if state is not None:
                try:
                    detail = f" ({state()})"
                except Exception as exc:  # noqa: BLE001 - Redis may be the thing that is down
                    detail = f" (state unreadable: {exc!r})"
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(poll)


# ---------------------------------------------------------------------- input
#: What a garbage entry's ``data`` holds (not msgpack).
GARBAGE = b"\xc1not msgpack"


def wire_data(i: int, message: dict[str, Any]) -> bytes | None:
    """What the producer sends at position ``i``: ``message`` as msgpack, or None where a
    garbage entry goes instead (every GARBAGE_EVERY-th position)."""
    return None if i % GARBAGE_EVERY == GARBAGE_EVERY - 1 else \
        msgpack.packb(message, use_bin_type=True)


def produce_mixed(client: Any, messages: list[dict[str, Any]], start: int = 0) -> list[str]:
    """XADD ``messages`` (and a garbage entry every GARBAGE_EVERY-th position, counted
    from ``start``); returns the entry ids in order."""
    pipe = client.pipeline(transaction=False)
    for i, m in enumerate(messages, start):
        pipe.xadd(K.input, {"data": wire_data(i, m) or GARBAGE})
    return [as_str(v) for v in pipe.execute()]


def produce_routed(client: Any, router: Router, messages: list[dict[str, Any]],
                   start: int = 0) -> list[tuple[str, str]]:
    """:func:`produce_mixed` for a model of shards: each entry XADDed to the ``:in`` of
    its shard (``router``: by its ``ref`` or ``id``, a garbage entry in turn), one
    pipeline per shard; returns ``(input key, entry id)`` in order."""
    keys = [router.keys_for(None if wire_data(i, m) is None else route_id(m)).input
            for i, m in enumerate(messages, start)]
    placed: list[tuple[str, str] | None] = [None] * len(messages)
    for key in dict.fromkeys(keys):
        at = [n for n, k in enumerate(keys) if k == key]
        pipe = client.pipeline(transaction=False)
        for n in at:
            pipe.xadd(key, {"data": wire_data(start + n, messages[n]) or GARBAGE})
        for n, entry in zip(at, pipe.execute(), strict=True):
            placed[n] = (key, as_str(entry))
    return placed  # type: ignore[return-value]


def garbage_positions(n: int) -> set[int]:
    return {i for i in range(n) if i % GARBAGE_EVERY == GARBAGE_EVERY - 1}


class StreamFeeder:
    """Produces messages in chunks from a thread, so faults hit a stream in progress."""

    def __init__(self, client: Any, messages: list[dict[str, Any]], chunk: int = 50,
                 pause_s: float = 0.05) -> None:
        self.client, self.messages, self.chunk, self.pause_s = client, messages, chunk, pause_s
        self.sent = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="feeder")

    def start(self) -> StreamFeeder:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while self.sent < len(self.messages):
                part = self.messages[self.sent:self.sent + self.chunk]
                try:
                    produce_mixed(self.client, part, self.sent)
                except Exception:  # noqa: BLE001 - Redis may be down for a moment: retry
                    time.sleep(0.1)
                    continue
                self.sent += len(part)
                time.sleep(self.pause_s)
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def join(self, timeout: float = 60.0) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the feeder did not finish"
        assert self.error is None, self.error


# ---------------------------------------------------------------------- workers
class WorkerProcesses:
    """``python -m streamnb_workers.worker`` children; every one still alive is killed at teardown."""

    def __init__(self, url: str, log_dir: Path, options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.log_dir = log_dir
        self.options = dict(FAST, **(options or {}))
        self.procs: dict[str, subprocess.Popen] = {}
        self.started = 0

    def spawn(self, consumer: str) -> subprocess.Popen:
        self.started += 1
        p = spawn_worker(self.url, count_spec(NAME), dict(self.options, consumer=consumer),
                         self.log_dir / f"{consumer}.log")
        self.procs[consumer] = p
        return p

    def kill(self, consumer: str, sig: int = signal.SIGKILL) -> int:
        p = self.procs.pop(consumer)
        p.send_signal(sig)
        return p.wait(20)

    def stop_all(self) -> dict[str, int]:
        """Warm shutdown (SIGTERM) of every live worker; their exit codes."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {c: p.wait(30) for c, p in self.procs.items()}
        self.procs.clear()
        return codes

    def logs(self) -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}"
                         for f in sorted(self.log_dir.glob("*.log")))

    def cleanup(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait(10)
        self.procs.clear()


class WorkerThreads:
    """Workers running :meth:`Worker.run` in threads of the test process, each with its
    own metrics registry, so a test can read their replicas and counters."""

    def __init__(self) -> None:
        self.workers: dict[str, Worker] = {}
        self.registries: dict[str, CollectorRegistry] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.errors: list[BaseException] = []

    def spawn(self, url: str, consumer: str, cluster: bool = False, spec: ModelSpec | None = None,
              **options: Any) -> Worker:
        """Start worker ``consumer`` on model ``spec`` (default: the count model ``mail``)."""
        reg = CollectorRegistry()
        w = url_worker(url, [spec or count_spec(NAME)],
                       WorkerOptions(**dict(FAST, consumer=consumer, **options)), Metrics(reg),
                       cluster=cluster)
        self.workers[consumer], self.registries[consumer] = w, reg
        t = threading.Thread(target=self._run, args=(w,), daemon=True, name=f"worker-{consumer}")
        self.threads[consumer] = t
        t.start()
        return w

    def _run(self, w: Worker) -> None:
        try:
            w.run(install_signals=False)
        except BaseException as exc:  # noqa: BLE001 - reported by stop_all()
            self.errors.append(exc)

    def metric(self, consumer: str, name: str, model: str = NAME, **labels: str) -> float:
        v = self.registries[consumer].get_sample_value(
            f"streamnb_{name}_total", {"model": model, "worker": consumer, **labels})
        return float(v or 0.0)

    def metric_sum(self, consumer: str, name: str) -> float:
        """``streamnb_<name>_total`` of ``consumer``, summed over its other labels."""
        return sum(sample.value for family in self.registries[consumer].collect()
                   for sample in family.samples if sample.name == f"streamnb_{name}_total")

    def describe(self) -> str:
        """Each worker: alive or not, its replica's version and reloads, its Redis and
        other errors, commit conflicts and where it spends its time (:meth:`where`), and
        the errors that ended a thread."""
        out = []
        where = self.where()
        for c, w in self.workers.items():
            rts = list(w.models.values())
            rep = rts[0].replica if rts else None
            errors = self.metric_sum(c, "redis_errors")
            out.append(f"{c}: {'alive' if self.threads[c].is_alive() else 'dead'}, "
                       f"version {rep.version if rep else '-'}, "
                       f"reloads {rep.reloads if rep else '-'}, redis errors {errors:.0f}, "
                       f"other errors {self.metric(c, 'worker_errors'):.0f}, "
                       f"conflicts {self.metric(c, 'commit_conflicts'):.0f}, "
                       f"mostly at {where.get(c, '-')}")
        if self.errors:
            out.append(f"thread errors {self.errors!r}")
        return "; ".join(out)

    def where(self, samples: int = 20, every_s: float = 0.05) -> dict[str, str]:
        """Where each live worker thread spends its time: its stack sampled ``samples``
        times, the most frequent innermost frames of the package (workers/, streamnb/),
        three levels, with how often (a stuck worker shows where it is stuck)."""
        idents = {t.ident: c for c, t in self.threads.items() if t.is_alive()}
        seen: dict[str, Counter] = {c: Counter() for c in idents.values()}
        for _ in range(samples):
            frames = sys._current_frames()
            for ident, c in idents.items():
                if ident not in frames:
                    continue
                ours = [f for f in traceback.extract_stack(frames[ident])
                        if f"{os.sep}workers{os.sep}" in f.filename
                        or f"{os.sep}streamnb{os.sep}" in f.filename]
                seen[c][" < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                   for f in reversed(ours[-3:]))] += 1
            time.sleep(every_s)
        return {c: (f"{top[0][0]} ({top[0][1]}/{samples})" if (top := n.most_common(1)) else "-")
                for c, n in seen.items()}

    def stop_all(self, timeout: float = 30.0) -> None:
        for w in self.workers.values():
            w.request_stop()
        for c, t in self.threads.items():
            t.join(timeout)
            assert not t.is_alive(), f"worker thread {c} did not stop"
        assert not self.errors, self.errors

    def cleanup(self) -> None:
        for w in self.workers.values():
            w.request_stop()
        for t in self.threads.values():
            t.join(10)


@pytest.fixture
def redis_factory() -> Iterator[Callable[..., RedisServer]]:
    """Start real redis-servers (``appendfsync`` etc. as RedisServer takes); all are
    killed and their directories removed at teardown, even on failure."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    servers: list[RedisServer] = []

    def make(**kw: Any) -> RedisServer:
        s = RedisServer(**kw)
        servers.append(s)
        return s.start()

    yield make
    for s in servers:
        s.__exit__(None, None, None)


@pytest.fixture
def redis_server(redis_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_factory()


@pytest.fixture
def procs(redis_server: RedisServer, tmp_path: Path) -> Iterator[WorkerProcesses]:
    wp = WorkerProcesses(redis_server.url, tmp_path)
    yield wp
    wp.cleanup()


@pytest.fixture
def threads() -> Iterator[WorkerThreads]:
    wt = WorkerThreads()
    yield wt
    wt.cleanup()


# ---------------------------------------------------------------------- checks
def stream_state(client: Any, threads: WorkerThreads | None = None, keys: ModelKeys = K) -> str:
    """One line: the input's last id and the group's delivery mark, pending entries per
    consumer, the log's last id and the snapshot's (of ``keys``' model), and each worker
    thread's state."""
    last = client.xrevrange(keys.input, count=1)
    g = next((g for g in client.xinfo_groups(keys.input) if as_str(g["name"]) == GROUP), {})
    pend = client.xpending(keys.input, GROUP)
    per = ",".join(f"{as_str(c['name'])}:{c['pending']}" for c in pend.get("consumers") or [])
    snap = client.hget(keys.snapshot, "log_id")
    parts = [f"in last {as_str(last[0][0]) if last else '-'}",
             f"delivered to {as_str(g.get('last-delivered-id', '-'))}",
             f"pending {pend['pending']} [{per}]",
             f"log last {last_log_id(client, keys)}", f"snapshot {as_str(snap) if snap else '-'}"]
    if threads is not None:
        parts.append(threads.describe())
    return "; ".join(parts)


def wait_all_done(client: Any, n_inputs: int, timeout: float, what: str,
                  threads: WorkerThreads | None = None) -> None:
    """Wait until :func:`all_done`; on timeout the message says where things stood
    (:func:`stream_state`)."""
    wait_for(lambda: all_done(client, n_inputs), timeout, what,
             state=lambda: stream_state(client, threads))


def drained(client: Any, n: int, keys: ModelKeys = K) -> bool:
    """Every one of ``n`` inputs of ``keys.input`` delivered and acknowledged, read one by
    one (a cluster pipeline returns XINFO GROUPS unparsed): the delivery mark first, then
    the pending count, so a batch read in between still shows as pending."""
    last = client.xrevrange(keys.input, count=1)
    groups = {as_str(g["name"]): g for g in client.xinfo_groups(keys.input)}
    if client.xlen(keys.input) < n or not last or GROUP not in groups:
        return False
    delivered = parse_id(groups[GROUP]["last-delivered-id"]) >= parse_id(last[0][0])
    return delivered and int(client.xpending(keys.input, GROUP)["pending"]) == 0


def last_log_id(client: Any, keys: ModelKeys = K) -> str:
    last = client.xrevrange(keys.log, count=1)
    return as_str(last[0][0]) if last else "0-0"


def heartbeat_versions(client: Any, consumers: list[str]) -> dict[str, str]:
    hbs = {as_str(k): loads(v) for k, v in client.hgetall(K.workers).items()}
    return {c: str(hbs[c]["version"]) if c in hbs else "?" for c in consumers}


def wait_converged(client: Any, consumers: list[str], timeout: float = 20.0) -> str:
    """Wait until every named (live, process) worker reports the log's last id as its
    version in its heartbeat; returns that version."""
    def same() -> bool:
        return set(heartbeat_versions(client, consumers).values()) == {last_log_id(client)}

    try:
        wait_for(same, timeout, "all workers at the log's last version")
    except AssertionError:
        raise AssertionError(f"versions {heartbeat_versions(client, consumers)}, "
                             f"log at {last_log_id(client)}") from None
    return last_log_id(client)


def check_guarantees(client: Any, messages: list[dict[str, Any]], entry_ids: list[str],
                     replicas: list[Any] = (), name: str = NAME,
                     garbage: set[int] | None = None) -> None:
    """The four guarantees of every fault test (see the module docstring), for the model
    (or one shard of a model) ``name``: ``messages`` are what was sent to its ``:in``,
    ``entry_ids`` their entries, ``garbage`` the positions where garbage went instead
    (default: :func:`garbage_positions`)."""
    keys = ModelKeys(name)
    garbage = garbage_positions(len(messages)) if garbage is None else garbage
    good = [m for i, m in enumerate(messages) if i not in garbage]
    n_labelled = sum(1 for m in good if m.get("label") is not None)
    # 1. learnt counts equal the labelled messages exactly
    learnt = int(client.get(keys.learnt) or 0)
    assert learnt == n_labelled, (
        f"{name}: learnt {learnt}, labelled {n_labelled}; dead letters by reason: "
        f"{Counter(decode_output(f[b'data'])['reason'] for _, f in client.xrange(keys.dead))}")
    # 2. every input has at least one prediction or dead-letter entry
    out = {decode_output(f[b"data"])["entry"] for _, f in client.xrange(keys.out)}
    dead = {decode_output(f[b"data"])["entry"] for _, f in client.xrange(keys.dead)}
    missing = [e for e in entry_ids if e not in out and e not in dead]
    assert not missing, f"{name}: {len(missing)} inputs have neither a prediction nor a dead letter"
    assert {entry_ids[i] for i in garbage} <= dead
    # 3 + 4. the stored statistics and every replica given equal an offline fit, at the
    # log's last version
    reference = offline_model("multinomial", PARAMS, FCFG, good)
    model, version = learnt_model(client, name)
    assert version == last_log_id(client, keys)
    assert_same_stats(model, reference)
    for rep in replicas:
        assert rep.version == version, f"replica at {rep.version}, log at {version}"
        assert_same_stats(rep.model, reference)
