"""Redis clients built from a URL: TLS, Redis Cluster, no retry of refused credentials.

``redis://`` and ``rediss://`` URLs (``rediss://user:password@host:6380/0``) are accepted;
a password given separately (read by the caller from an environment variable or a file)
overrides the URL's. TLS: ``rediss://`` plus ``ca_file`` (the CA that signed the server's
certificate; the host name is checked) and, for servers that ask for client certificates,
``cert_file``/``key_file``. ``cluster=True`` builds a :class:`redis.cluster.RedisCluster`
(any node's URL; every key of a model shares the hash tag ``{NAME}``, so one model lives in
one slot). Blocking reads use their own client whose socket timeout exceeds the BLOCK time
(redis-py 8 defaults ``socket_timeout`` to 5 s, which would cut a longer block short).

A refused password or an ACL refusal is never retried (:class:`NoAccessRetry`): retrying
cannot fix it, and redis-py's default retry of ``ConnectionError`` (of which
``AuthenticationError`` is a subclass) made a wrong password take seconds to fail.
:func:`streamnb_workers.store.access.check_access` (which ``Worker.start`` calls for a
:class:`UrlConnector`) runs every command a worker sends on throw-away keys of each model,
so a user lacking one fails at once with one line naming them all.

A :class:`Connector` is what :class:`streamnb_workers.worker.loop.Worker` takes: it makes the command
client and the reading client, and can be rebuilt after a connection loss.

>>> RedisSettings("redis://localhost").reader_timeout(30000)
35.0
>>> RedisSettings("redis://localhost", ca_file="ca.pem")
Traceback (most recent call last):
...
ValueError: a TLS CA or client certificate needs a rediss:// URL, got 'redis://localhost'
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import AuthenticationError, NoPermissionError, RedisClusterException
from redis.retry import Retry

from streamnb.exceptions import SettingsError
from streamnb_workers.store.redaction import redact_url

try:  # redis-py >= 7
    from redis.maint_notifications import MaintNotificationsConfig
except ImportError:  # pragma: no cover - older redis-py sends no such command
    MaintNotificationsConfig = None  # type: ignore[assignment,misc]

log = logging.getLogger("streamnb.connection")

T = TypeVar("T")

#: Seconds a reading connection's socket timeout exceeds its BLOCK time.
READ_TIMEOUT_MARGIN_S = 5.0
#: Retries of a command by redis-py after a connection error (the worker itself reconnects
#: with backoff and redoes uncommitted work, see docs/worker.md).
COMMAND_RETRIES = 0
#: Cluster client: attempts after a connection error, CLUSTERDOWN or a moved slot.
CLUSTER_RETRIES = 3
CLUSTER_BACKOFF_BASE_S = 0.05
CLUSTER_BACKOFF_CAP_S = 1.0
#: Reply prefixes of Redis's refusals of credentials or of a command.
ACCESS_PREFIXES = ("WRONGPASS", "NOAUTH", "NOPERM")


def is_access_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing the credentials or a command (never retried).

    >>> is_access_error(redis.AuthenticationError("invalid username-password pair"))
    True
    >>> is_access_error(redis.ConnectionError("Connection refused"))
    False
    """
    if isinstance(exc, (AuthenticationError, NoPermissionError)):
        return True
    return isinstance(exc, redis.RedisError) and str(exc).startswith(ACCESS_PREFIXES)


class NoAccessRetry(Retry):
    """A redis-py :class:`~redis.retry.Retry` that never retries an access refusal.

    >>> calls = []
    >>> def refuse():
    ...     calls.append(1)
    ...     raise redis.AuthenticationError("WRONGPASS")
    >>> try:
    ...     NoAccessRetry(NoBackoff(), 5).call_with_retry(refuse, lambda e: None)
    ... except redis.AuthenticationError:
    ...     len(calls)
    1
    """

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> T:
        def retryable(exc: Exception) -> bool:
            return not is_access_error(exc) and (is_retryable is None or is_retryable(exc))

        return super().call_with_retry(do, fail, retryable, with_failure_count)


#: Markers of a TLS handshake that no retry can fix (wrong CA, wrong name, not TLS).
TLS_FAILURES = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "WRONG_VERSION_NUMBER",
                "Hostname mismatch", "doesn't match", "TLSV1_ALERT", "SSLV3_ALERT")


