-- streamnb: the atomic commit of one batch of one model (all keys share the hash tag).
--
-- Arguments (built by workers/store/commit.py, script_args, which documents each one):
-- ARGV[1] = h, then h pairs `name value`, read into the table A below; the lists (ids,
-- outputs, dead letters, cache writes, compare-and-sets) follow, each where A says
-- (`<list>_at`, with `n_<list>` items). KEYS[1] :in, KEYS[2] :out, KEYS[3] :dead,
-- KEYS[4] :log, KEYS[5] :learnt; the other keys are where A says (`*_key_at`, 0: none).
--
-- A class removal (`drops_at`) appends its log entry after the delta and the decay events
-- and releases the learn-once keys recorded under the class.
--
-- Nothing is written unless every id is still pending for this consumer, every
-- compare-and-set finds the cache entry the worker read, no learn-once key the batch
-- learns is recorded and each key it forgets or relearns holds the record read. Returns {"ok", log
-- id or "", previous log id, delta id}, {"lost", ids...}, {"conflict", compare-and-set
-- numbers...} or {"keys", keys not as the worker took them...}.
-- The log id is the id of the last entry written to :log, the delta id that of the delta
-- entry (both "" if none), and the previous log id the id of :log's last entry before this
-- commit wrote any ("" if :log was empty or nothing was written): a worker whose model is
-- at that version applies its own delta without reading it back (workers/replication/replica.py). A
-- replay of a commit that already ran finds its ids acknowledged and returns "lost"
-- without writing: the commit is idempotent.

local A = {}
for i = 2, 1 + 2 * tonumber(ARGV[1]), 2 do A[ARGV[i]] = ARGV[i + 1] end
local function n(name) return tonumber(A[name]) end

local group, consumer = A.group, A.consumer
local first_id, n_ids = n('ids_at'), n('n_ids')
local first_out, n_out = n('outputs_at'), n('n_outputs')
local first_dead, n_dead = n('dead_at'), n('n_dead')
local first_write, n_writes, write_keys = n('writes_at'), n('n_writes'), n('write_keys_at')
local first_cas, n_cas, cas_keys = n('cas_at'), n('n_cas'), n('cas_keys_at')
local log_data, n_learnt = A.log_data, n('n_learnt')
local decay_every, decay_data = n('decay_every'), A.decay_data
local inflight_field = A.inflight_field
local first_drop, n_drops = n('drops_at'), n('n_drops')

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

