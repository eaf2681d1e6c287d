-- recall_cut.lua: a history edit at `index` (truncate_after): forget every indexed
-- passage of messages >= index, and mark the index as describing the current log;
-- at most ARGV[2] passage ids a call, newest first, so that no call holds Redis long
-- (an edit at the middle of a 10k-message session forgot ~5k passages in one call:
-- 57 ms). The caller calls again until the reply says done.
-- Postings of forgotten passages stay in the term strings; their passage ids are
-- never reused and their docs are gone, so queries skip them.
--
-- KEYS[1] rx:meta  hash   hwm, next_pid (read), n_docs, total_len, stale (passages
--                         forgotten so far: the indexer rebuilds when they outnumber
--                         the live ones),
--                         gen (the edit's once the cut is done, see below), and
--                         while a cut is under way cut_at (its index) and cut_hi
--                         (passage ids from it up are forgotten already)
-- KEYS[2] rx:doc   hash   docs of passages of messages >= index are deleted
-- KEYS[3] rx:mp    list   trimmed to the first `index` messages (at the last call)
-- KEYS[4] state    hash   read only: 'gen' (when ARGV[3] is not given)
-- ARGV[1] index
-- ARGV[2] passage ids looked at per call, at most
-- ARGV[3] the log generation the edit created (truncate.lua's reply; '' or absent: the
--         state's)
--
-- While a cut is under way the index's gen is still the old one: an indexer that comes
-- meanwhile drops the index and rebuilds it (recall_add refuses to add to it), and a
-- query checks every hit against the log. An edit that comes before a cut is done
-- goes on from it (the lower of the two indexes).
--
-- A cut done marks the index with its own edit's generation, and only when the index
-- described the log just before that edit (gens are consecutive: only truncate.lua bumps
-- them). It once took the state's, which may be a later edit's whose caller died before
-- its cut: that edit's removed range was then never forgotten nor re-indexed (the
-- indexer rebuilds an index whose gen is not the state's, its safety net). An index
-- already at or past the edit's generation (built again since) has nothing to forget.
--
-- Returns {passages_removed, hwm_after, done} (done: 1 when the cut is complete).

local index = tonumber(ARGV[1])
local most = tonumber(ARGV[2])
local edit = tonumber(ARGV[3] or '') or tonumber(redis.call('HGET', KEYS[4], 'gen') or '0')
local meta = redis.call('HMGET', KEYS[1], 'hwm', 'next_pid', 'cut_at', 'cut_hi', 'gen')
if not meta[1] then
  return {0, 0, 1}
end
local described = tonumber(meta[5] or '0')
if described >= edit then
  return {0, tonumber(meta[1]), 1}
end
if meta[3] then
  index = math.min(index, tonumber(meta[3]))
end
local hwm = tonumber(meta[1])
local removed = 0
if index < hwm then
  local first = tonumber(redis.call('LINDEX', KEYS[3], index))
  local total = 0
  local done = true
  if first then
    local hi = tonumber(meta[4] or meta[2])  -- passage ids from hi up: forgotten
    local lo = math.max(first, hi - most)
    if lo < hi then
      local pids = {}
      for pid = lo, hi - 1 do
        pids[#pids + 1] = pid
      end
      local docs = redis.call('HMGET', KEYS[2], unpack(pids))
      for _, doc in ipairs(docs) do
        if doc then
          local len = string.match(doc, ':(%d+)$')
          total = total + (tonumber(len) or 0)
          removed = removed + 1
        end
      end
      redis.call('HDEL', KEYS[2], unpack(pids))
    end
    if lo > first then
      done = false
      redis.call('HSET', KEYS[1], 'cut_at', index, 'cut_hi', lo)
    end
  end
  -- never an increment of -0 (a call that forgot no passage, or only passages of no
  -- terms: "?", "..."): Lua sends it as '-0', which the server refuses as no integer
  if removed > 0 then
    redis.call('HINCRBY', KEYS[1], 'n_docs', -removed)
    redis.call('HINCRBY', KEYS[1], 'stale', removed)
  end
  if total > 0 then
    redis.call('HINCRBY', KEYS[1], 'total_len', -total)
  end
  if not done then
    return {removed, hwm, 0}
  end
  if index == 0 then
    redis.call('UNLINK', KEYS[3])
  else
    redis.call('LTRIM', KEYS[3], 0, index - 1)
  end
  hwm = index
end
redis.call('HSET', KEYS[1], 'hwm', hwm)
if described == edit - 1 then
  redis.call('HSET', KEYS[1], 'gen', edit)
end
redis.call('HDEL', KEYS[1], 'cut_at', 'cut_hi')
return {removed, hwm, 1}
