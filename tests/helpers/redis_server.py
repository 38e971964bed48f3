"""Start and stop private redis-server processes for tests (free port, temp dir).

Tests that exercise the daemon's Redis behaviour run against a real server started here, so
they can kill, pause and restart it. fakeredis is only for fast unit tests.
"""

from __future__ import annotations

import os
import shutil
import signal as signals
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortTaken(RuntimeError):
    """redis-server exited because another process holds its port."""


class RedisServer:
    """A redis-server child process on 127.0.0.1:<free port>, data in a temp dir.

    ``appendfsync``: None for no persistence, else "always" / "everysec" / "no" (AOF on).
    ``extra``: more ``--option value`` arguments. Use as a context manager.
    """

    def __init__(self, appendfsync: str | None = None, extra: list[str] | None = None,
                 port: int | None = None, dir: str | None = None) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not on PATH")
        self.port = port or free_port()
        self._port_chosen_here = port is None
        self._own_dir = dir is None
        self.dir = Path(dir or tempfile.mkdtemp(prefix="streamnb-redis-"))
        self.appendfsync = appendfsync
        self.extra = list(extra or [])
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        a = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--daemonize", "no", "--loglevel", "warning",
             "--logfile", str(self.dir / "redis.log")]
        if self.appendfsync:
            a += ["--appendonly", "yes", "--appendfsync", self.appendfsync]
        else:
            a += ["--appendonly", "no"]
        return a + self.extra

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait for PING. A port chosen here and taken by another
        process before the first start is given up for a new one, twice at most."""
        for attempt in range(3):
            try:
                return self._start_once(timeout)
            except PortTaken:
                if not self._port_chosen_here or attempt == 2:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> RedisServer:
        log = self.dir / "redis.log"
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                text = f"{err} {log.read_text() if log.exists() else ''}"
                self.proc = None
                if "Address already in use" in text:
                    raise PortTaken(f"redis-server could not listen on {self.port}: {text}")
                raise RuntimeError(f"redis-server exited: {text}")
            try:
                if self.client().ping():
                    self._port_chosen_here = False
                    return self
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer in {timeout}s")

    def client(self, **kw) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kw)

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, sig: int = signals.SIGTERM, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    def restart(self, sig: int = signals.SIGTERM) -> RedisServer:
        self.stop(sig)
        return self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(signals.SIGKILL)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
