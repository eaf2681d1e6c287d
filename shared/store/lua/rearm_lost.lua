-- rearm_lost.lua: the workers' sweep (workers.sweep) re-arms the pending flag of a
-- session whose summary job was lost, so that exactly one caller publishes it again.
--
-- KEYS[1] pending  string the coalescing flag of the summary job (set by the append)
-- KEYS[2] lease    string a worker's lease of the session (shared.store.lease)
-- ARGV[1] the flag's ttl in seconds (the TTL its setter gave it)
-- ARGV[2] the stale age in seconds (> 0): the rule of append.lua and pending.lua, a
--         flag older than that (ttl - PTTL) had no worker claim its job
--
-- Returns 1 when the flag stood at least the stale age, no worker holds the lease, and
-- this call set it again with a fresh TTL: the caller publishes the job. 0 otherwise,
-- with nothing changed: no flag (a worker claimed the job: claim deletes it), a young
-- one (set or re-armed meanwhile by an append or another sweeper: its setter publishes),
-- one without an expiry (its age cannot be told), or a held lease (a job runs now).
-- Setting only an existing flag, in one script with its age and the lease, is what
-- makes two sweepers, or a sweeper and an append, publish once per stale period.

local ttl, stale = tonumber(ARGV[1]), tonumber(ARGV[2])
if stale <= 0 or redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local left = redis.call('PTTL', KEYS[1])
if left < 0 or ttl * 1000 - left < stale * 1000 then
  return 0
end
redis.call('SET', KEYS[1], '1', 'EX', ttl)
return 1
