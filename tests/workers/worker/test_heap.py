"""workers/worker/heap.py: when the worker hands freed heap memory back, and that it does."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import fakeredis
import msgpack
import pytest

from streamnb_workers.store.connection import ClientConnector
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.worker import Worker, WorkerOptions, heap
from streamnb_workers.worker.heap import HeapTrimmer

ROOT = Path(__file__).resolve().parents[3]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def trims(monkeypatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(heap, "_TRIM", lambda pad: calls.append(pad) or 1)
    return calls


def test_trims_once_when_idle_after_work(trims):
    t = HeapTrimmer(interval_s=60.0, clock=Clock())
    assert [t.after_step(0), t.after_step(0)] == [False, False]  # idle from the start
    assert t.after_step(3) is False and trims == []
    assert t.after_step(0) is True and trims == [0]
    assert [t.after_step(0), t.after_step(0)] == [False, False] and trims == [0]


def test_trims_every_interval_under_load(trims):
    clock = Clock()
    t = HeapTrimmer(interval_s=60.0, clock=clock)
    busy = []
    for second in range(0, 181, 10):
        clock.now = float(second)
        busy.append(t.after_step(100))
    assert busy.count(True) == 3 and len(trims) == 3  # at 60, 120 and 180 s
    assert t.after_step(0) is False  # the trim at 180 s was the last step's
    clock.now = 185.0
    assert t.after_step(5) is False
    assert t.after_step(0) is True  # work since the last trim: trimmed when idle


def test_zero_interval_trims_only_when_idle(trims):
    clock = Clock()
    t = HeapTrimmer(interval_s=0.0, clock=clock)
    for second in range(1000):
        clock.now = float(second)
        assert t.after_step(10) is False
    assert t.after_step(0) is True and trims == [0]


def test_without_malloc_trim_nothing_happens(monkeypatch):
    monkeypatch.setattr(heap, "_TRIM", None)
    t = HeapTrimmer()
    t.after_step(1)
    assert t.after_step(0) is False


def test_negative_interval_is_refused():
    with pytest.raises(ValueError, match="release_memory_s must be >= 0, got -1"):
        WorkerOptions(release_memory_s=-1)


def test_worker_trims_when_it_goes_idle(trims):
    r = fakeredis.FakeRedis()
    w = Worker(ClientConnector(r), [ModelSpec("doc", kind="multinomial",
                                              featurizer_config={"bits": 8})],
               WorkerOptions(consumer="w1"))
    for text in ("cheap meds", "meeting notes"):
        r.xadd("streamnb:{doc}:in", {"data": msgpack.packb({"text": text, "label": "x"})})
    w.run_until_idle()
    assert trims == [0]  # the empty read after the batch
    w.step(block_ms=1)
    assert trims == [0]  # nothing freed since


@pytest.mark.skipif(heap._TRIM is None, reason="needs glibc's malloc_trim")
def test_trim_returns_freed_heap_pages():
    # 100 MB in 100 kB blocks (below the mmap threshold: from the heap), all freed but the
    # last, which pins the top of the heap: free() cannot give the pages back, trim() does.
    code = textwrap.dedent("""
        import os
        from streamnb_workers.worker.heap import HeapTrimmer

        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

        blocks = [b"x" * 100_000 for _ in range(1000)]
        last = blocks[-1]
        del blocks
        before = rss()
        assert HeapTrimmer().trim()
        print(before - rss())
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert int(out.stdout) > 80_000_000
