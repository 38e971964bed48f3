"""Helpers of the protocol tests: ``streamnb spamd`` / ``streamnb rspamd`` in a child
process on a free port, the real clients (``spamc``, ``rspamc``) run against it, and a
redis-server with a worker that has learnt the milter tests' mails."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamnb_workers.cli.launch import blas_env
from streamnb_workers.replication.shards import load_model
from tests.helpers.milter import MilterProcess, start_worker, stop, train, training_mails
from tests.helpers.redis_server import REDIS_SERVER, RedisServer, free_port
from tests.helpers.workers import PYTHON, per_class

SPAMC = shutil.which("spamc")
RSPAMC = shutil.which("rspamc")


class ServerProcess(MilterProcess):
    """``streamnb COMMAND --listen 127.0.0.1:PORT --model mail ARGS`` in a child process."""

    def __init__(self, command: str, url: str, log_path: Path, *args: str,
                 timeout: float = 5.0) -> None:
        super().__init__(url, log_path, port=free_port())
        self.argv = [PYTHON, "-m", "streamnb_workers", command, "--redis", url, "--model",
                     "mail", "--listen", f"127.0.0.1:{self.port}", "--timeout", str(timeout),
                     *args]


@contextlib.contextmanager
def trained_redis(logs: Path, n: int = 60, **options: Any) -> Iterator[Any]:
    """A redis-server whose model "mail" has learnt ``n`` mails, a worker serving it
    (``options``: the worker's, e.g. ``explain=3``)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        r = server.client()
        worker = start_worker(server.url, r, logs / "worker.log", **options)
        try:
            train(r, training_mails(n))
            yield server
        finally:
            stop(worker)


def run_client(argv: list[str], mail: bytes = b"", timeout: float = 30.0
               ) -> subprocess.CompletedProcess:
    """A real client, the mail on its stdin (stdout and stderr kept as text)."""
    env = blas_env({k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")})
    return subprocess.run(argv, input=mail, capture_output=True, timeout=timeout, env=env)


@contextlib.contextmanager
def protocol_servers(logs: Path, servers: list[tuple[str, str, tuple[str, ...]]],
                     **options: Any) -> Iterator[tuple[Any, list[ServerProcess]]]:
    """A trained redis-server and worker (``options``: the worker's), and one server
    process per ``(command, log name, args)``: the protocol tests' module fixtures."""
    with trained_redis(logs, **options) as redis_server, contextlib.ExitStack() as stack:
        yield redis_server, [stack.enter_context(ServerProcess(command, redis_server.url,
                                                               logs / log, *args))
                             for command, log, args in servers]


def spamc(server: ServerProcess, *args: str, mail_bytes: bytes = b"") -> subprocess.CompletedProcess:
    """The real ``spamc`` against ``server``."""
    return run_client([SPAMC, "-d", "127.0.0.1", "-p", str(server.port), *args], mail_bytes)


def rspamc(server: ServerProcess, *args: str, mail_bytes: bytes = b"") -> subprocess.CompletedProcess:
    """The real ``rspamc`` against ``server``."""
    return run_client([RSPAMC, "-h", f"127.0.0.1:{server.port}", *args], mail_bytes)


def ask(server: ServerProcess, data: bytes, half_close: bool = True, timeout: float = 10.0,
        ) -> bytes:
    """``data`` sent as it is (half-closed after it), and every byte answered until the
    server closes; a connection the server cut short gives what it answered."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    return b"".join(chunks)


def mangled(rng: random.Random, data: bytes) -> bytes:
    """``data`` with up to three bytes flipped, cuts or inserted separators (the fuzz)."""
    for _ in range(rng.randrange(4)):
        i = rng.randrange(len(data))
        kind = rng.randrange(3)
        if kind == 0:
            data = data[:i] + bytes([rng.randrange(256)]) + data[i + 1:]
        elif kind == 1:
            data = data[:i]
        else:
            data = data[:i] + rng.choice([b"\r\n", b"\n", b":", b"\x00", b"\r\n\r\n"]) + data[i:]
    return data


def model_stats(r: Any, model: str = "mail") -> dict:
    """The statistics of ``model`` as stored, by part and class."""
    return per_class(load_model(r, model)[0])


def same_stats(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for part in a:
        assert a[part].keys() == b[part].keys()
        for label in a[part]:
            assert (a[part][label] == b[part][label]).all(), (part, label)
