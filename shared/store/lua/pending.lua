-- pending.lua: set a session's pending flag if absent (or re-arm a stale one) and, when
-- this call set it and a job is given, push the summary job (the broker being this Redis
-- server): one round trip for both, and the flag is never set without its job.
--
-- KEYS[1] pending    string the coalescing flag of the summary job
-- KEYS[2] queue      list   optional: the broker's queue (shared.core.records.InlineJob);
--                           without it the caller publishes the job
-- ARGV[1] the flag's ttl in seconds
-- ARGV[2] the stale age in seconds: a flag older than that (ttl - PTTL: no worker
--         claimed its job) is re-armed as if it was absent (0 = never)
-- ARGV[3] the queue's database and ARGV[4] the session's database (with KEYS[2])
-- ARGV[5] the job message (the bytes kombu's Redis channel would push; with KEYS[2])
--
-- Returns 0 when the flag was already set (nothing pushed), 1 when this call set
-- it but left the push to the caller (no queue given, the queue holds another type,
-- or the server refuses SELECT in scripts), 2 when it set it and pushed the job;
-- 3 and 4 the same as 1 and 2 for a stale flag this call re-armed with a fresh TTL
-- (the job is published again: the first one was lost, or waits that long).

local ttl, stale = tonumber(ARGV[1]), tonumber(ARGV[2])
local job = KEYS[2] ~= nil
local job_db, own_db = ARGV[3], ARGV[4]
if job then
  job = job_db == own_db or not redis.pcall('SELECT', job_db).err
end
if job then
  local kind = redis.call('TYPE', KEYS[2]).ok
  job = kind == 'list' or kind == 'none'
  if job_db ~= own_db then
    redis.call('SELECT', own_db)
  end
end

local marked = 0
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ttl) then
  marked = 1
elseif stale > 0 then
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and ttl * 1000 - left >= stale * 1000 then
    redis.call('SET', KEYS[1], '1', 'EX', ttl)
    marked = 3
  end
end
if marked == 0 or not job then
  return marked
end
if job_db ~= own_db then
  redis.call('SELECT', job_db)
end
redis.call('LPUSH', KEYS[2], ARGV[5])
if job_db ~= own_db then
  redis.call('SELECT', own_db)
end
return marked + 1
