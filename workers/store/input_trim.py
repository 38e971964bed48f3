"""Trim ``{M}:in`` of the entries every consumer group is done with.

An entry of the input stream is needed while a group has not read it or holds it pending
(read, not yet acknowledged). The oldest entry still needed is, over every group of the
stream, the smaller of its oldest pending entry and the entry after its last delivered one;
everything before it goes, with ``XTRIM MINID``. One script reads the groups and trims, so
no group can read or claim in between; the lease holder runs it on a timer
(workers/worker/housekeeping.py). A stream without a group is left alone: nothing says what is done.

>>> next_id("1700000000000-4"), next_id("5-18446744073709551615")
('1700000000000-5', '6-0')
"""

from __future__ import annotations

from typing import Any

from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.lua import LuaScript
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import parse_id

__all__ = ["trim_input", "next_id"]

# KEYS: :in. Returns {minid, entries removed}, or {'', 0} with no group (or no stream).
# Ids are compared as (ms, seq) numbers: seq above 2**53 loses precision in Lua, which can
# only make the trim point earlier (an entry kept), never later.
_TRIM = LuaScript("""
if redis.call('EXISTS', KEYS[1]) == 0 then return {'', 0} end
local function parse(s)
  local ms, seq = string.match(s, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function before(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end
local minid = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  local ms, seq = parse(f['last-delivered-id'])
  local need = string.format('%.0f-%.0f', ms, seq + 1)
  local summary = redis.call('XPENDING', KEYS[1], f['name'])
  if summary[1] > 0 and before(summary[2], need) then need = summary[2] end
  if minid == nil or before(need, minid) then minid = need end
end
if minid == nil then return {'', 0} end
return {minid, redis.call('XTRIM', KEYS[1], 'MINID', minid)}
""")


def next_id(entry_id: str) -> str:
    """The smallest stream id after ``entry_id``."""
    ms, seq = parse_id(entry_id)
    return f"{ms + 1}-0" if seq >= 2**64 - 1 else f"{ms}-{seq + 1}"


def trim_input(client: Any, keys: ModelKeys) -> tuple[str | None, int]:
    """Remove from ``keys.input`` every entry each of its consumer groups has read and
    acknowledged; returns the trim point (None without a group) and the entries removed."""
    minid, removed = _TRIM(client, [keys.input], [])
    minid = as_str(minid)
    return (minid or None), int(removed)
