-- view.lua: everything the guard needs for one prepare(), in one atomic read,
-- optionally only what changed since the caller's last read.
--
-- KEYS[1] state    hash   read whole
-- KEYS[2] log      list   read from the watermark (or the caller's end) to the end
-- KEYS[3] cum      list   lookups: tokens before the watermark, total, the caller's end
-- KEYS[4] sums     hash   the current summary record
-- KEYS[5] cheap    hash   cheap-stage decisions of the current view
-- KEYS[6] pending  string whether a job is queued
-- ARGV[1] the caller's epoch ('' = no cached view: read everything)
-- ARGV[2] the caller's version
-- ARGV[3] the caller's end: it holds log[watermark:end]
-- ARGV[4] the running token total at that end (cum[end - 1], 0 when end = 0)
--
-- The log is append-only while (epoch, version) stays the same: every edit
-- (truncate, rewind, summary commit) bumps the version, and a session that
-- is deleted and comes back gets a new epoch. So when both match and the
-- token total at the caller's end is unchanged, log[end:] is all that is new
-- and the summary is the one the caller holds.
--
-- Returns {state_json, messages_json, tokens_before_watermark, tokens_total,
--          length, summary_json_or_false, cheap_json, pending, start}
-- messages_json is a JSON array of log[start:]; start is the watermark for a
-- full read, the caller's end for an incremental one (summary then false).
-- Few reply elements on purpose: each costs the client a parse step.

local state = redis.call('HGETALL', KEYS[1])
local cur = redis.call('HMGET', KEYS[1], 'watermark', 'version', 'epoch')
local w = tonumber(cur[1]) or 0
local len = redis.call('LLEN', KEYS[2])
local total = 0
if len > 0 then
  total = tonumber(redis.call('LINDEX', KEYS[3], -1)) or 0
end

local start = w
if ARGV[1] ~= '' and cur[3] == ARGV[1] and cur[2] == ARGV[2] then
  local known = tonumber(ARGV[3])
  if known and known >= w and known <= len then
    local at = 0
    if known > 0 then
      at = tonumber(redis.call('LINDEX', KEYS[3], known - 1)) or -1
    end
    if at == tonumber(ARGV[4]) then
      start = known
    end
  end
end

local messages = '[]'
if start < len then
  messages = '[' .. table.concat(redis.call('LRANGE', KEYS[2], start, -1), ',') .. ']'
end
local before = 0
if w > 0 then
  before = tonumber(redis.call('LINDEX', KEYS[3], w - 1)) or 0
end
local summary = false
if start == w and w > 0 then
  summary = redis.call('HGET', KEYS[4], w) or false
end
local cheap = cjson.encode(redis.call('HGETALL', KEYS[5]))
local pending = redis.call('EXISTS', KEYS[6])
return {cjson.encode(state), messages, before, total, len, summary, cheap, pending, start}
