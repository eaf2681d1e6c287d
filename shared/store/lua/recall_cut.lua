-- recall_cut.lua: a history edit at `index` (truncate_after): forget every indexed
-- passage of messages >= index, and mark the index as describing the current log.
-- Postings of forgotten passages stay in the term strings; their passage ids are
-- never reused and their docs are gone, so queries skip them.
--
-- KEYS[1] rx:meta  hash   hwm, n_docs, total_len, stale (passages forgotten so far:
--                         the indexer rebuilds when they outnumber the live ones),
--                         gen (set to the state's gen)
-- KEYS[2] rx:doc   hash   docs of passages of messages >= index are deleted
-- KEYS[3] rx:mp    list   trimmed to the first `index` messages
-- KEYS[4] state    hash   read only: 'gen'
-- ARGV[1] index
--
-- Returns {passages_removed, hwm_after}.

local index = tonumber(ARGV[1])
local meta = redis.call('HMGET', KEYS[1], 'hwm', 'next_pid')
if not meta[1] then
  return {0, 0}
end
local hwm = tonumber(meta[1])
local removed = 0
if index < hwm then
  local first = tonumber(redis.call('LINDEX', KEYS[3], index))
  local last = tonumber(meta[2]) - 1
  local total = 0
  if first then
    for pid = first, last do
      local doc = redis.call('HGET', KEYS[2], pid)
      if doc then
        local len = string.match(doc, ':(%d+)$')
        total = total + (tonumber(len) or 0)
        redis.call('HDEL', KEYS[2], pid)
        removed = removed + 1
      end
    end
  end
  if index == 0 then
    redis.call('DEL', KEYS[3])
  else
    redis.call('LTRIM', KEYS[3], 0, index - 1)
  end
  redis.call('HINCRBY', KEYS[1], 'n_docs', -removed)
  redis.call('HINCRBY', KEYS[1], 'stale', removed)
  redis.call('HINCRBY', KEYS[1], 'total_len', -total)
  hwm = index
end
redis.call('HSET', KEYS[1], 'hwm', hwm, 'gen', redis.call('HGET', KEYS[4], 'gen') or '0')
return {removed, hwm}
