-- rewind.lua: make the summary at an earlier (or any kept) watermark current.
-- The log is untouched; 0 means "no summary, send the whole log".
--
-- KEYS[1] state    hash   version, watermark, summary_tokens, summary_kind; gone: no
--                         such session (deleted or expired), nothing is written
--                         (a rewind to 0 needs no kept summary: it made a state of
--                         its own, with no TTL where sessions have none)
-- KEYS[2] sums     hash   read: the target summary must exist
-- KEYS[3] cheap    hash   cleared: decisions were made for the old view
-- KEYS[4] log      list   read only: its length is returned
-- KEYS[5..] other data keys, only for the TTL refresh
-- ARGV[1] watermark
-- ARGV[2] ttl in seconds (0 = no expiry)
--
-- Returns {new_version, watermark, length} ({0, 0, 0} when the state is gone: no
-- session, nothing to rewind) or the error reply "NO_SUMMARY <watermark>".

local w = tonumber(ARGV[1])
local tokens = 0
local kind = ''
if w ~= 0 then
  local raw = redis.call('HGET', KEYS[2], w)
  if not raw then
    return redis.error_reply('NO_SUMMARY ' .. w)
  end
  local record = cjson.decode(raw)
  tokens = record['tokens'] or 0
  kind = record['kind'] or ''
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, 0, 0}
end
redis.call('DEL', KEYS[3])
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('HSET', KEYS[1], 'watermark', w, 'summary_tokens', tokens, 'summary_kind', kind)
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  for i = 1, #KEYS do
    redis.call('EXPIRE', KEYS[i], ttl)
  end
end
return {version, w, redis.call('LLEN', KEYS[4])}
