"""Lua scripts run by EVALSHA: the daemon's scripts (``scripts/*.lua`` beside this module) and
the small ones written inline.

>>> import fakeredis
>>> r = fakeredis.FakeRedis()
>>> LuaScript("return ARGV[1] .. KEYS[1]")(r, ["k"], ["v"])
b'vk'
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

import redis

__all__ = ["LuaScript", "packaged_script"]


class LuaScript:
    """A Lua script run by EVALSHA, loaded (SCRIPT LOAD) on NOSCRIPT, e.g. after a restart:
    on a cluster on the node of the keys alone (redis-py sends SCRIPT LOAD to every
    master, which fails while one is down)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def load(self, client: Any, key: str | None = None) -> None:
        """SCRIPT LOAD it (for callers that send EVALSHA themselves); ``key``: on a
        cluster, only on the node that holds it."""
        if key is not None and hasattr(client, "get_node_from_key"):
            client.get_redis_connection(client.get_node_from_key(key)).script_load(self.source)
        else:
            client.script_load(self.source)

    def __call__(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            self.load(client, keys[0] if keys else None)
            return client.evalsha(self.sha, len(keys), *keys, *args)


def packaged_script(name: str) -> LuaScript:
    """The script ``workers/store/scripts/<name>`` shipped with the package."""
    return LuaScript(resources.files(__package__).joinpath("scripts", name).read_text())
