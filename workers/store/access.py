"""The start-up access check: every command a worker sends, run once on throw-away keys
of each model, so that an ACL user lacking one fails at once with one line naming them
all (not at its first batch, with a batch pending).

>>> import fakeredis
>>> check_access(fakeredis.FakeRedis(), ["mail"])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import redis
from redis.exceptions import AuthenticationError, NoPermissionError

from streamnb_workers.store.connection import ACCESS_PREFIXES, tls_error, tls_failure

__all__ = ["check_access"]


def _probe_steps(prefix: str) -> list[tuple[str, Callable[[Any], Any]]]:
    """(command, call) for every command a worker sends, on throw-away keys under
    ``prefix`` (the model's hash tag, so one slot in a cluster)."""
    s, h, k = f"{prefix}:access-check:s", f"{prefix}:access-check:h", f"{prefix}:access-check:k"
    z = f"{prefix}:access-check:z"
    g, c = "access-check", "access-check"
    ids: dict[str, Any] = {}

    def xadd(r: Any) -> Any:
        ids["id"] = r.xadd(s, {"f": "v"})
        return ids["id"]

    def script_load(r: Any) -> Any:
        ids["sha"] = r.script_load("return 1")
        return ids["sha"]

    return [
        ("TYPE", lambda r: r.type(s)),
        ("EXISTS", lambda r: r.exists(s)),
        ("XADD", xadd),
        ("XLEN", lambda r: r.xlen(s)),
        ("XRANGE", lambda r: r.xrange(s, count=1)),
        ("XREVRANGE", lambda r: r.xrevrange(s, count=1)),
        ("XREAD", lambda r: r.xread({s: "0"}, count=1)),
        ("XGROUP CREATE", lambda r: r.xgroup_create(s, g, id="0")),
        ("XREADGROUP", lambda r: r.xreadgroup(g, c, {s: ">"}, count=1)),
        ("XPENDING", lambda r: r.xpending_range(s, g, min="-", max="+", count=1)),
        ("XAUTOCLAIM", lambda r: r.xautoclaim(s, g, c, min_idle_time=0, count=1)),
        ("XINFO GROUPS", lambda r: r.xinfo_groups(s)),
        ("XINFO STREAM", lambda r: r.xinfo_stream(s)),
        ("XINFO CONSUMERS", lambda r: r.xinfo_consumers(s, g)),
        ("XACK", lambda r: r.xack(s, g, ids.get("id") or "0-1")),
        ("XGROUP DELCONSUMER", lambda r: r.xgroup_delconsumer(s, g, c)),
        ("XTRIM", lambda r: r.xtrim(s, minid="0-1")),
        ("XDEL", lambda r: r.xdel(s, ids.get("id") or "0-1")),
        ("HSET", lambda r: r.hset(h, "f", "v")),
        ("HGET", lambda r: r.hget(h, "f")),
        ("HMGET", lambda r: r.hmget(h, ["f"])),
        ("HGETALL", lambda r: r.hgetall(h)),
        ("HEXISTS", lambda r: r.hexists(h, "f")),
        ("HDEL", lambda r: r.hdel(h, "f")),
        ("HINCRBY", lambda r: r.hincrby(h, "n", 1)),
        ("ZADD", lambda r: r.zadd(z, {"f": 1})),
        ("ZCARD", lambda r: r.zcard(z)),
        ("ZPOPMIN", lambda r: r.zpopmin(z, 1)),
        ("ZREM", lambda r: r.zrem(z, "f")),
        ("ZRANGE", lambda r: r.zrange(z, 0, "+inf", byscore=True)),
        ("SET", lambda r: r.set(k, "0", px=60_000)),
        ("GET", lambda r: r.get(k)),
        ("INCRBY", lambda r: r.incrby(k, 1)),
        ("PEXPIRE", lambda r: r.pexpire(k, 60_000)),
        ("SCRIPT LOAD", script_load),
        ("EVALSHA", lambda r: r.evalsha(ids.get("sha") or "0" * 40, 1, k)),
        ("MULTI/EXEC", lambda r: r.pipeline(transaction=True).get(k).execute()),
        ("DEL", lambda r: r.delete(s, h, k, z)),
    ]


def check_access(client: Any, model_names: Iterable[str], where: str = "Redis") -> None:
    """Run every command a worker sends once, on throw-away keys of each model
    (``streamnb:{NAME}:access-check:*``, deleted afterwards).

    Raises ``redis.AuthenticationError`` (credentials refused),
    ``redis.exceptions.NoPermissionError`` naming every refused command, or
    :class:`~streamnb.exceptions.SettingsError` for a failed TLS handshake, each in one
    line; other connection errors pass through (the caller retries them). Other replies (e.g. out of memory) are not ACL problems
    and are ignored here.

    """
    try:
        client.ping()
    except AuthenticationError as exc:
        raise AuthenticationError(f"{where} refused the credentials: {exc}") from None
    except redis.ConnectionError as exc:
        if (reason := tls_failure(exc)) is not None:
            raise tls_error(reason, where) from None
        raise
    for name in model_names:
        prefix = f"streamnb:{{{name}}}"
        refused: list[str] = []
        first = ""
        for command, call in _probe_steps(prefix):
            try:
                call(client)
            except NoPermissionError as exc:
                refused.append(command)
                first = first or " ".join(str(exc).split())
            except redis.ResponseError as exc:
                if str(exc).startswith(ACCESS_PREFIXES):
                    refused.append(command)
                    first = first or " ".join(str(exc).split())
        if refused:
            raise NoPermissionError(
                f"{where}: the ACL user may not run {', '.join(refused)} on {prefix}:* "
                f"({first}); grant what deploy/redis/users.acl grants streamnb-worker")
