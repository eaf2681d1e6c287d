-- recall_read.lua: everything a recall query ranks with, in one round trip.
--
-- KEYS[1] rx:meta  hash   read: hwm, n_docs, total_len
-- KEYS[2] state    hash   read: watermark
-- KEYS[3] log      list   read: its length (0 and no state: no such session)
-- KEYS[4] rx:df    hash   unused (an index before the term list kept its counts here)
-- KEYS[5..] rx:t:<term>  string  read: postings of each query term (in ARGV order);
--                         a term's passage count is its length over the posting size
-- ARGV[1] postings read for the whole query at most (the budget)
-- ARGV[2] postings read per term at least (while the budget lasts)
-- ARGV[3] bytes per posting
-- ARGV[4..] the query terms, one per KEYS[5..]
--
-- The budget goes to the rarest terms first (they carry the score: BM25's IDF
-- falls with the count); a term over its share is read from the end of its
-- string, its newest postings. So a query costs the same at any session length.
--
-- Returns {hwm, n_docs, total_len, watermark, length, has_state, dfs, blobs}
-- (dfs and blobs parallel to the terms; false / '' for an unknown term).

local meta = redis.call('HMGET', KEYS[1], 'hwm', 'n_docs', 'total_len')
local watermark = redis.call('HGET', KEYS[2], 'watermark')
local length = redis.call('LLEN', KEYS[3])
local budget = tonumber(ARGV[1])
local floor = tonumber(ARGV[2])
local size = tonumber(ARGV[3])
local n = #ARGV - 3
local dfs, blobs, order = {}, {}, {}
for i = 1, n do
  local bytes = redis.call('STRLEN', KEYS[i + 4])
  local df = bytes >= size and math.floor(bytes / size) or false
  dfs[i] = df
  blobs[i] = ''
  if df then
    order[#order + 1] = i
  end
end
table.sort(order, function(a, b) return tonumber(dfs[a]) < tonumber(dfs[b]) end)
for rank, i in ipairs(order) do
  local df = tonumber(dfs[i])
  local share = math.max(floor, math.floor(budget / (#order - rank + 1)))
  if df <= share then
    blobs[i] = redis.call('GET', KEYS[i + 4]) or ''
    budget = budget - df
  else
    blobs[i] = redis.call('GETRANGE', KEYS[i + 4], -share * size, -1)
    budget = budget - share
  end
  if budget < 0 then
    budget = 0
  end
end
return {meta[1] or 0, meta[2] or 0, meta[3] or 0, watermark or 0, length,
        watermark and 1 or 0, dfs, blobs}