-- 2. compare-and-set preconditions of the delayed-label cache: each cache entry is still
-- the bytes the worker read (workers/store/label_cache.py owns what they hold)
local conflicts = {}
for c = 0, n_cas - 1 do
  local b = first_cas + 3 * c
  if redis.call('HGET', KEYS[cas_keys + c], ARGV[b]) ~= ARGV[b + 1] then
    conflicts[#conflicts + 1] = tostring(c)
  end
end
if #conflicts > 0 then
  table.insert(conflicts, 1, 'conflict')
  return conflicts
end

-- 2b. learn-once keys: none the batch learns is recorded yet, and each it forgets or
-- relearns under another label still holds the record whose statistics the delta subtracts
local keys_at, keyorder_at = n('keys_key_at'), n('keyorder_key_at')
local first_learn, n_learn = n('learn_at'), n('n_learn')
local first_forget, n_forget = n('forget_at'), n('n_forget')
local first_relabel, n_relabel = n('relabel_at'), n('n_relabel')
local changed = {}
for i = first_learn, first_learn + 2 * (n_learn - 1), 2 do
  if redis.call('HEXISTS', KEYS[keys_at], ARGV[i]) == 1 then changed[#changed + 1] = ARGV[i] end
end
for i = first_forget, first_forget + 2 * (n_forget - 1), 2 do
  if redis.call('HGET', KEYS[keys_at], ARGV[i]) ~= ARGV[i + 1] then
    changed[#changed + 1] = ARGV[i]
  end
end
for i = first_relabel, first_relabel + 3 * (n_relabel - 1), 3 do
  if redis.call('HGET', KEYS[keys_at], ARGV[i]) ~= ARGV[i + 1] then
    changed[#changed + 1] = ARGV[i]
  end
end
if #changed > 0 then
  table.insert(changed, 1, 'keys')
  return changed
end

-- 3. writes
local log_id, prev_id, delta_id = '', '', ''
if log_data ~= '' or (n_learnt > 0 and decay_every > 0) or n_drops > 0 then
  local last = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)
  if #last > 0 then prev_id = last[1][1] end
end
if log_data ~= '' then
  if inflight_field ~= '' then
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
-- the classes removed, after the batch's delta (docs/worker.md, "Removing a class")
for i = first_drop, first_drop + 2 * (n_drops - 1), 2 do
  log_id = redis.call('XADD', KEYS[4], '*', 'data', ARGV[i])
end
-- XADD ARGV[first .. first + count - 1] to key, then trim it once with MAXLEN ~ maxlen
-- (0: untrimmed): the same stream as trimming at each XADD, in less of Redis' time
local function xadd_all(key, maxlen, first, count)
  for i = first, first + count - 1 do
    redis.call('XADD', key, '*', 'data', ARGV[i])
  end
  if maxlen > 0 and count > 0 then
    redis.call('XTRIM', key, 'MAXLEN', '~', maxlen)
  end
end
xadd_all(KEYS[2], n('out_maxlen'), first_out, n_out)
xadd_all(KEYS[3], n('dead_maxlen'), first_dead, n_dead)
-- the cache: per write its TTL (ms), its number v of values and v values (field, entry,
-- field, entry, ...), written in HSETs of at most 500 values, then its expiry
local a = first_write
for w = 0, n_writes - 1 do
  local key, ttl, count = KEYS[write_keys + w], ARGV[a], tonumber(ARGV[a + 1])
  for i = a + 2, a + 1 + count, 500 do
    redis.call('HSET', key, unpack(ARGV, i, math.min(i + 499, a + 1 + count)))
  end
  redis.call('PEXPIRE', key, ttl)
  a = a + 2 + count
end
-- per compare-and-set: the field, the entry read (checked above), the entry to write
for c = 0, n_cas - 1 do
  local b = first_cas + 3 * c
  redis.call('HSET', KEYS[cas_keys + c], ARGV[b], ARGV[b + 2])
end
-- the keys learnt, ordered by the time (ms) of the delta that learnt them (the oldest
-- dropped beyond keys_max; `forget --source --since` tells by it what was learnt since a
-- time, workers/client/forget_since.py), and the keys forgotten
local learnt_ms = tonumber(string.match(delta_id, '^(%d+)-')) or 0
for i = first_learn, first_learn + 2 * (n_learn - 1), 2 do
  redis.call('HSET', KEYS[keys_at], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[keyorder_at], learnt_ms, ARGV[i])
end
for i = first_forget, first_forget + 2 * (n_forget - 1), 2 do
  redis.call('HDEL', KEYS[keys_at], ARGV[i])
  redis.call('ZREM', KEYS[keyorder_at], ARGV[i])
end
-- a relearnt key records its new label (checked above to hold the record read, so the
-- relearning happens once), and the time of the delta that relearnt it
for i = first_relabel, first_relabel + 3 * (n_relabel - 1), 3 do
  redis.call('HSET', KEYS[keys_at], ARGV[i], ARGV[i + 2])
  if keyorder_at > 0 then redis.call('ZADD', KEYS[keyorder_at], learnt_ms, ARGV[i]) end
end
local keys_max = n('keys_max')
if keys_at > 0 and keys_max > 0 and n_learn > 0 then
  local excess = redis.call('ZCARD', KEYS[keyorder_at]) - keys_max
  if excess > 0 then
    local dropped = redis.call('ZPOPMIN', KEYS[keyorder_at], excess)
    for i = 1, #dropped, 2 do redis.call('HDEL', KEYS[keys_at], dropped[i]) end
  end
end
-- a class removed releases the keys learnt under it: each record that holds the class's
-- prefix after its array header byte (its label packed: workers/wire/learn_keys.py,
-- record_prefix; the header is 2, 4 or 5 fields), found by HSCAN over
-- {M}:keys (at most learnt_keys_max records), the key then learnt afresh
if keys_at > 0 then
  for i = first_drop + 1, first_drop + 2 * n_drops - 1, 2 do
    local prefix, cursor = ARGV[i], '0'
    repeat
      local page = redis.call('HSCAN', KEYS[keys_at], cursor, 'COUNT', 1000)
      cursor = page[1]
      local kv = page[2]
      for j = 1, #kv, 2 do
        if string.sub(kv[j + 1], 2, #prefix + 1) == prefix then
          redis.call('HDEL', KEYS[keys_at], kv[j])
          redis.call('ZREM', KEYS[keyorder_at], kv[j])
        end
      end
    until cursor == '0'
  end
end
-- a source forgotten among them (`streamnb forget --source` through :in) counts its epoch up
for i = n('bumps_at'), n('bumps_at') + n('n_bumps') - 1 do
  redis.call('HINCRBY', KEYS[n('epochs_key_at')], ARGV[i], 1)
end
if n('registry_key_at') > 0 then
  redis.call('HSET', KEYS[n('registry_key_at')], A.registry_field, A.registry_value)
end
for i = first_id, first_id + n_ids - 1, 500 do
  redis.call('XACK', KEYS[1], group, unpack(ARGV, i, math.min(i + 499, first_id + n_ids - 1)))
end
if n('inflight_key_at') > 0 then
  redis.call('HDEL', KEYS[n('inflight_key_at')], inflight_field)
end
return {'ok', log_id, prev_id, delta_id}
