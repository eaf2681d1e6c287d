-- recall_add.lua: add one batch of indexed messages to a session's recall index,
-- only if nobody else moved the index or edited the log since the caller read them.
--
-- KEYS[1] rx:meta  hash   hwm (messages [0, hwm) are indexed), next_pid, n_docs,
--                         total_len, gen (the log generation the index describes)
-- KEYS[2] rx:df    hash   term -> number of passages holding it (also the term list)
-- KEYS[3] rx:doc   hash   passage id -> "index:start:end:crc:length"
-- KEYS[4] rx:mp    list   first passage id of each indexed message (parallel to log)
-- KEYS[5] state    hash   read only: 'gen', bumped by every history edit
-- KEYS[6..] rx:t:<term>  string  packed postings (12 bytes each), appended
-- ARGV[1] expected hwm, ARGV[2] new hwm, ARGV[3] the log generation the caller read
-- ARGV[4] expected next_pid ('' = the index is new), ARGV[5] new next_pid
-- ARGV[6] passages added, ARGV[7] their total length, ARGV[8] ttl seconds (0 = none)
-- ARGV[9] m, then m first-passage ids (one per message, in order)
-- then d, then d pairs: passage id, doc value
-- then, for KEYS[6 + j]: its df increment and its postings bytes (2 values per term key)
--
-- Returns {'ok', new_hwm} or {'conflict', reason, hwm} (reason: 'hwm' or 'gen').

local meta = redis.call('HMGET', KEYS[1], 'hwm', 'next_pid', 'gen')
local hwm = tonumber(meta[1]) or 0
local gen = redis.call('HGET', KEYS[5], 'gen') or '0'
if hwm ~= tonumber(ARGV[1]) or (meta[2] or '') ~= ARGV[4] then
  return {'conflict', 'hwm', hwm}
end
if gen ~= ARGV[3] or (meta[1] and (meta[3] or '0') ~= gen) then
  return {'conflict', 'gen', hwm}
end

local at = 9
local m = tonumber(ARGV[at])
for i = 1, m do
  redis.call('RPUSH', KEYS[4], ARGV[at + i])
end
at = at + m + 1
local d = tonumber(ARGV[at])
for i = 0, d - 1 do
  redis.call('HSET', KEYS[3], ARGV[at + 1 + 2 * i], ARGV[at + 2 + 2 * i])
end
at = at + 2 * d + 1
for j = 6, #KEYS do
  -- '<base>:rx:t:<term>' is 2 characters shorter than '<base>:rx:meta' before the term
  local term = string.sub(KEYS[j], string.len(KEYS[1]) - 1)
  redis.call('HINCRBY', KEYS[2], term, ARGV[at])
  redis.call('APPEND', KEYS[j], ARGV[at + 1])
  at = at + 2
end
redis.call('HSET', KEYS[1], 'hwm', ARGV[2], 'next_pid', ARGV[5], 'gen', gen)
redis.call('HINCRBY', KEYS[1], 'n_docs', ARGV[6])
redis.call('HINCRBY', KEYS[1], 'total_len', ARGV[7])

local ttl = tonumber(ARGV[8])
if ttl > 0 then
  for i = 1, #KEYS do
    if i ~= 5 then
      redis.call('EXPIRE', KEYS[i], ttl)
    end
  end
end
return {'ok', tonumber(ARGV[2])}
