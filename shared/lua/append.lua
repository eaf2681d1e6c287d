-- append.lua: append messages to a session's log, all or nothing.
--
-- KEYS[1] log        list   message JSON, append-only
-- KEYS[2] cum        list   running token totals parallel to log (cum[i] = tokens of 0..i)
-- KEYS[3] state      hash   version, watermark, ... (created here with version 0)
-- KEYS[4..] other data keys of the session, only for the TTL refresh
-- ARGV[1] max messages per session
-- ARGV[2] ttl in seconds (0 = no expiry)
-- ARGV[3] n, then n pairs: ARGV[4+2i] message JSON, ARGV[5+2i] its token estimate
--
-- Returns {new_length, watermark, version, tokens_before_append}
-- or the error reply "SESSION_FULL <current length>".

local max_len = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local len = redis.call('LLEN', KEYS[1])
if len + n > max_len then
  return redis.error_reply('SESSION_FULL ' .. len)
end

local total = 0
if len > 0 then
  total = tonumber(redis.call('LINDEX', KEYS[2], -1)) or 0
end
local before = total
local msgs = {}
local cums = {}
for i = 0, n - 1 do
  msgs[#msgs + 1] = ARGV[4 + 2 * i]
  total = total + tonumber(ARGV[5 + 2 * i])
  cums[#cums + 1] = total
end
if n > 0 then
  redis.call('RPUSH', KEYS[1], unpack(msgs))
  redis.call('RPUSH', KEYS[2], unpack(cums))
end
redis.call('HSETNX', KEYS[3], 'version', 0)
redis.call('HSETNX', KEYS[3], 'watermark', 0)
if ttl > 0 then
  for i = 1, #KEYS do
    redis.call('EXPIRE', KEYS[i], ttl)
  end
end
local state = redis.call('HMGET', KEYS[3], 'watermark', 'version')
return {len + n, tonumber(state[1]), tonumber(state[2]), before}
