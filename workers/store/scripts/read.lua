-- streamnb: announce the batch that the XREADGROUP behind this script will read (pipelined reads).
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
-- most that many, and workers/replication/ordering.py only asks n > 0). Returns the field, or "" when
-- the read will return nothing.
--
-- A worker sends the MULTI in the write of its commit, behind the script: the batch after
-- next is read as the commit lands, and its announcement goes with the read, in the same
-- step, so no other worker can look at :inflight in between. The entries are not copied
-- through Lua: a script that ran the XREADGROUP itself cost redis-server several times
-- what the plain command does.

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
redis.call('HSET', KEYS[2], field, first .. ' ' .. ARGV[3] .. ' ' .. ARGV[4])
return field
