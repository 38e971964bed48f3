"""Which Redis errors pass (a failover, a restart, a full disk) and what kind each is: the
worker waits and reconnects after those (workers/worker/loop.py, workers/worker/outages.py) and raises
the others.
"""

from __future__ import annotations

import redis

__all__ = ["TRANSIENT_PREFIXES", "UNREACHABLE_KINDS", "error_kind"]

#: Redis reply prefixes of errors that pass (failover, loading, disk trouble).
TRANSIENT_PREFIXES = ("MISCONF", "READONLY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
                      "NOREPLICAS", "BUSY ")
#: Error kinds of a Redis that cannot be reached (``redis_up`` 0, ``/healthz`` counting).
UNREACHABLE_KINDS = ("connection", "timeout")


#: Cluster errors redis-py raises without the reply's prefix, or outside ``RedisError``,
#: that a topology change explains (a failover, a slot moving): a reconnect re-reads it.
CLUSTER_TRANSIENT = (redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
                     redis.exceptions.AskError, redis.exceptions.SlotNotCoveredError)


def error_kind(exc: BaseException) -> str | None:
    """The metric kind of a transient Redis error, or None if it is not transient.

    >>> from redis.exceptions import ClusterDownError, ResponseError, TryAgainError
    >>> [error_kind(e) for e in (redis.ConnectionError("refused"), ClusterDownError("down"),
    ...  TryAgainError("rehashing"), ResponseError("NOREPLICAS Not enough good replicas"))]
    ['connection', 'other', 'other', 'other']
    >>> error_kind(ResponseError("WRONGTYPE Operation against a key")) is None
    True
    """
    if isinstance(exc, redis.TimeoutError):
        return "timeout"
    if isinstance(exc, (redis.ConnectionError, redis.BusyLoadingError)):
        return "connection"
    if isinstance(exc, redis.ReadOnlyError):
        return "readonly"
    if isinstance(exc, redis.ResponseError):
        text = str(exc)
        if text.startswith("MISCONF"):
            return "misconf"
        if text.startswith("NOGROUP"):  # Redis lost the group (restarted empty): restored
            return "nogroup"
        if text.startswith(TRANSIENT_PREFIXES):
            return "other"
    if isinstance(exc, CLUSTER_TRANSIENT):
        return "other"
    return None
