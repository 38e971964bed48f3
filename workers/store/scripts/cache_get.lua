-- streamnb: read the delayed-label cache entries of a batch's refs (workers/store/label_cache.py).
--
-- KEYS[1] {M}:cachebuckets (bucket width in ms -> "TTL ms:last write ms")
-- ARGV[1] now (ms)   ARGV[2] the bucket hashes' key prefix ("streamnb:{NAME}:cachebucket:")
-- ARGV[3] n refs, then two values per ref: its field ("r" .. id), its shard
--
-- The buckets a width may still hold run from the one of now or of its last write, the
-- later (plus one, for a writer whose clock is ahead), down to the one of now - TTL (minus
-- one, for a clock behind): about TTL / width + 3, at most 64 (writers' clocks may
-- differ by up to a bucket, TTL / 8). A width whose last write has expired is
-- removed from KEYS[1]. Each ref's field is looked up in those buckets, newest first, the
-- width written last first; the first found wins.
--
-- Returns one reply per ref: {bucket key, entry} if found, else {}.

local now, prefix, n_refs = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local widths = {}
local reg = redis.call('HGETALL', KEYS[1])
for i = 1, #reg, 2 do
  local w = tonumber(reg[i])
  local ttl, last = string.match(reg[i + 1], '^(%d+):(%d+)$')
  ttl, last = tonumber(ttl), tonumber(last)
  if w and w >= 1 and ttl and last then
    if last + ttl + 2 * w < now then
      redis.call('HDEL', KEYS[1], reg[i])
    else
      local newest = math.floor(math.max(last, now) / w) + 1
      local oldest = math.max(math.floor((now - ttl) / w) - 1, newest - 64)
      widths[#widths + 1] = {reg[i], newest, oldest, last}
    end
  end
end
table.sort(widths, function(a, b) return a[4] > b[4] end)

local out = {}
for i = 0, n_refs - 1 do
  local field, shard = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  local found = {}
  for _, w in ipairs(widths) do
    for k = w[2], w[3], -1 do
      local key = prefix .. w[1] .. ':' .. string.format('%d', k) .. ':' .. shard
      local v = redis.call('HGET', key, field)
      if v then
        found = {key, v}
        break
      end
    end
    if #found > 0 then break end
  end
  out[#out + 1] = found
end
return out
