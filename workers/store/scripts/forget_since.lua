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
local records, cursor = {}, '0'
repeat
  local page = redis.call('HSCAN', KEYS[3], cursor, 'COUNT', 1000)
  cursor = page[1]
  for j = 1, #page[2], 2 do records[#records + 1] = {page[2][j], page[2][j + 1]} end
until cursor == '0'
local released, kept = 0, 0
for _, kv in ipairs(records) do
  local key, record = kv[1], kv[2]
  local ok, fields = pcall(cmsgpack.unpack, record)
  if ok and type(fields) == 'table' then
    local n = #fields
    local mine = (n == 4 and fields[3] == source and fields[4] == epoch and
                  string.sub(record, -#old_tail) == old_tail) or (n == 2 and two_fields)
    if mine then
      local score = tonumber(redis.call('ZSCORE', KEYS[4], key))
      if score and score >= since then
        redis.call('HDEL', KEYS[3], key)
        redis.call('ZREM', KEYS[4], key)
        released = released + 1
      else
        if n == 2 then  -- [label, weight] -> [label, weight, source, next epoch]
          record = string.char(0x94) .. string.sub(record, 2) .. new_tail
        else
          record = string.sub(record, 1, #record - #old_tail) .. new_tail
        end
        redis.call('HSET', KEYS[3], key, record)
        kept = kept + 1
      end
    end
  end
end
redis.call('HINCRBY', KEYS[2], source, 1)
local id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[5])
return {'ok', id, released, kept}
