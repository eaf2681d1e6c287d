-- truncate.lua: a history edit. Drops log positions >= index (the edited
-- or regenerated message and everything after it), bumps the version so
-- every in-flight compaction loses its compare-and-swap, and falls back to
-- the newest summary whose watermark <= index.
--
-- KEYS[1] log      list
-- KEYS[2] cum      list   trimmed in step with log
-- KEYS[3] state    hash   version, gen (log generation), watermark, summary_*, anchor_*;
--                         epoch read (ARGV[3]); gone: no session (deleted or expired),
--                         nothing to edit and nothing is written
-- KEYS[4] sums     hash   summaries past the index are deleted (they cover gone messages)
-- KEYS[5] sumidx   zset
-- KEYS[6] cheap    hash   decisions at or past the index are deleted, and so are
--                         decisions before it that point at a message at or past it
--                         (a dedupe_read placeholder whose later read the edit
--                         removed would hide the only remaining copy)
-- KEYS[7] ids      hash   provider tool-call id -> stored id of its newest call: a
--                         call the edit removes gives its provider id back to the
--                         newest earlier call of it (or frees it), so a call
--                         appended again after the edit keeps its own id
-- KEYS[8] reqs, KEYS[9] reqorder: request ids of appends the edit undid are forgotten
-- ARGV[1] index (0 <= index <= length)
-- ARGV[2] ttl in seconds (0 = no expiry)
-- ARGV[3] epoch, ARGV[4] log generation and ARGV[5] log length the caller read the
--         log at; ARGV[6] f, then f triples (provider id, stored id of a removed call,
--         stored id of the newest earlier call of that provider id or ''): found by the
--         caller with plain bounded reads (shared.store.edits). This script once read
--         the log itself, the whole prefix for every removed call still mapped: 37 s on
--         a 10k-message session, every other client of Redis waiting. The triples hold
--         only for the log they were read from: append-only while epoch and generation
--         hold, and of that length.
--
-- Returns {new_version, new_watermark, new_length, new_gen} ({0, 0, 0, 0} when the state
-- is gone: an empty log took index 0, and the edit made a state of its own), the error reply
-- "INDEX_OUT_OF_RANGE <length>", or "LOG_MOVED <length>" when the log is no longer the
-- one the caller read (nothing is written; it reads again).

local index = tonumber(ARGV[1])
local len = redis.call('LLEN', KEYS[1])
if index < 0 or index > len then
  return redis.error_reply('INDEX_OUT_OF_RANGE ' .. len)
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  return {0, 0, 0, 0}
end

local cur = redis.call('HMGET', KEYS[3], 'epoch', 'gen')
if (cur[1] or '') ~= ARGV[3] or (cur[2] or '0') ~= ARGV[4] or len ~= tonumber(ARGV[5]) then
  return redis.error_reply('LOG_MOVED ' .. len)
end

-- A fix applies only where the map still points at the removed call; 200 at a time, in
-- one HMGET, one HSET and one HDEL (a call from Lua costs ~5 us: two a fix made an edit
-- that removed ~1.5k mapped calls hold Redis 25 ms).
local f = tonumber(ARGV[6]) or 0
for from = 0, f - 1, 200 do
  local to = math.min(f, from + 200) - 1
  local providers = {}
  for i = from, to do
    providers[#providers + 1] = ARGV[7 + 3 * i]
  end
  local current = redis.call('HMGET', KEYS[7], unpack(providers))
  local set, drop = {}, {}
  for i = from, to do
    if current[i - from + 1] == ARGV[8 + 3 * i] then
      if ARGV[9 + 3 * i] ~= '' then
        set[#set + 1] = ARGV[7 + 3 * i]
        set[#set + 1] = ARGV[9 + 3 * i]
      else
        drop[#drop + 1] = ARGV[7 + 3 * i]
      end
    end
  end
  if #set > 0 then
    redis.call('HSET', KEYS[7], unpack(set))
  end
  if #drop > 0 then
    redis.call('HDEL', KEYS[7], unpack(drop))
  end
end

if index == 0 then
  redis.call('UNLINK', KEYS[1], KEYS[2])  -- freed off the main thread
else
  redis.call('LTRIM', KEYS[1], 0, index - 1)
  redis.call('LTRIM', KEYS[2], 0, index - 1)
end

for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. index, '+inf')) do
  redis.call('ZREM', KEYS[5], w)
  redis.call('HDEL', KEYS[4], w)
end
local cheap = redis.call('HGETALL', KEYS[6])
for i = 1, #cheap, 2 do
  local field = cheap[i]
  local drop = tonumber(field) >= index
  if not drop then
    local ok, decision = pcall(cjson.decode, cheap[i + 1])
    local target = ok and type(decision) == 'table' and tonumber(decision['refers_to']) or nil
    if target == nil then  -- decisions recorded before refers_to: the pointer in the text
      target = tonumber(string.match(cheap[i + 1], 'at message #(%d+)'))
    end
    drop = target ~= nil and target >= index
  end
  if drop then
    redis.call('HDEL', KEYS[6], field)
  end
end

if KEYS[9] then
  local reqs = redis.call('HGETALL', KEYS[8])
  for i = 1, #reqs, 2 do
    local length = tonumber(string.match(reqs[i + 1], '^(%d+):'))
    if length == nil or length > index then
      redis.call('HDEL', KEYS[8], reqs[i])
      redis.call('LREM', KEYS[9], 0, reqs[i])
    end
  end
end

local new_w = 0
local tokens = 0
local kind = ''
local best = redis.call('ZREVRANGEBYSCORE', KEYS[5], index, '-inf', 'LIMIT', 0, 1)
if #best > 0 then
  new_w = tonumber(best[1])
  local record = cjson.decode(redis.call('HGET', KEYS[4], best[1]))
  tokens = record['tokens'] or 0
  kind = record['kind'] or ''
end
local version = redis.call('HINCRBY', KEYS[3], 'version', 1)
local gen = redis.call('HINCRBY', KEYS[3], 'gen', 1)  -- the log changed: cached copies are stale
redis.call('HSET', KEYS[3], 'watermark', new_w, 'summary_tokens', tokens, 'summary_kind', kind)
redis.call('HDEL', KEYS[3], 'anchor_reported', 'anchor_estimated', 'anchor_end', 'anchor_version')

local ttl = tonumber(ARGV[2])
if ttl > 0 then
  for i = 1, math.min(#KEYS, 7) do  -- the request ids keep their own, shorter expiry
    redis.call('EXPIRE', KEYS[i], ttl)
  end
end
return {version, new_w, index, gen}
