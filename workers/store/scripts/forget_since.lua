-- streamnb: take out what one source taught a model since a time (`streamnb forget
-- --source NAME --since TIME`, workers/client/forget_since.py), in one atomic step.
--
-- KEYS[1] :log   KEYS[2] :epochs   KEYS[3] :keys   KEYS[4] :keyorder   KEYS[5] :snapshot
-- ARGV[1] the source   ARGV[2] its epoch, as the caller read it   ARGV[3] the time (ms)
-- ARGV[4] the id of :log's last entry the caller summed ('' : the log was empty)
-- ARGV[5] the log entry to append (what the source taught since the time)
-- ARGV[6] msgpack of the source and of its epoch (the end of its records)
-- ARGV[7] msgpack of the source and of its next epoch
-- ARGV[8] '1' if the records of two fields (the default source's first epoch) are its
--
-- Refused, writing nothing: the log no longer holds every entry since the time (its trim
-- point, in :snapshot, is later), :log has an entry after ARGV[4] (the caller sums the
-- new ones and calls again), or the source's epoch moved. Else: the source's next epoch
-- (so what a commit in flight still teaches under the old one is applied nowhere), its
-- learn-once keys learnt since the time released (scored by their delta's time in
-- :keyorder, workers/store/scripts/commit.lua), those learnt before rewritten to the next
-- epoch, and the log entry. Returns {'ok', entry id, keys released, keys kept},
-- {'trimmed', trim point}, {'moved', last id} or {'epoch', current epoch}.

local source, epoch, since = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local trimmed = redis.call('HGET', KEYS[5], 'trimmed')
if trimmed then
  local ms, seq = string.match(trimmed, '^(%d+)-(%d+)$')
  if ms and (tonumber(ms) > since or (tonumber(ms) == since and tonumber(seq) > 0)) then
    return {'trimmed', trimmed}
  end
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local last_id = ''
if #last > 0 then last_id = last[1][1] end
if last_id ~= ARGV[4] then return {'moved', last_id} end
local current = tonumber(redis.call('HGET', KEYS[2], source) or '0')
if current ~= epoch then return {'epoch', tostring(current)} end

local old_tail, new_tail, two_fields = ARGV[6], ARGV[7], ARGV[8] == '1'
-- the keys learnt (or relearnt) since the time, by :keyorder's scores
local recent = {}
for _, key in ipairs(redis.call('ZRANGE', KEYS[4], since, '+inf', 'BYSCORE')) do
  recent[key] = true
end
-- A record is msgpack [label, weight] (the default source's first epoch: header byte
-- 0x92) or [label, weight, source, epoch] (0x94), the source and epoch last: a 4-field
-- record is the source's epoch's if it ends with their bytes (a source name is ASCII,
-- so the bytes of a packed name's header or of a wider int fall inside no other name).
-- Each page of HSCAN is changed as it comes (a record seen twice is no longer the old
-- epoch's the second time).
local four, two = string.char(0x94), string.char(0x92)
local n_released, n_kept, cursor = 0, 0, '0'
repeat
  local page = redis.call('HSCAN', KEYS[3], cursor, 'COUNT', 1000)
  cursor = page[1]
  local kv, released, rewritten = page[2], {}, {}
  for j = 1, #kv, 2 do
    local key, record = kv[j], kv[j + 1]
    local head = string.sub(record, 1, 1)
    local n = 0
    if head == four and string.sub(record, -#old_tail) == old_tail then n = 4
    elseif head == two and two_fields then n = 2 end
    if n > 0 and recent[key] then
      released[#released + 1] = key
    elseif n == 2 then  -- [label, weight] -> [label, weight, source, next epoch]
      rewritten[#rewritten + 1] = key
      rewritten[#rewritten + 1] = four .. string.sub(record, 2) .. new_tail
    elseif n == 4 then
      rewritten[#rewritten + 1] = key
      rewritten[#rewritten + 1] = string.sub(record, 1, #record - #old_tail) .. new_tail
    end
  end
  if #released > 0 then
    redis.call('HDEL', KEYS[3], unpack(released))
    redis.call('ZREM', KEYS[4], unpack(released))
  end
  if #rewritten > 0 then redis.call('HSET', KEYS[3], unpack(rewritten)) end
  n_released, n_kept = n_released + #released, n_kept + #rewritten / 2
until cursor == '0'
redis.call('HINCRBY', KEYS[2], source, 1)
local id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[5])
return {'ok', id, n_released, n_kept}
