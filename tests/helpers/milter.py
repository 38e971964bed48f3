"""Helpers of the milter tests: mails of two classes, a trained worker, a milter process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import numpy as np

from streamnb_workers.cli.launch import blas_env
from streamnb_workers.store.keys import ModelKeys
from tests.helpers.redis_server import free_port
from tests.helpers.workers import COMMON, PYTHON, ROOT, VOCAB, all_done, count_spec, spawn_worker

K = ModelKeys("mail")
#: Worker options of these tests: small batches, short blocks, quick heartbeats; ``:in``
#: kept whole, as some tests read back the entry a mail was sent as.
WORKER_OPTIONS = {"batch": 20, "block_ms": 50, "heartbeat_s": 0.3, "claim_idle_ms": 800,
                  "input_trim_s": 0}


def mail(label: str, seed: int = 0, n_words: int = 30, extra_headers: dict | None = None) -> bytes:
    """An RFC 822 mail whose subject and body are words of ``label``'s vocabulary."""
    rng = np.random.default_rng(seed)
    words = [str(w) for w in rng.choice(VOCAB[label], size=n_words)]
    words += [str(w) for w in rng.choice(COMMON, size=4)]
    m = EmailMessage()
    m["From"] = f"{label}-sender-{seed}@example.org"
    m["To"] = "box@streamnb.test"
    m["Subject"] = " ".join(words[:4])
    for name, value in (extra_headers or {}).items():
        m[name] = value
    m.set_content("".join(" ".join(words[i:i + 10]) + "\n" for i in range(0, len(words), 10)))
    return m.as_bytes(policy=m.policy.clone(linesep="\r\n"))


def training_mails(n: int = 60, seed: int = 100) -> list[tuple[bytes, str]]:
    """``n`` labelled mails, spam and ham alternating."""
    return [(mail(label, seed + i), label) for i, label in
            zip(range(n), ["spam", "ham"] * n, strict=False)]


def train(client: Any, mails: list[tuple[bytes, str]], timeout: float = 60.0) -> None:
    """Send labelled raw mails to ``:in`` and wait until a worker has learnt them all."""
    import msgpack

    pipe = client.pipeline(transaction=False)
    for i, (raw, label) in enumerate(mails):
        pipe.xadd(K.input, {"data": msgpack.packb({"id": f"train-{i}", "raw": raw, "label": label},
                                                  use_bin_type=True)})
    pipe.execute()
    wait_for(lambda: all_done(client, len(mails)), timeout, "the worker to learn the mails")


def start_worker(url: str, client: Any, log_path: Path, consumer: str = "w1",
                 **options: Any) -> subprocess.Popen:
    """A worker of model "mail" in its own process (``options`` over
    :data:`WORKER_OPTIONS`), once it has registered."""
    before = client.hlen(K.workers)
    proc = spawn_worker(url, count_spec("mail"), dict(WORKER_OPTIONS, consumer=consumer, **options),
                        log_path)
    wait_for(lambda: client.hlen(K.workers) > before or proc.poll() is not None, 60, "the worker")
    assert proc.poll() is None, log_path.read_text()
    return proc


def wait_for(cond: Any, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
    """Signal ``proc`` and wait for it (SIGKILL if it does not end in ``timeout``)."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def _connectable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class MilterProcess:
    """``streamnb milter`` in a child process on a free port (or ``listen``); a context
    manager that kills it on the way out."""

    def __init__(self, url: str, log_path: Path, *args: str, port: int | None = None,
                 listen: str | None = None, timeout: float = 2.0) -> None:
        self.port = port or free_port()
        self.listen = listen or f"inet:{self.port}@127.0.0.1"
        self.log_path = log_path
        self.argv = [PYTHON, "-m", "streamnb_workers", "milter", "--redis", url, "--model", "mail",
                     "--listen", self.listen, "--timeout", str(timeout), *args]
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> tuple[str, int] | str:
        kind, _, where = self.listen.partition(":")
        return where if kind in ("unix", "local") else ("127.0.0.1", self.port)

    def start(self) -> MilterProcess:
        env = blas_env({k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")})
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=env, stdout=out,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self._ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"streamnb milter exited {self.proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"streamnb milter did not listen: {self.log()}")
            time.sleep(0.05)
        return self

    def _ready(self) -> bool:
        if isinstance(self.address, str):
            return os.path.exists(self.address)
        return _connectable(self.port)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        code = stop(self.proc, sig)
        self.proc = None
        return code

    def __enter__(self) -> MilterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        # libmilter looks for a stop request every 5 s; the tests of stopping use stop()
        self.stop(signal.SIGKILL)
