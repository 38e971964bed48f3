-- streamnb: read a worker's next batch and announce it, in one step (pipelined reads).
--
-- KEYS[1] :in   KEYS[2] (optional) :inflight: the batch is announced there
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] count
-- ARGV[4] the announcement's time (s), msgpack-encoded (a float64: 9 bytes)
--
-- XREADGROUP GROUP group consumer COUNT count STREAMS :in >, then, with :inflight and if
-- entries came, HSET :inflight "<consumer>|<first id>" {first, n, ts} (msgpack, the bytes
-- of workers/ordering.py's announcement, written out here: not every Lua has cmsgpack). Returns false when no entry came, else
-- {field ("" without :inflight), {{id, {field, value, ...}}, ...}}.
--
-- A worker sends this in the write of its commit, behind the script (workers/commit.py):
-- the batch after next is read as the commit lands, and its announcement goes with the
-- read, in the same step, so no other worker can look at :inflight in between.

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

local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                     'STREAMS', KEYS[1], '>')
if not r then return false end
-- {{stream, entries}} (fakeredis gives {stream, entries} for one stream)
local entries = type(r[1]) == 'table' and r[1][2] or r[2]
if entries == nil or #entries == 0 then return false end
local field = ''
if #KEYS > 1 then
  local first = entries[1][1]
  field = ARGV[2] .. '|' .. first
  redis.call('HSET', KEYS[2], field, string.char(0x83) .. mp_str('first') .. mp_str(first)
             .. mp_str('n') .. mp_uint(#entries) .. mp_str('ts') .. ARGV[4])
end
return {field, entries}
