-- retotal.lua: write a damaged session's running token totals again, counted by the
-- caller from its intact log, so that it keeps its history.
--
-- KEYS[1] log      list   checked: still the length the totals were counted from
-- KEYS[2] cum      list   replaced: running totals parallel to log
-- KEYS[3] state    hash   checked: its watermark; a new epoch if it exists
-- ARGV[1] the log's length the totals were counted at
-- ARGV[2] a new epoch: readers that cached the session's view (by epoch and version)
--         read it again, with these totals
-- ARGV[3..] the running totals, cum[0] .. cum[length - 1]
--
-- Written only if the session is still damaged in this way alone: the log has that
-- length and is not empty, the watermark is within it, and the totals differ from it
-- in length. Appends refuse a damaged session (append.lua), so the log cannot have
-- grown meanwhile; an edit or a reset that changed it makes this a no-op, and the
-- caller looks again.
--
-- Returns 1 when the totals were written, 0 when nothing was.

local len = redis.call('LLEN', KEYS[1])
local expected = tonumber(ARGV[1])
if len ~= expected or len == 0 or #ARGV - 2 ~= len then
  return 0
end
local watermark = tonumber(redis.call('HGET', KEYS[3], 'watermark')) or 0
if watermark > len or redis.call('LLEN', KEYS[2]) == len then
  return 0
end
redis.call('DEL', KEYS[2])
local chunk = 1000
for first = 3, #ARGV, chunk do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, first, math.min(first + chunk - 1, #ARGV)))
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], 'epoch', ARGV[2])
end
return 1
