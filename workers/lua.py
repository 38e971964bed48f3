"""Lua scripts run by EVALSHA: the daemon's scripts (``*.lua`` beside this module) and
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
    """A Lua script run by EVALSHA, loaded (SCRIPT LOAD) on NOSCRIPT, e.g. after a restart."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def load(self, client: Any) -> None:
        """SCRIPT LOAD it (for callers that send EVALSHA themselves)."""
        client.script_load(self.source)

    def __call__(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            self.load(client)
            return client.evalsha(self.sha, len(keys), *keys, *args)


def packaged_script(name: str) -> LuaScript:
    """The script ``workers/<name>`` shipped with the package."""
    return LuaScript(resources.files("streamnb_workers").joinpath(name).read_text())
