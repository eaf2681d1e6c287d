-- request_failure.lua: record compaction requests given up on in the session's state
-- (shared/store/lease.py, LeaseHolder._give_up), only while the session exists.
--
-- KEYS[1] state    hash   requests_failed (incremented), last_request_failure (set);
--                         gone: the session was deleted (or expired) since the job
--                         read it, and nothing is written: an HINCRBY would make a
--                         state of its own, with no TTL, that no delete comes for
-- ARGV[1] requests given up on (>= 1)
-- ARGV[2] the failure's detail (JSON: when, why, which)
--
-- Returns 1 when recorded, 0 when the state was gone (nothing written).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], 'requests_failed', ARGV[1])
redis.call('HSET', KEYS[1], 'last_request_failure', ARGV[2])
return 1
