-- cheap.lua: record cheap-stage decisions, first writer wins per message.
-- A decision, once made, never changes, so the view's prefix stays stable
-- (provider prompt caches keep hitting) until compaction moves the watermark.
--
-- KEYS[1] cheap    hash   message index -> decision JSON
-- KEYS[2] state    hash   cheap_gen is bumped when a decision is new (readers
--                         re-read decisions only then)
-- ARGV[1] ttl in seconds (0 = no expiry)
-- ARGV[2..] pairs: message index, decision JSON
--
-- Returns the number of decisions that were new.

local added = 0
for i = 2, #ARGV, 2 do
  added = added + redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
if added > 0 and KEYS[2] then
  redis.call('HINCRBY', KEYS[2], 'cheap_gen', 1)
end
local ttl = tonumber(ARGV[1])
if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
end
return added
