"""Redis clients built from a URL, the dedicated reading connection, URL redaction.

``redis://`` and ``rediss://`` URLs (``rediss://user:password@host:6380/0``) are accepted;
a password given separately (read by the caller from an environment variable or a file)
overrides the URL's; ``ca_file`` verifies a TLS server; ``cluster=True`` builds a
:class:`redis.cluster.RedisCluster`. Blocking reads use their own client whose socket
timeout exceeds the BLOCK time (redis-py 8 defaults ``socket_timeout`` to 5 s, which
would cut a longer block short).

A :class:`Connector` is what :class:`workers.worker.Worker` takes: it makes the command
client and the reading client, and can be rebuilt after a connection loss.

>>> redact_url("redis://alice:s3cret@db:6379/0")
'redis://alice:***@db:6379/0'
>>> redact_url("rediss://:s3cret@db")
'rediss://:***@db'
>>> RedisSettings("redis://localhost").reader_timeout(30000)
35.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import redis

#: Seconds a reading connection's socket timeout exceeds its BLOCK time.
READ_TIMEOUT_MARGIN_S = 5.0


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (for logs and errors)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


@dataclass(frozen=True)
class RedisSettings:
    """How to reach Redis. ``password`` overrides the URL's (give it from env or a file)."""

    url: str = "redis://localhost:6379/0"
    password: str | None = None
    username: str | None = None
    ca_file: str | None = None
    cluster: bool = False
    socket_timeout: float = 10.0
    connect_timeout: float = 5.0
    client_name: str | None = None

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                f"Redis URL must start with redis://, rediss:// or unix://, got {redact_url(self.url)!r}"
            )

    def reader_timeout(self, block_ms: int) -> float:
        """Socket timeout of a connection that blocks ``block_ms`` in XREADGROUP."""
        return max(self.socket_timeout, block_ms / 1000.0 + READ_TIMEOUT_MARGIN_S)

    def client_kwargs(self, socket_timeout: float) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": self.connect_timeout,
            "health_check_interval": 30,
        }
        if self.password is not None:
            kw["password"] = self.password
        if self.username is not None:
            kw["username"] = self.username
        if self.ca_file is not None:
            kw["ssl_ca_certs"] = self.ca_file
        if self.client_name is not None:
            kw["client_name"] = self.client_name
        return kw

    def make_client(self, socket_timeout: float | None = None) -> Any:
        """A new client (``redis.Redis`` or ``RedisCluster``); connects lazily."""
        kw = self.client_kwargs(self.socket_timeout if socket_timeout is None else socket_timeout)
        if self.cluster:
            from redis.cluster import RedisCluster

            kw.pop("health_check_interval", None)
            return RedisCluster.from_url(self.url, **kw)
        return redis.Redis.from_url(self.url, **kw)


class Connector(Protocol):
    """Makes the clients a worker uses."""

    cluster: bool

    def client(self) -> Any:
        """The command client (commits, tailing, heartbeats)."""

    def reader(self, block_ms: int) -> Any:
        """The client for blocking XREADGROUP (socket timeout above ``block_ms``)."""

    def describe(self) -> str:
        """Where it connects, safe to log (password redacted)."""


class UrlConnector:
    """A :class:`Connector` from :class:`RedisSettings`.

    >>> c = UrlConnector(RedisSettings("redis://u:pw@localhost:1/0"))
    >>> c.describe()
    'redis://u:***@localhost:1/0'
    """

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings
        self.cluster = settings.cluster

    def client(self) -> Any:
        return self.settings.make_client()

    def reader(self, block_ms: int) -> Any:
        return self.settings.make_client(self.settings.reader_timeout(block_ms))

    def describe(self) -> str:
        return redact_url(self.settings.url)


class ClientConnector:
    """A :class:`Connector` around existing clients (fakeredis in tests and the demo).

    >>> import fakeredis
    >>> c = ClientConnector(fakeredis.FakeRedis())
    >>> c.client().ping()
    True
    """

    cluster = False

    def __init__(self, client: Any, reader: Any = None, description: str = "in-process") -> None:
        self._client = client
        self._reader = reader if reader is not None else client
        self._description = description

    def client(self) -> Any:
        return self._client

    def reader(self, block_ms: int) -> Any:
        return self._reader

    def describe(self) -> str:
        return self._description


def connector_from_url(url: str, **settings: Any) -> UrlConnector:
    """Shortcut: ``connector_from_url("redis://localhost", password=...)``."""
    return UrlConnector(RedisSettings(url, **settings))
