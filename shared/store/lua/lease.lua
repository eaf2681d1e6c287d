-- lease.lua: a per-session worker lease (taken once, released or extended only by its
-- owner) and the requests left for its owner by jobs that found it busy.
--
-- KEYS[1] lease    string  the owner's random token, with an expiry
-- KEYS[2] dirty    string  requests left for the owner, one line each (appended)
-- KEYS[3] taken    string  the requests the owner took and is running
-- KEYS[4] pending  string  the "a job is queued" flag ("claim" only)
-- (the protocol as a whole: shared/store/lease.py; commits are fenced with the
-- owner token in commit_summary.lua)
-- ARGV[1] owner token
-- ARGV[2] "claim", "acquire", "release", "extend" or "finish"
-- ARGV[3] the lease's expiry in milliseconds
-- ARGV[4] the expiry of kept requests in milliseconds
--
-- "acquire": take the lease if free (1, else 0). Requests a previous owner
--   took but never finished (it died: their key outlives its lease) go back
--   to the front of the dirty flag, for the new owner to run.
-- "claim": clear the pending flag (later turns enqueue a new job), then acquire.
--   Both answer 1 when the caller's token holds the lease already (extended): a
--   claim sent again after a timeout finds the lease its first attempt took.
-- "release": 1 when the caller owned the lease (released, its taken
--   requests forgotten: it ran them or put them back), 0 otherwise.
-- "extend": 1 when the caller owned the lease (extended), 0 otherwise: the
--   holder's renewal, every third of the TTL while it works.
-- "finish": the owner's last look and release in one step. The requests it
--   took before are done. {'lost'} when it no longer owns the lease
--   (nothing changed); {'released'} when no request was waiting; or
--   {'dirty', requests} when requests were waiting: they move to "taken"
--   and the lease is extended for the owner to run them. Releasing only in
--   a look that finds the flag empty leaves no moment in which a busy job's
--   request can land after the owner's last look and before its release.

local token, mode = ARGV[1], ARGV[2]
local lease_ms, keep_ms = tonumber(ARGV[3]), tonumber(ARGV[4])

if mode == 'claim' or mode == 'acquire' then
  if mode == 'claim' then
    redis.call('DEL', KEYS[4])
  end
  if not redis.call('SET', KEYS[1], token, 'NX', 'PX', lease_ms) then
    if redis.call('GET', KEYS[1]) == token then
      redis.call('PEXPIRE', KEYS[1], lease_ms)
      return 1
    end
    return 0
  end
  local orphaned = redis.call('GET', KEYS[3])
  if orphaned then
    local waiting = redis.call('GET', KEYS[2]) or ''
    redis.call('SET', KEYS[2], orphaned .. waiting, 'PX', keep_ms)
    redis.call('DEL', KEYS[3])
  end
  return 1
end

if redis.call('GET', KEYS[1]) ~= token then
  if mode == 'finish' then
    return {'lost'}
  end
  return 0
end

if mode == 'release' then
  redis.call('DEL', KEYS[1], KEYS[3])
  return 1
end
if mode == 'extend' then
  redis.call('PEXPIRE', KEYS[1], lease_ms)
  return 1
end

-- finish
redis.call('DEL', KEYS[3])
local requests = redis.call('GET', KEYS[2])
if requests then
  redis.call('SET', KEYS[3], requests, 'PX', keep_ms)
  redis.call('DEL', KEYS[2])
  redis.call('PEXPIRE', KEYS[1], lease_ms)
  return {'dirty', requests}
end
redis.call('DEL', KEYS[1])
return {'released'}