def tls_failure(exc: BaseException) -> str | None:
    """The reason if ``exc`` (or what caused it) is a failed TLS handshake, else None.

    >>> tls_failure(redis.ConnectionError("Error 1 connecting to db:6380. [SSL: "
    ...     "CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate"))
    '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate'
    >>> tls_failure(redis.ConnectionError("Connection refused")) is None
    True
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = " ".join(str(e).split())
        if isinstance(e, ssl.SSLError) or any(m in text for m in TLS_FAILURES):
            i = text.find("[SSL")
            return text[i:] if i >= 0 else text
        e = e.__cause__ or e.__context__
    return None


def tls_error(reason: str, where: str) -> SettingsError:
    """The one-line error of a failed TLS handshake with ``where``."""
    return SettingsError(f"TLS handshake with {where} failed: {reason} (check --tls-ca-file, "
                         "and that the server's certificate names this host)")


def _cluster_error(exc: Exception, url: str) -> Exception:
    """A clear exception for a failure to build the cluster client (redis-py raises
    ``RedisClusterException``, which is no ``RedisError``)."""
    text = " ".join(str(exc).split())
    where = redact_url(url)
    if "invalid username-password" in text or "WRONGPASS" in text or "NOAUTH" in text:
        return AuthenticationError(f"Redis Cluster at {where} refused the credentials: {text}")
    if "NOPERM" in text or "no permissions" in text:
        return NoPermissionError(
            f"Redis Cluster at {where}: the ACL user may not run the cluster client's commands "
            f"(grant +cluster|slots +cluster|shards +command +asking): {text}")
    if (reason := tls_failure(exc)) is not None:
        return tls_error(reason, where)
    if "cluster support disabled" in text or "Cluster mode is not enabled" in text:
        return SettingsError(f"{where} is not a Redis Cluster node (cluster support disabled): "
                             "drop --cluster, or give a cluster node's URL")
    return redis.ConnectionError(f"Redis Cluster at {where} cannot be reached: {text}")


@dataclass(frozen=True)
class RedisSettings:
    """How to reach Redis. ``password`` overrides the URL's (give it from env or a file).

    ``ca_file``: CA certificate(s) to verify a ``rediss://`` server; ``cert_file`` and
    ``key_file``: a client certificate, for servers started with ``tls-auth-clients yes``.
    """

    url: str = "redis://localhost:6379/0"
    password: str | None = None
    username: str | None = None
    ca_file: str | None = None
    cluster: bool = False
    socket_timeout: float = 10.0
    connect_timeout: float = 5.0
    client_name: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                f"Redis URL must start with redis://, rediss:// or unix://, got {redact_url(self.url)!r}"
            )
        if (self.ca_file or self.cert_file or self.key_file) and scheme != "rediss":
            raise ValueError("a TLS CA or client certificate needs a rediss:// URL, "
                             f"got {redact_url(self.url)!r}")
        if self.key_file and not self.cert_file:
            raise ValueError("a TLS client key needs its certificate (cert_file)")
        if self.cluster and scheme == "unix":
            raise ValueError("Redis Cluster needs a redis:// or rediss:// URL, not unix://")

    def __repr__(self) -> str:  # never the password, in logs or tracebacks
        shown = {k: v for k, v in vars(self).items() if k != "password" and v is not None}
        shown["url"] = redact_url(self.url)
        if self.password is not None:
            shown["password"] = "***"
        return f"RedisSettings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"

    @property
    def user(self) -> str:
        """The ACL user the clients log in as (``default`` when none is given)."""
        if self.username:
            return self.username
        name = urlsplit(self.url).username
        return unquote(name) if name else "default"

    def describe(self) -> str:
        """Where and as whom, safe to log."""
        return f"{redact_url(self.url)} (user {self.user!r}{', cluster' if self.cluster else ''})"

    def reader_timeout(self, block_ms: int) -> float:
        """Socket timeout of a connection that blocks ``block_ms`` in XREADGROUP."""
        return max(self.socket_timeout, block_ms / 1000.0 + READ_TIMEOUT_MARGIN_S)

    def client_kwargs(self, socket_timeout: float) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": self.connect_timeout,
            "health_check_interval": 30,
            # No CLIENT SETINFO / CLIENT MAINT_NOTIFICATIONS on connect: the handshake is
            # HELLO (AUTH) and CLIENT SETNAME only, so the ACL user needs nothing more.
            "driver_info": None,
        }
        if MaintNotificationsConfig is not None:
            kw["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
        if self.password is not None:
            kw["password"] = self.password
        if self.username is not None:
            kw["username"] = self.username
        if self.ca_file is not None:
            kw["ssl_ca_certs"] = self.ca_file
        if self.cert_file is not None:
            kw["ssl_certfile"] = self.cert_file
        if self.key_file is not None:
            kw["ssl_keyfile"] = self.key_file
        if self.client_name is not None:
            kw["client_name"] = self.client_name
        return kw

    def make_client(self, socket_timeout: float | None = None,
                    known_nodes: Iterable[tuple[str, int]] = ()) -> Any:
        """A new client: ``redis.Redis`` (connects lazily) or ``RedisCluster`` (connects now
        to learn the slots; failures are one-line ``AuthenticationError``,
        ``NoPermissionError``, ``ConnectionError`` or ``SettingsError``).

        ``known_nodes``: more cluster nodes ``(host, port)`` to learn the slots from when
        the URL's node does not answer (it may be the master that failed)."""
        kw = self.client_kwargs(self.socket_timeout if socket_timeout is None else socket_timeout)
        if not self.cluster:
            kw["retry"] = NoAccessRetry(NoBackoff(), COMMAND_RETRIES)
            return redis.Redis.from_url(self.url, **kw)
        kw.pop("health_check_interval", None)
        retry = NoAccessRetry(ExponentialWithJitterBackoff(CLUSTER_BACKOFF_BASE_S,
                                                           CLUSTER_BACKOFF_CAP_S), CLUSTER_RETRIES)
        try:
            return RedisCluster.from_url(self.url, retry=retry, **kw, startup_nodes=[
                ClusterNode(host, port) for host, port in known_nodes])
        except (RedisClusterException, redis.RedisError) as exc:
            raise _cluster_error(exc, self.url) from None


