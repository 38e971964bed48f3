-- streamnb: the atomic commit of one batch of one model (all keys share the hash tag).
--
-- KEYS[1] :in   KEYS[2] :out   KEYS[3] :dead   KEYS[4] :log   KEYS[5] :learnt
-- KEYS[5 + i]   the bucket hash of cache write i (workers/label_cache.py)
-- KEYS[5 + n cache writes + j]   the hash of cache compare-and-set j
-- then (optional) {M}:cachebuckets, if ARGV[14] is not "": its field ARGV[14] is set to
--                 ARGV[15] (the bucket width in use, with its TTL and this commit's time)
-- then (optional) :inflight: the batch's announcement is deleted with the commit (ordered
--                 predictions, workers/ordering.py)
-- ARGV[1] group           ARGV[2] consumer       ARGV[3] out MAXLEN ~ (0: none)
-- ARGV[4] dead MAXLEN ~   ARGV[5] log entry data ("" : no log entry)
-- ARGV[6] messages learnt (adds to :learnt)      ARGV[7] decay every K learnt (0: never)
-- ARGV[8] decay event data                        ARGV[9] n ids  ARGV[10] n outputs
-- ARGV[11] n dead letters  ARGV[12] n cache writes  ARGV[13] n compare-and-sets
-- ARGV[14], ARGV[15] the cache bucket registry's field and value ("" "": none)
-- then the ids, the outputs, the dead letters, then per cache write: its TTL (ms), the
-- number v of values, and v values (field, entry, field, entry, ...: HSET, then PEXPIRE);
-- then 4 values per compare-and-set: mode, field, expected learnt, new learnt. Mode "p":
-- the field's value starts with the learnt label (2 bytes of length, then the label: a
-- bucket entry); mode "f": the field's value is the learnt label itself (the field
-- "learnt" of a per-message hash of the layout before buckets)
-- then, with the :inflight key, the field to delete (the batch's announcement); the log
-- entry then names it too (field "inflight"), so a worker waiting for that batch knows it
-- is committed from the entry alone (workers/ordering.py)
--
-- Nothing is written unless every id is still pending for this consumer and every
-- compare-and-set finds the learnt label the worker saw. Returns {"ok", log id or "",
-- previous log id, delta id}, {"lost", ids...} or {"conflict", compare-and-set numbers...}.
-- The log id is
-- the id of the last entry written to :log, the delta id that of the delta entry (both ""
-- if none), and the previous log id the id of :log's last entry before this commit wrote
-- any ("" if :log was empty or nothing was written): a worker whose model is at that
-- version applies its own delta without reading it back (workers/replica.py). A replay of a commit that already ran
-- finds its ids acknowledged and returns "lost" without writing: the commit is idempotent.

local group, consumer = ARGV[1], ARGV[2]
local out_maxlen, dead_maxlen = tonumber(ARGV[3]), tonumber(ARGV[4])
local log_data, n_learnt = ARGV[5], tonumber(ARGV[6])
local decay_every, decay_data = tonumber(ARGV[7]), ARGV[8]
local n_ids, n_out, n_dead, n_writes, n_cas =
    tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]),
    tonumber(ARGV[13])
local registry_field, registry_value = ARGV[14], ARGV[15]
local first_id, first_out = 16, 16 + n_ids
local first_dead = first_out + n_out
local first_write = first_dead + n_dead
-- where each cache write's values start, and the first compare-and-set's
local writes, a = {}, first_write
for w = 1, n_writes do
  local n = tonumber(ARGV[a + 1])
  writes[w] = {a, n}
  a = a + 2 + n
end
local first_cas = a
local next_key = 6 + n_writes + n_cas
local registry_key = nil
if registry_field ~= '' then
  registry_key = KEYS[next_key]
  next_key = next_key + 1
end
local inflight_key = KEYS[next_key]

-- 1. ownership: every id still pending for this consumer. One XPENDING lists the
-- consumer's pending entries between the first id and the last (the worker sends a
-- batch's ids in stream order, so these bound them: no parsing of ids here); an id it
-- does not list (not pending, outside that range, or the reply cut at its count) is
-- asked alone, so ids in any order are checked all the same.
local listed = {}
if n_ids > 0 then
  local p = redis.call('XPENDING', KEYS[1], group, ARGV[first_id],
                       ARGV[first_id + n_ids - 1], n_ids + 16, consumer)
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
local conflicts, current = {}, {}
for c = 0, n_cas - 1 do
  local b = first_cas + 4 * c
  local key, mode, expected = KEYS[6 + n_writes + c], ARGV[b], ARGV[b + 2]
  if mode == 'p' then
    local v = redis.call('HGET', key, ARGV[b + 1])
    local ok = false
    if v and #v >= 2 then
      local n = string.byte(v, 1) * 256 + string.byte(v, 2)
      ok = string.sub(v, 3, 2 + n) == expected
      current[c] = string.sub(v, 3 + n)
    end
    if not ok then conflicts[#conflicts + 1] = tostring(c) end
  elseif redis.call('HGET', key, ARGV[b + 1]) ~= expected then
    conflicts[#conflicts + 1] = tostring(c)
  end
end
if #conflicts > 0 then
  table.insert(conflicts, 1, 'conflict')
  return conflicts
end

-- 3. writes
local inflight_field = nil
if inflight_key then inflight_field = ARGV[first_cas + 4 * n_cas] end
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
-- the cache: each write's fields in HSETs of at most 500 values, then its expiry
for w = 1, n_writes do
  local key, b, n = KEYS[5 + w], writes[w][1], writes[w][2]
  for i = b + 2, b + 1 + n, 500 do
    redis.call('HSET', key, unpack(ARGV, i, math.min(i + 499, b + 1 + n)))
  end
  redis.call('PEXPIRE', key, ARGV[b])
end
for c = 0, n_cas - 1 do
  local b = first_cas + 4 * c
  local key, new = KEYS[6 + n_writes + c], ARGV[b + 3]
  if ARGV[b] == 'p' then
    redis.call('HSET', key, ARGV[b + 1],
               string.char(math.floor(#new / 256), #new % 256) .. new .. current[c])
  else
    redis.call('HSET', key, ARGV[b + 1], new)
  end
end
if registry_key then
  redis.call('HSET', registry_key, registry_field, registry_value)
end
for i = first_id, first_id + n_ids - 1, 500 do
  redis.call('XACK', KEYS[1], group, unpack(ARGV, i, math.min(i + 499, first_id + n_ids - 1)))
end
if inflight_field then
  redis.call('HDEL', inflight_key, inflight_field)
end
return {'ok', log_id, prev_id, delta_id}
