-- streamnb: the atomic commit of one batch of one model (all keys share the hash tag).
--
-- KEYS[1] :in   KEYS[2] :out   KEYS[3] :dead   KEYS[4] :log   KEYS[5] :learnt
-- KEYS[5 + i]   the cache key of cache operation i
-- KEYS[6 + n cache operations] (optional) :inflight: the batch's announcement is deleted
--                 with the commit (ordered predictions, workers/ordering.py)
-- ARGV[1] group           ARGV[2] consumer       ARGV[3] out MAXLEN ~ (0: none)
-- ARGV[4] dead MAXLEN ~   ARGV[5] log entry data ("" : no log entry)
-- ARGV[6] messages learnt (adds to :learnt)      ARGV[7] decay every K learnt (0: never)
-- ARGV[8] decay event data                        ARGV[9] n ids  ARGV[10] n outputs
-- ARGV[11] n dead letters  ARGV[12] n cache operations
-- then the ids, the outputs, the dead letters, and 7 values per cache operation:
--   "new", row, pred, learnt, weight, ts, ttl_ms      (write a message's cache entry)
--   "cas", expected learnt, new learnt, "", "", "", "" (change the learnt label if unchanged)
-- then, with the :inflight key, the field to delete (the batch's announcement); the log
-- entry then names it too (field "inflight"), so a worker waiting for that batch knows it
-- is committed from the entry alone (workers/ordering.py)
--
-- Nothing is written unless every id is still pending for this consumer and every "cas"
-- finds the learnt label the worker saw. Returns {"ok", log id or "", previous log id,
-- delta id}, {"lost", ids...} or {"conflict", cache operation numbers...}. The log id is
-- the id of the last entry written to :log, the delta id that of the delta entry (both ""
-- if none), and the previous log id the id of :log's last entry before this commit wrote
-- any ("" if :log was empty or nothing was written): a worker whose model is at that
-- version applies its own delta without reading it back (workers/replica.py). A replay of a commit that already ran
-- finds its ids acknowledged and returns "lost" without writing: the commit is idempotent.

local group, consumer = ARGV[1], ARGV[2]
local out_maxlen, dead_maxlen = tonumber(ARGV[3]), tonumber(ARGV[4])
local log_data, n_learnt = ARGV[5], tonumber(ARGV[6])
local decay_every, decay_data = tonumber(ARGV[7]), ARGV[8]
local n_ids, n_out, n_dead, n_cache =
    tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local first_id, first_out = 13, 13 + n_ids
local first_dead = first_out + n_out
local first_cache = first_dead + n_dead

-- 1. ownership: every id still pending for this consumer. One XPENDING lists the
-- consumer's pending entries between the smallest and the largest id; an id it does not
-- list (not pending, or the reply was cut at its count) is asked alone, as before.
local function parse_id(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  if ms == nil then return nil end
  return tonumber(ms), tonumber(seq)
end
local listed = {}
local lo_ms, lo_seq = nil, nil
if n_ids > 0 then lo_ms, lo_seq = parse_id(ARGV[first_id]) end
local hi_ms, hi_seq, lo_id, hi_id = lo_ms, lo_seq, ARGV[first_id], ARGV[first_id]
for i = first_id + 1, first_id + n_ids - 1 do
  if lo_ms == nil then break end
  local ms, seq = parse_id(ARGV[i])
  if ms == nil then lo_ms = nil break end
  if ms < lo_ms or (ms == lo_ms and seq < lo_seq) then lo_ms, lo_seq, lo_id = ms, seq, ARGV[i] end
  if ms > hi_ms or (ms == hi_ms and seq > hi_seq) then hi_ms, hi_seq, hi_id = ms, seq, ARGV[i] end
end
if lo_ms ~= nil then
  local p = redis.call('XPENDING', KEYS[1], group, lo_id, hi_id, n_ids + 16, consumer)
  for _, e in ipairs(p) do listed[e[1]] = true end
end
local lost = {}
for i = first_id, first_id + n_ids - 1 do
  local id = ARGV[i]
  if not listed[id] then
    local p = redis.call('XPENDING', KEYS[1], group, id, id, 1, consumer)
    if #p == 0 then lost[#lost + 1] = id end
  end
end
if #lost > 0 then
  table.insert(lost, 1, 'lost')
  return lost
end

-- 2. compare-and-set preconditions of the delayed-label cache
local conflicts = {}
for c = 0, n_cache - 1 do
  local a = first_cache + 7 * c
  if ARGV[a] == 'cas' then
    local cur = redis.call('HGET', KEYS[6 + c], 'learnt')
    if cur ~= ARGV[a + 1] then conflicts[#conflicts + 1] = tostring(c) end
  end
end
if #conflicts > 0 then
  table.insert(conflicts, 1, 'conflict')
  return conflicts
end

-- 3. writes
local inflight_field = nil
if #KEYS > 5 + n_cache then inflight_field = ARGV[first_cache + 7 * n_cache] end
local log_id, prev_id, delta_id = '', '', ''
if log_data ~= '' or (n_learnt > 0 and decay_every > 0) then
  local last = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)
  if #last > 0 then prev_id = last[1][1] end
end
if log_data ~= '' then
  if inflight_field then
    log_id = redis.call('XADD', KEYS[4], '*', 'data', log_data, 'inflight', inflight_field)
  else
    log_id = redis.call('XADD', KEYS[4], '*', 'data', log_data)
  end
  delta_id = log_id
end
if n_learnt > 0 then
  local after = redis.call('INCRBY', KEYS[5], n_learnt)
  if decay_every > 0 then
    local before = after - n_learnt
    local events = math.floor(after / decay_every) - math.floor(before / decay_every)
    for _ = 1, events do
      log_id = redis.call('XADD', KEYS[4], '*', 'data', decay_data)
    end
  end
end
-- XADD ARGV[first .. first + n - 1] to key, then trim it once with MAXLEN ~ maxlen (0:
-- untrimmed): the same stream as trimming at each XADD, in less of Redis' time
-- (docs/performance.md, item 67)
local function xadd_all(key, maxlen, first, n)
  for i = first, first + n - 1 do
    redis.call('XADD', key, '*', 'data', ARGV[i])
  end
  if maxlen > 0 and n > 0 then
    redis.call('XTRIM', key, 'MAXLEN', '~', maxlen)
  end
end
xadd_all(KEYS[2], out_maxlen, first_out, n_out)
xadd_all(KEYS[3], dead_maxlen, first_dead, n_dead)
for c = 0, n_cache - 1 do
  local a = first_cache + 7 * c
  local key = KEYS[6 + c]
  if ARGV[a] == 'new' then
    redis.call('HSET', key, 'row', ARGV[a + 1], 'pred', ARGV[a + 2], 'learnt', ARGV[a + 3],
               'w', ARGV[a + 4], 't', ARGV[a + 5])
    redis.call('PEXPIRE', key, ARGV[a + 6])
  else
    redis.call('HSET', key, 'learnt', ARGV[a + 2])
  end
end
local chunk = 500
for i = first_id, first_id + n_ids - 1, chunk do
  local ids = {}
  for j = i, math.min(i + chunk - 1, first_id + n_ids - 1) do ids[#ids + 1] = ARGV[j] end
  redis.call('XACK', KEYS[1], group, unpack(ids))
end
if inflight_field then
  redis.call('HDEL', KEYS[6 + n_cache], inflight_field)
end
return {'ok', log_id, prev_id, delta_id}
