"""Whether a worker reaches Redis, as the gauge ``streamnb_redis_up`` and as ``/healthz``
on the metrics port, next to ``/metrics``.

:class:`RedisHealth` is told by the worker loop when a Redis round trip succeeded
(:meth:`RedisHealth.up`, after every step of its loop) and when one failed
(:meth:`RedisHealth.down`). ``/healthz`` answers 200 while the last success is at most
``grace_s`` seconds old (the start counts as one), else 503: a worker that cannot reach
Redis for longer than the grace period, or whose loop stopped stepping, is restarted or
taken out of service by its orchestrator; one that lost Redis for a moment is not.

>>> h = RedisHealth(grace_s=10.0, clock=lambda: 100.0)
>>> h.healthy(now=105.0), h.healthy(now=111.0)
(True, False)
>>> h.up(); h.healthy(now=109.0)
True
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from streamnb_workers.defaults import DEFAULT_HEALTHZ_GRACE_S

__all__ = ["DEFAULT_HEALTHZ_GRACE_S", "RedisHealth", "health_app", "serve_metrics_and_health"]


class RedisHealth:
    """When the worker last reached Redis, and the ``redis_up`` gauge child it keeps."""

    def __init__(self, grace_s: float = DEFAULT_HEALTHZ_GRACE_S, gauge: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not grace_s > 0:
            raise ValueError(f"the healthz grace must be > 0 seconds, got {grace_s}")
        self.grace_s = float(grace_s)
        self.gauge = gauge
        self.clock = clock
        #: Monotonic time of the last success (the start counts as one: a starting worker
        #: gets the grace period to reach Redis).
        self.last_ok = clock()
        self.is_up = False
        if gauge is not None:
            gauge.set(0)

    def up(self) -> None:
        """A Redis round trip succeeded."""
        self.last_ok = self.clock()
        if not self.is_up:
            self.is_up = True
            if self.gauge is not None:
                self.gauge.set(1)

    def down(self) -> None:
        """A Redis round trip failed (connection refused, timeout, Redis loading...)."""
        self.is_up = False
        if self.gauge is not None:
            self.gauge.set(0)

    def seconds_since_success(self, now: float | None = None) -> float:
        """Seconds since the last successful round trip (or the start)."""
        return max(0.0, (self.clock() if now is None else now) - self.last_ok)

    def healthy(self, now: float | None = None) -> bool:
        """False once the last success is older than the grace period."""
        return self.seconds_since_success(now) <= self.grace_s


def health_app(registry: Any, health: RedisHealth | None) -> Callable[..., Iterable[bytes]]:
    """A WSGI app: ``/healthz`` from ``health`` (always 200 without one), anything else
    prometheus-client's metrics app."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/healthz":
            return metrics(environ, start_response)
        if health is None or health.healthy():
            status, body = "200 OK", b"ok\n"
        else:
            status = "503 Service Unavailable"
            body = (f"no successful Redis round trip for {health.seconds_since_success():.0f} s "
                    f"(grace {health.grace_s:g} s)\n").encode()
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                                ("Content-Length", str(len(body)))])
        return [body]

    return app


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr (a probe every few seconds would fill the worker's log)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


def serve_metrics_and_health(port: int, addr: str, registry: Any = None,
                             health: RedisHealth | None = None) -> Any:
    """Serve ``/metrics`` and ``/healthz`` on ``addr:port`` from a daemon thread; returns
    the server. ``addr`` may be an IPv4 or IPv6 address or a host name."""
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(addr, port, health_app(registry or REGISTRY, health), Server,
                        handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True, name="metrics-http").start()
    return httpd
