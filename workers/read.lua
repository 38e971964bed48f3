-- streamnb: announce the batch that the XREADGROUP behind this script will read (pipelined reads).
--
-- KEYS[1] :in   KEYS[2] :inflight: the batch is announced there
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] count
-- ARGV[4] the announcement's time (s), msgpack-encoded (a float64: 9 bytes)
--
-- Sent in one MULTI with `XREADGROUP GROUP group consumer COUNT count STREAMS :in >`
-- right behind it (workers/commit.py, read_commands), so nothing runs between the two:
-- the batch that read returns starts at the first entry after the group's last delivered
-- id. If there is one, HSET :inflight "<consumer>|<first id>" {first, n, ts} (msgpack, the
-- bytes of workers/ordering.py's announcement, written out here: not every Lua has
-- cmsgpack), n the read's COUNT (the batch holds at most that many; workers/ordering.py
-- only asks n > 0). Returns the field, or "" when the read will return nothing.
--
-- A worker sends the MULTI in the write of its commit, behind the script: the batch after
-- next is read as the commit lands, and its announcement goes with the read, in the same
-- step, so no other worker can look at :inflight in between. The entries are not copied
-- through Lua (a script that ran the XREADGROUP itself cost redis-server 8.4 us a message
-- against 1.7 for the plain command: docs/performance.md, item 72).

local function mp_str(s)  -- (stream ids and these keys are shorter than 256 bytes)
  if #s < 32 then return string.char(0xa0 + #s) .. s end
  return string.char(0xd9, #s) .. s
end
local function mp_uint(n)
  if n < 128 then return string.char(n) end
  if n < 256 then return string.char(0xcc, n) end
  if n < 65536 then return string.char(0xcd, math.floor(n / 256), n % 256) end
  return string.char(0xce, math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
                     math.floor(n / 256) % 256, n % 256)
end

local last = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for k = 1, #g, 2 do info[g[k]] = g[k + 1] end
  if info['name'] == ARGV[1] then last = info['last-delivered-id'] end
end
if last == nil then return '' end
local after = redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', 1)
if #after == 0 then return '' end
local first = after[1][1]
local field = ARGV[2] .. '|' .. first
redis.call('HSET', KEYS[2], field, string.char(0x83) .. mp_str('first') .. mp_str(first)
           .. mp_str('n') .. mp_uint(tonumber(ARGV[3])) .. mp_str('ts') .. ARGV[4])
return field
