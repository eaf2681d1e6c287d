-- view.lua: everything the guard needs for one prepare(), in one atomic read.
--
-- KEYS[1] state    hash   read whole
-- KEYS[2] log      list   read from the watermark to the end
-- KEYS[3] cum      list   two lookups: tokens before the watermark, total
-- KEYS[4] sums     hash   the current summary record
-- KEYS[5] cheap    hash   cheap-stage decisions of the current view
-- KEYS[6] pending  string whether a job is queued
--
-- Returns {state_flat, messages, tokens_before_watermark, tokens_total,
--          length, summary_json_or_false, cheap_flat, pending}

local state = redis.call('HGETALL', KEYS[1])
local w = tonumber(redis.call('HGET', KEYS[1], 'watermark')) or 0
local len = redis.call('LLEN', KEYS[2])
local messages = redis.call('LRANGE', KEYS[2], w, -1)
local before = 0
if w > 0 then
  before = tonumber(redis.call('LINDEX', KEYS[3], w - 1)) or 0
end
local total = 0
if len > 0 then
  total = tonumber(redis.call('LINDEX', KEYS[3], -1)) or 0
end
local summary = false
if w > 0 then
  summary = redis.call('HGET', KEYS[4], w) or false
end
local cheap = redis.call('HGETALL', KEYS[5])
local pending = redis.call('EXISTS', KEYS[6])
return {state, messages, before, total, len, summary, cheap, pending}
