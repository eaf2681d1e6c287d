-- cooldown.lua: extend a summarizer provider's cooldown, never shorten it: a wait
-- the provider stated to one call holds every worker until it ends
-- (workers/summarizer/cooldown.py).
--
-- KEYS[1] cooldown   string the provider's cooldown, one per provider, model,
--                           endpoint and API key:
--                           {prefix}:cooldown:{provider}:{model}:{endpoint digest}
--                           then :{key fingerprint} when called with an API key
--                           (no session, no secret: hashed, fingerprinted)
-- ARGV[1] the wait in milliseconds (> 0)
-- ARGV[2] the value stored (the wait stated, for whoever reads the key)
--
-- Returns the cooldown left afterwards, in milliseconds: the new wait, or the
-- longer one already there.

local left = redis.call('PTTL', KEYS[1])
local wait = tonumber(ARGV[1])
if left >= wait then
  return left
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', wait)
return wait
