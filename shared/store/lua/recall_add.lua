-- recall_add.lua: add one batch of indexed messages to a session's recall index,
-- only if nobody else moved the index or edited the log since the caller read them.
--
-- KEYS[1] rx:meta  hash   hwm (messages [0, hwm) are indexed), next_pid, n_docs,
--                         total_len, gen (the log generation the index describes),
--                         n_terms (term keys created)
-- KEYS[2] rx:terms string the index's terms, each followed by a newline (appended)
-- KEYS[3] rx:doc   hash   passage id -> "index:start:end:crc:length"
-- KEYS[4] rx:mp    list   first passage id of each indexed message (parallel to log)
-- KEYS[5] state    hash   read only: 'gen', bumped by every history edit; gone: the session was deleted
-- KEYS[6..] rx:t:<term>  string  packed postings (ARGV[4] bytes each), appended
-- ARGV[1] expected hwm, ARGV[2] new hwm, ARGV[3] the log generation the caller read
-- ARGV[4] bytes per posting
-- ARGV[5] expected next_pid ('' = the index is new), ARGV[6] new next_pid
-- ARGV[7] passages added, ARGV[8] their total length
-- ARGV[9] ttl seconds of meta, doc and mp (0 = none), ARGV[10] ttl seconds of df and
--         of a term key this call creates (the caller refreshes older term keys)
-- ARGV[11] m, then m first-passage ids (one per message, in order)
-- then d, then d pairs: passage id, doc value
-- then the postings of every term key, concatenated in KEYS order, and their counts
-- (one decimal count per term key, space separated)
--
-- One APPEND per term: a term's passage count is its string's length over the posting
-- size (one posting per passage, postings are only ever appended), so no count is
-- kept; a term key this call creates adds its term to the term list (one APPEND for
-- all of them). A batch costs one call per term (it cost three: APPEND, HINCRBY of
-- a count hash, EXPIRE).
--
-- Returns {'ok', new_hwm} or {'conflict', reason, hwm} (reason: 'hwm', 'gen' or 'gone':
-- the session's state is gone, deleted or expired).

local meta = redis.call('HMGET', KEYS[1], 'hwm', 'next_pid', 'gen')
local hwm = tonumber(meta[1]) or 0
-- a session deleted (or expired) since the caller read it: writing would bring its
-- terms back as keys nothing deletes
if redis.call('EXISTS', KEYS[5]) == 0 then
  return {'conflict', 'gone', hwm}
end
local gen = redis.call('HGET', KEYS[5], 'gen') or '0'
if hwm ~= tonumber(ARGV[1]) or (meta[2] or '') ~= ARGV[5] then
  return {'conflict', 'hwm', hwm}
end
if gen ~= ARGV[3] or (meta[1] and (meta[3] or '0') ~= gen) then
  return {'conflict', 'gen', hwm}
end

local size = tonumber(ARGV[4])
local ttl = tonumber(ARGV[9])
local term_ttl = tonumber(ARGV[10])
local at = 11
local m = tonumber(ARGV[at])
for i = 1, m do
  redis.call('RPUSH', KEYS[4], ARGV[at + i])
end
at = at + m + 1
local d = tonumber(ARGV[at])
-- unpack() is bounded by the Lua stack: 500 docs per HSET
for first = 0, d - 1, 500 do
  local docs = {}
  for i = 2 * first + 1, 2 * math.min(d, first + 500) do
    docs[#docs + 1] = ARGV[at + i]
  end
  redis.call('HSET', KEYS[3], unpack(docs))
end
at = at + 2 * d + 1

local blob, pos = ARGV[at], 1
-- '<rx>:t:<term>' is 2 characters shorter than '<rx>:meta' before the term
local cut = string.len(KEYS[1]) - 1
local created, j = {}, 6
for count in string.gmatch(ARGV[at + 1], '%d+') do
  local len = tonumber(count) * size
  if redis.call('APPEND', KEYS[j], string.sub(blob, pos, pos + len - 1)) == len then
    created[#created + 1] = string.sub(KEYS[j], cut)
    if term_ttl > 0 then
      redis.call('EXPIRE', KEYS[j], term_ttl)
    end
  end
  pos = pos + len
  j = j + 1
end
if #created > 0 then
  created[#created + 1] = ''
  redis.call('APPEND', KEYS[2], table.concat(created, '\n'))
  redis.call('HINCRBY', KEYS[1], 'n_terms', #created - 1)
end
redis.call('HSET', KEYS[1], 'hwm', ARGV[2], 'next_pid', ARGV[6], 'gen', gen)
redis.call('HINCRBY', KEYS[1], 'n_docs', ARGV[7])
redis.call('HINCRBY', KEYS[1], 'total_len', ARGV[8])

if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[3], ttl)
  redis.call('EXPIRE', KEYS[4], ttl)
end
if term_ttl > 0 then
  redis.call('EXPIRE', KEYS[2], term_ttl)
end
return {'ok', tonumber(ARGV[2])}
