-- cheap.lua: record cheap-stage decisions, first writer wins per message.
-- A decision, once made, never changes, so the view's prefix stays stable
-- (provider prompt caches keep hitting) until compaction moves the watermark;
-- except a dedupe_read decision of rule 1 (stored before the rule field
-- existed), which views no longer apply (CheapDecision.current): a new
-- decision for its message replaces it.
-- Decisions point at message indexes of the view the guard read: when the
-- session's version moved since (a history edit, a rewind, a summary), those
-- indexes may hold other messages now, so nothing is written.
--
-- KEYS[1] cheap    hash   message index -> decision JSON
-- KEYS[2] state    hash   version (checked); cheap_gen is bumped when a
--                         decision is new (readers re-read decisions only then);
--                         gone: the session was deleted (or expired) since the
--                         guard read it, and nothing is written (an absent state
--                         reads as version 0, and the HINCRBY would make a state of
--                         its own, with no TTL, that no delete comes for)
-- ARGV[1] ttl in seconds (0 = no expiry)
-- ARGV[2] the session version the decisions were planned at ('' = unchecked)
-- ARGV[3..] pairs: message index, decision JSON
--
-- Returns the number of decisions that were new, or -1 when the version moved or the
-- state is gone.

if redis.call('EXISTS', KEYS[2]) == 0 then
  return -1
end
if ARGV[2] ~= '' then
  local version = redis.call('HGET', KEYS[2], 'version') or '0'
  if version ~= ARGV[2] then
    return -1
  end
end
local added = 0
local function stale(decision)
  return string.find(decision, '"stage"%s*:%s*"dedupe_read"') ~= nil
    and string.find(decision, '"rule"%s*:') == nil
end
for i = 3, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  if not old or stale(old) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    added = added + 1
  end
end
if added > 0 then
  redis.call('HINCRBY', KEYS[2], 'cheap_gen', 1)
end
local ttl = tonumber(ARGV[1])
if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
end
return added
