-- recall_read.lua: everything a recall query ranks with, in one round trip.
--
-- KEYS[1] rx:meta  hash   read: hwm, n_docs, total_len
-- KEYS[2] state    hash   read: watermark
-- KEYS[3] log      list   read: its length (0 and no state: no such session)
-- KEYS[4] rx:df    hash   read: the query terms' passage counts
-- KEYS[5..] rx:t:<term>  string  read: postings of each query term (in ARGV order)
-- ARGV[1] postings read per term at most (a more common term: its newest ones)
-- ARGV[2] bytes per posting
-- ARGV[3..] the query terms, one per KEYS[5..]
--
-- Returns {hwm, n_docs, total_len, watermark, length, has_state, dfs, blobs}
-- (dfs and blobs parallel to the terms; false / '' for an unknown term).

local meta = redis.call('HMGET', KEYS[1], 'hwm', 'n_docs', 'total_len')
local watermark = redis.call('HGET', KEYS[2], 'watermark')
local length = redis.call('LLEN', KEYS[3])
local tail = tonumber(ARGV[1])
local size = tonumber(ARGV[2])
local dfs, blobs = {}, {}
for i = 3, #ARGV do
  local df = redis.call('HGET', KEYS[4], ARGV[i])
  local blob = ''
  if df then
    if tonumber(df) <= tail then
      blob = redis.call('GET', KEYS[i + 2]) or ''
    else
      blob = redis.call('GETRANGE', KEYS[i + 2], -tail * size, -1)
    end
  end
  dfs[#dfs + 1] = df or false
  blobs[#blobs + 1] = blob
end
return {meta[1] or 0, meta[2] or 0, meta[3] or 0, watermark or 0, length,
        watermark and 1 or 0, dfs, blobs}
