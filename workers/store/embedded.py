"""The embedded default Redis of ``streamnb demo``: nothing to install, nothing to clean up.

:func:`start_embedded` starts, in order of preference:

1. a private ``redis-server`` child process (if one is on PATH) on a free loopback port,
   with no persistence and its data in a temporary directory; it is stopped on close;
2. else an in-process fakeredis ``FakeServer`` (with its ``lua`` extra, so the Lua commit
   runs) shared by every client the demo makes.

It never uses port 6379 or any server already running.

>>> with start_embedded("fakeredis") as r:
...     r.kind, r.make_client().ping()
('fakeredis', True)
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["EmbeddedRedis", "free_port", "start_embedded"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """A Redis private to this process (see the module docstring). Use as a context manager."""

    def __init__(self, kind: str, url: str | None = None, proc: subprocess.Popen | None = None,
                 tmpdir: str | None = None, server: Any = None) -> None:
        self.kind = kind  # "redis-server" | "fakeredis"
        self.url = url
        self._proc = proc
        self._tmpdir = tmpdir
        self._server = server

    def describe(self) -> str:
        if self.kind == "redis-server":
            return f"private redis-server at {self.url}"
        return "in-process fakeredis"

    def make_client(self, socket_timeout: float | None = 10.0) -> Any:
        if self.kind == "redis-server":
            import redis  # deferred: redis-py only for a redis-server (else fakeredis)

            return redis.Redis.from_url(self.url, socket_timeout=socket_timeout)
        import fakeredis  # deferred: an optional package (the test extra)

        return fakeredis.FakeRedis(server=self._server)

    def connector(self) -> Any:
        """A :class:`streamnb_workers.store.connection` connector for a worker."""
        # deferred: redis-py's clients (store.connection) only when a worker is made
        from streamnb_workers.store.connection import ClientConnector, RedisSettings, UrlConnector

        if self.kind == "redis-server":
            return UrlConnector(RedisSettings(self.url))
        return ClientConnector(self.make_client(), self.make_client(), self.describe())

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> EmbeddedRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _start_server(binary: str, timeout: float = 10.0) -> EmbeddedRedis:
    import redis  # deferred: redis-py only for a redis-server (else fakeredis)

    tmpdir = tempfile.mkdtemp(prefix="streamnb-demo-redis-")
    last_error: Exception | None = None
    for _ in range(3):  # a port taken between free_port() and bind(): try another
        port = free_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmpdir, "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
             "--logfile", str(Path(tmpdir) / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        emb = EmbeddedRedis("redis-server", url=url, proc=proc, tmpdir=None)
        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if client.ping():
                    emb._tmpdir = tmpdir
                    return emb
            except (redis.ConnectionError, redis.BusyLoadingError) as exc:
                last_error = exc
                time.sleep(0.05)
        emb.close()
    shutil.rmtree(tmpdir, ignore_errors=True)
    raise RuntimeError(f"could not start a private redis-server: {last_error}")


def start_embedded(mode: str = "auto") -> EmbeddedRedis:
    """Start the embedded default Redis (see the module docstring).

    ``mode``: ``"auto"`` (redis-server if on PATH, else fakeredis), ``"redis-server"`` or
    ``"fakeredis"``.
    """
    if mode not in ("auto", "redis-server", "fakeredis"):
        raise ValueError(f"mode must be auto, redis-server or fakeredis, got {mode!r}")
    binary = shutil.which("redis-server") if mode != "fakeredis" else None
    if mode == "redis-server" and not binary:
        raise RuntimeError("--embedded redis-server: no redis-server on PATH")
    if binary:
        try:
            return _start_server(binary)
        except (RuntimeError, OSError):
            if mode == "redis-server":
                raise
            # fall back to fakeredis
    try:  # deferred: optional packages (the test extra), only without a redis-server
        import fakeredis
        import lupa  # noqa: F401 - the Lua commit needs it
    except ImportError:
        raise RuntimeError(
            "the embedded demo needs redis-server on PATH or fakeredis[lua] installed "
            "(pip install 'streamnb[embedded]'), or give --redis URL") from None
    return EmbeddedRedis("fakeredis", server=fakeredis.FakeServer())
