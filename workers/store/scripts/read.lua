-- streamnb: announce the batch that the XREADGROUP behind this script will read.
--
-- KEYS[1] :in   KEYS[2] :inflight: the batch is announced there
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] count   ARGV[4] the announcement's time
-- (ARGV[3] and ARGV[4] as workers/replication/ordering.py writes them in an announcement)
--
-- Sent in one MULTI with `XREADGROUP GROUP group consumer COUNT count STREAMS :in >`
-- right behind it (workers/worker/intake.py, read_commands), so nothing runs between the two:
-- the batch that read returns starts at the first entry after the group's last delivered
-- id. If there is one, HSET :inflight "<consumer>|<first id>" "<first id> <count> <time>",
-- the announcement workers/replication/ordering.py writes (count: the read's COUNT; the batch holds at
-- most that many, and workers/replication/ordering.py only asks n > 0).
-- Returns {field, last}: the field ("" when the read will return nothing) and the group's
-- last delivered id ("" without the group), from which a worker with nothing to read
-- waits for new entries (XREAD BLOCK), then reads again.
--
-- Every read of new entries with ordered predictions goes so, the worker's own reads and
-- the read a pipelined commit carries behind its script: a worker that looks at :inflight
-- after its read sees the announcement of every batch delivered before it. The entries
-- are not copied through Lua: a script that ran the XREADGROUP itself cost redis-server
-- several times what the plain command does.

local last = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for k = 1, #g, 2 do info[g[k]] = g[k + 1] end
  if info['name'] == ARGV[1] then last = info['last-delivered-id'] end
end
if last == nil then return {'', ''} end
local after = redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', 1)
if #after == 0 then return {'', last} end
local first = after[1][1]
local field = ARGV[2] .. '|' .. first
redis.call('HSET', KEYS[2], field, first .. ' ' .. ARGV[3] .. ' ' .. ARGV[4])
return {field, last}
