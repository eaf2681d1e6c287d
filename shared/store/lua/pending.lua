-- pending.lua: set a session's pending flag if absent and, when this call set it,
-- push the summary job (the broker being this Redis server): one round trip for
-- both, and the flag is never set without its job.
--
-- KEYS[1] pending    string the coalescing flag of the summary job
-- KEYS[2] queue      list   the broker's queue (shared.core.records.InlineJob)
-- ARGV[1] the flag's ttl in seconds
-- ARGV[2] the queue's database and ARGV[3] the session's database
-- ARGV[4] the job message (the bytes kombu's Redis channel would push)
--
-- Returns 0 when the flag was already set (nothing pushed), 1 when this call set
-- it but left the push to the caller (the queue holds another type, or the server
-- refuses SELECT in scripts), 2 when it set it and pushed the job.

local job_db, own_db = ARGV[2], ARGV[3]
local job = job_db == own_db or not redis.pcall('SELECT', job_db).err
if job then
  local kind = redis.call('TYPE', KEYS[2]).ok
  job = kind == 'list' or kind == 'none'
  if job_db ~= own_db then
    redis.call('SELECT', own_db)
  end
end
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[1])) then
  return 0
end
if not job then
  return 1
end
if job_db ~= own_db then
  redis.call('SELECT', job_db)
end
redis.call('LPUSH', KEYS[2], ARGV[4])
if job_db ~= own_db then
  redis.call('SELECT', own_db)
end
return 2