# ------------------------------------------------------------------------- connectors
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

    On a cluster it remembers the nodes its last client found, and a new client learns the
    slots from them as well as from the URL's node: after a failover, the node the URL
    names may be the master that died, and a worker must reconnect to the replica that
    took its place all the same.

    >>> c = UrlConnector(RedisSettings("redis://u:pw@localhost:1/0"))
    >>> c.describe()
    'redis://u:***@localhost:1/0'
    """

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings
        self.cluster = settings.cluster
        #: ``(host, port)`` of every cluster node the last client knew.
        self.known_nodes: list[tuple[str, int]] = []

    def _make(self, socket_timeout: float | None = None) -> Any:
        client = self.settings.make_client(socket_timeout, self.known_nodes)
        if self.cluster:
            self.known_nodes = [(n.host, n.port) for n in client.get_nodes()]
        return client

    def client(self) -> Any:
        return self._make()

    def reader(self, block_ms: int) -> Any:
        return self._make(self.settings.reader_timeout(block_ms))

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


def refresh_cluster_view(client: Any) -> None:
    """On a cluster client, read the slots' masters anew and make its default node one that
    answers; a no-op on other clients. After a failover redis-py refreshes its map only
    once its own backoff allows (it grows while the failed master's slots are down), and
    it asks the default node where the keys of some commands go (``COMMAND GETKEYS``,
    e.g. for XREADGROUP) and keeps it when it dies: every such command would fail, for
    every slot. A worker that serves its other models meanwhile, with the same clients,
    calls this each time a model's node fails (workers/worker/loop.py)."""
    manager = getattr(client, "nodes_manager", None)
    if manager is None:
        return
    try:
        manager.initialize()
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        log.debug("cluster map not refreshed (the current one stays): %s", exc)
    for _ in range(len(client.get_nodes())):
        try:
            client.get_redis_connection(client.get_default_node()).ping()
            return
        except redis.RedisError:
            client.replace_default_node()


def close_clients(clients: Iterable[Any]) -> None:
    """Close every connection of ``clients`` (cluster clients: a pool per node), best effort."""
    for c in clients:
        try:
            if c is not None:
                c.close()
        except Exception:  # noqa: BLE001, S110 - nothing to do about it
            pass


def connector_from_url(url: str, **settings: Any) -> UrlConnector:
    """Shortcut: ``connector_from_url("redis://localhost", password=...)``."""
    return UrlConnector(RedisSettings(url, **settings))


__all__ = ["ClientConnector", "Connector", "NoAccessRetry", "RedisSettings", "UrlConnector",
           "close_clients", "connector_from_url", "is_access_error", "tls_failure"]
