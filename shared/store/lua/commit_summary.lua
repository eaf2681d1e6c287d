-- commit_summary.lua: the one compare-and-swap writer of compaction state.
--
-- KEYS[1] state      hash   version, watermark, summary_tokens, summary_kind; gone:
--                           the session was deleted (or expired), nothing is written
-- KEYS[2] sums       hash   watermark -> summary record JSON (a truncation keeps a real
--                           summary already there, see below)
-- KEYS[3] sumidx     zset   watermark scored by watermark (ordering, retention)
-- KEYS[4] log        list   read only: the watermark may not pass its length
-- KEYS[5] cheap      hash   message index -> cheap-stage decision; entries below
--                           the new watermark are dropped (no longer in any view)
-- KEYS[6]   cum        list   only for the TTL refresh
-- KEYS[7]   lease      string read only: the fencing check (never given a TTL here)
-- ARGV[1] expected version
-- ARGV[2] new watermark
-- ARGV[3] summary record JSON
-- ARGV[4] summary tokens
-- ARGV[5] summary kind (llm, offline, truncation)
-- ARGV[6] retention (summaries kept)
-- ARGV[7] ttl in seconds (0 = no expiry)
-- ARGV[8] lease token of the writer ('' = not fenced: the guard's truncation,
--         which holds no lease). A worker's token must still be the lease's value.
--
-- Returns {"ok", new_version, watermark}
--      or {"conflict", reason, current_version, current_watermark}
-- with reason "lease" (the writer's lease expired or moved to another job:
-- checked first, so a job that lost its lease never writes, even when the
-- version still matches), "gone" (no state: the session was deleted since the writer
-- read it; an absent state reads as version 0 and an empty log as length 0, so a commit
-- at watermark 0 passed every other check and made the session's keys again), "version"
-- (someone else wrote or history was edited), "backwards" (the watermark would move
-- back) or "beyond_log".

local expected = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
local cur = redis.call('HMGET', KEYS[1], 'version', 'watermark')
local version = tonumber(cur[1]) or 0
local cur_w = tonumber(cur[2]) or 0
if ARGV[8] ~= '' and redis.call('GET', KEYS[7]) ~= ARGV[8] then
  return {'conflict', 'lease', version, cur_w}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'conflict', 'gone', version, cur_w}
end
if version ~= expected then
  return {'conflict', 'version', version, cur_w}
end
if w < cur_w then
  return {'conflict', 'backwards', version, cur_w}
end
if w > redis.call('LLEN', KEYS[4]) then
  return {'conflict', 'beyond_log', version, cur_w}
end

-- A truncation never replaces a real summary kept at its watermark (one a rewind moved
-- back from: the log it covers is unchanged): the watermark moves to it, and it is
-- current again.
local record, tokens, kind = ARGV[3], ARGV[4], ARGV[5]
if kind == 'truncation' then
  local kept = redis.call('HGET', KEYS[2], w)
  if kept then
    local ok, old = pcall(cjson.decode, kept)
    if ok and type(old) == 'table' and old.kind ~= 'truncation'
        and type(old.kind) == 'string' and tonumber(old.tokens) then
      record, tokens, kind = kept, tostring(old.tokens), old.kind
    end
  end
end
redis.call('HSET', KEYS[2], w, record)
redis.call('ZADD', KEYS[3], w, w)
version = version + 1
redis.call('HSET', KEYS[1], 'version', version, 'watermark', w,
  'summary_tokens', tokens, 'summary_kind', kind)

for _, field in ipairs(redis.call('HKEYS', KEYS[5])) do
  if tonumber(field) < w then
    redis.call('HDEL', KEYS[5], field)
  end
end

local retention = tonumber(ARGV[6])
local count = redis.call('ZCARD', KEYS[3])
if count > retention then
  for _, old in ipairs(redis.call('ZRANGE', KEYS[3], 0, count - retention - 1)) do
    if tonumber(old) ~= w then
      redis.call('ZREM', KEYS[3], old)
      redis.call('HDEL', KEYS[2], old)
    end
  end
end

local ttl = tonumber(ARGV[7])
if ttl > 0 then
  for i = 1, 6 do
    redis.call('EXPIRE', KEYS[i], ttl)
  end
end
return {'ok', version, w}
