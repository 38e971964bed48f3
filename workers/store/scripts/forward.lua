-- streamnb: move the entries of a model's training stream into its :in, marked as training.
--
-- KEYS[1] :train   KEYS[2] :in   KEYS[3] :traintoken
-- ARGV[1] the most entries moved (0: none, the token only)   ARGV[2] a fresh token, stored if :traintoken holds none
--
-- Only the trainer's Redis user may write :train (deploy/redis/users.acl); the scorer may
-- write :in but read neither :in nor :traintoken. Each entry of :train is appended to :in
-- as `data <its data> auth <token>` and deleted from :train in this one script, so it is
-- moved exactly once whichever worker runs it, and in the order of :train. A worker
-- learns labels, delayed labels and forgets of a model stored with `training: train` only
-- from entries of :in carrying the token (workers/worker/batch.py, decode_entries); the
-- others are dead letters `label_not_allowed`. An entry without a data field is moved
-- without one (a `no_data` dead letter). Returns {entries moved, the token}.

local token = redis.call('GET', KEYS[3])
if not token then
  token = ARGV[2]
  redis.call('SET', KEYS[3], token)
end
local got = {}
if tonumber(ARGV[1]) > 0 then
  got = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', tonumber(ARGV[1]))
end
for _, entry in ipairs(got) do
  local fields, data = entry[2], nil
  for i = 1, #fields, 2 do
    if fields[i] == 'data' then data = fields[i + 1] end
  end
  if data then
    redis.call('XADD', KEYS[2], '*', 'data', data, 'auth', token)
  else
    redis.call('XADD', KEYS[2], '*', 'auth', token)
  end
  redis.call('XDEL', KEYS[1], entry[1])
end
return {#got, token}
