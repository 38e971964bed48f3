"""Helpers of the protocol tests: ``streamnb spamd`` / ``streamnb rspamd`` in a child
process on a free port, the real clients (``spamc``, ``rspamc``) run against it, and a
redis-server with a worker that has learnt the milter tests' mails."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamnb_workers.cli.launch import blas_env
from tests.helpers.milter import MilterProcess, start_worker, stop, train, training_mails
from tests.helpers.redis_server import REDIS_SERVER, RedisServer, free_port
from tests.helpers.workers import PYTHON

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
