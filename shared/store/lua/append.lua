-- append.lua: append messages to a session's log, all or nothing, at most once
-- per request id.
--
-- KEYS[1] log        list   message JSON, append-only
-- KEYS[2] cum        list   running token totals parallel to log (cum[i] = tokens of 0..i)
-- KEYS[3] state      hash   version, watermark, epoch, ... (created here); 'tail' =
--                           "<new length>:<ARGV[3]>", set by every append that writes
--                           messages: which append made the log that long (view.lua),
--                           and 'tail_prev', the one before it
-- KEYS[4] reqs       hash   request id -> "length:tokens_before:marked:digest" of its append
--                           (a record without the digest, from before it was kept, matches any batch)
-- KEYS[5] reqorder   list   request ids, newest first (bounds reqs)
-- KEYS[6] pending    string the coalescing flag of the summary job
-- KEYS[7..9] other data keys of the session, only for the TTL refresh
-- KEYS[10] ids       hash   provider tool-call id -> stored id of its newest call
--                           (shared.core.callids: ids made unique at append)
-- KEYS[11] queue      list   optional: the broker's queue, when the broker is this
--                           Redis server (shared.core.records.InlineJob); then the
--                           last three ARGV are its database, the session's database
--                           and the job message, pushed only if this append sets the flag
-- ARGV[1] max messages per session
-- ARGV[2] ttl in seconds (0 = no expiry)
-- ARGV[3] epoch: a random token kept only if the session has none yet. A
--         deleted (or expired) session that comes back gets a new epoch, so
--         readers that cache its view (keyed by epoch and version) notice.
--         Drawn anew for every call: it is also this append's 'tail'.
-- ARGV[4] request id ('' = none), with its batch's digest after a space: a retry must
--         carry the same batch (shared.store.commands.batch_digest)
-- ARGV[5] request ids kept per session
-- ARGV[6] ttl of the request ids, seconds
-- ARGV[7] pending flag ttl in seconds (0 = do not set the flag), then optionally a space
--         and the stale age in seconds: a flag older than that (ttl - PTTL; no worker
--         claimed its job) is re-armed as if it was absent (0 or none = never)
-- ARGV[8] 1 = also return the state hash as JSON
-- ARGV[9] a version ('' = none) and ARGV[10] f, then f field/value pairs: set
--         on the state hash only if its version is still that one (the
--         calibration figures of the request whose reply this turn holds)
-- then n, then n pairs: message JSON, its token estimate
-- then c and c pairs (provider id, stored id) of the batch's calls, then r and
-- r pairs of results whose call is in an earlier append, then the log length the
-- renamed ids were made for ('' = any; all three optional). The batch is written
-- only if every call kept under its provider id is new to the session, every
-- such result's stored id is the session's current mapping and the log has that
-- length (ids renamed after the position they were made at are unique only there);
-- otherwise the error reply "ID_CONFLICT <json>" carries the session's mapping
-- of the batch's provider ids and nothing is written.
--
-- Returns {new_length, watermark, version, tokens_before_append, duplicate,
--          marked, state_json_or_false, pending, tail_before}
-- tail_before: the state's 'tail' before this append ('' = none): a caller whose cached
-- view ended at that tail holds the log this batch extends (shared.core.appended).
-- pending = 1: the pending flag is set after the append (whoever set it).
-- duplicate = 1: the request id was seen; nothing was written and the
-- figures (length, tokens before, marked) are those of the first append.
-- marked = 1: this append set the pending flag, so its caller publishes the job;
-- marked = 2: it set the flag and pushed the job it carried (KEYS[11]);
-- marked = 3 or 4: the same (3: the caller publishes, 4: pushed) for a stale flag it
-- re-armed with a fresh TTL: the job is published again (the first one was lost).
-- (A retry does not set the fields again: the first attempt did, or they were stale.)
-- Error reply "SESSION_DAMAGED <log key> <log length> <totals length> <watermark>" when
-- the session's keys no longer agree (see view.lua): nothing is written.
-- Error reply "SESSION_FULL <current length>" when the limit would be passed, and
-- "REQUEST_CONFLICT <length>" when the request id was used for another batch.

local function state_reply()
  if ARGV[8] == '1' then
    return cjson.encode(redis.call('HGETALL', KEYS[3]))
  end
  return false
end

local request_id, digest = string.match(ARGV[4], '^(%S*) ?(%S*)$')
if request_id ~= '' then
  local seen = redis.call('HGET', KEYS[4], request_id)
  if seen then
    local length, before, marked, was = string.match(seen, '^(%d+):(%d+):(%d+):?(%x*)$')
    if was ~= '' and digest ~= '' and was ~= digest then
      return redis.error_reply('REQUEST_CONFLICT ' .. length)
    end
    local cur = redis.call('HMGET', KEYS[3], 'watermark', 'version')
    return {tonumber(length), tonumber(cur[1]) or 0, tonumber(cur[2]) or 0,
            tonumber(before), 1, tonumber(marked), state_reply()}
  end
end

-- The queue is checked before anything is written: a wrong type would fail the push
-- after the append (scripts do not roll back); the caller then publishes as usual.
-- A server that refuses SELECT in scripts leaves the job to the caller too.
local job, job_db, own_db = false, ARGV[#ARGV - 2], ARGV[#ARGV - 1]
if KEYS[11] and (job_db == own_db or not redis.pcall('SELECT', job_db).err) then
  local kind = redis.call('TYPE', KEYS[11]).ok
  job = kind == 'list' or kind == 'none'
  if job_db ~= own_db then
    redis.call('SELECT', own_db)
  end
end

local max_len = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local fields_at = 11
local n_fields = tonumber(ARGV[10])
local at = fields_at + 2 * n_fields
local n = tonumber(ARGV[at])
local len = redis.call('LLEN', KEYS[1])
local totals_len = redis.call('LLEN', KEYS[2])
-- The state's fields this script reads, in one call (each redis.call costs the script
-- a few microseconds of the server's one thread): nothing else writes the state before
-- the HSET below, so they are still these there.
local cur = redis.call('HMGET', KEYS[3], 'watermark', 'version', 'epoch', 'tail')
local at_watermark = tonumber(cur[1]) or 0
if totals_len ~= len or at_watermark > len then  -- keys evicted: see view.lua
  return redis.error_reply('SESSION_DAMAGED ' .. KEYS[1] .. ' ' .. len .. ' ' .. totals_len
                           .. ' ' .. at_watermark)
end
if len + n > max_len then
  return redis.error_reply('SESSION_FULL ' .. len)
end

local claims_at = at + 1 + 2 * n
local n_calls = tonumber(ARGV[claims_at]) or 0
local results_at = claims_at + 1 + 2 * n_calls
local n_results = tonumber(ARGV[results_at]) or 0
local at_length = tonumber(ARGV[results_at + 1 + 2 * n_results])
if n_calls + n_results > 0 then
  local bad = at_length ~= nil and at_length ~= len
  for i = 0, n_calls - 1 do
    local p = ARGV[claims_at + 1 + 2 * i]
    if p == ARGV[claims_at + 2 + 2 * i] and redis.call('HEXISTS', KEYS[10], p) == 1 then
      bad = true
    end
  end
  for i = 0, n_results - 1 do
    local p = ARGV[results_at + 1 + 2 * i]
    local current = redis.call('HGET', KEYS[10], p) or p
    if current ~= ARGV[results_at + 2 + 2 * i] then
      bad = true
    end
  end
  if bad then
    local map = {}
    for i = 0, n_calls - 1 do
      local p = ARGV[claims_at + 1 + 2 * i]
      map[p] = redis.call('HGET', KEYS[10], p) or cjson.null
    end
    for i = 0, n_results - 1 do
      local p = ARGV[results_at + 1 + 2 * i]
      map[p] = redis.call('HGET', KEYS[10], p) or cjson.null
    end
    return redis.error_reply('ID_CONFLICT ' .. cjson.encode(map))
  end
  -- pairs set in order, as one HSET each would, a thousand a call (unpack's bound)
  for i = 0, n_calls - 1, 1000 do
    local last = math.min(i + 1000, n_calls) - 1
    redis.call('HSET', KEYS[10], unpack(ARGV, claims_at + 1 + 2 * i, claims_at + 2 + 2 * last))
  end
end

local total = 0
if len > 0 then
  total = tonumber(redis.call('LINDEX', KEYS[2], -1)) or 0
end
local before = total
local tail_before = cur[4] or ''
local msgs = {}
local cums = {}
for i = 0, n - 1 do
  msgs[#msgs + 1] = ARGV[at + 1 + 2 * i]
  total = total + tonumber(ARGV[at + 2 + 2 * i])
  cums[#cums + 1] = total
end
-- The state's writes in one HSET, in the order they were made one call each: the tail,
-- version / watermark / epoch where absent (HSETNX), then the fields if the version
-- (after that) is still theirs; a field named twice takes its last value, as before.
local watermark, version = cur[1] or '0', cur[2] or '0'
local state_set = {}
if n > 0 then
  redis.call('RPUSH', KEYS[1], unpack(msgs))
  redis.call('RPUSH', KEYS[2], unpack(cums))
  state_set = {'tail', (len + n) .. ':' .. ARGV[3], 'tail_prev', tail_before}
end
if not cur[2] then
  state_set[#state_set + 1] = 'version'
  state_set[#state_set + 1] = 0
end
if not cur[1] then
  state_set[#state_set + 1] = 'watermark'
  state_set[#state_set + 1] = 0
end
if not cur[3] then
  state_set[#state_set + 1] = 'epoch'
  state_set[#state_set + 1] = ARGV[3]
end
if n_fields > 0 and version == ARGV[9] then
  for i = fields_at, at - 1, 2 do
    state_set[#state_set + 1] = ARGV[i]
    state_set[#state_set + 1] = ARGV[i + 1]
    if ARGV[i] == 'watermark' then
      watermark = ARGV[i + 1]
    elseif ARGV[i] == 'version' then
      version = ARGV[i + 1]
    end
  end
end
if #state_set > 0 then
  redis.call('HSET', KEYS[3], unpack(state_set))
end

-- 1: the flag was absent and is set; 3: it stood at least `stale` seconds (its age is
-- its TTL's start minus what is left of it) and is set again, young; 0: left as it was
-- (a young flag, or one without an expiry, whose age cannot be told).
local function mark(key, flag_ttl, stale)
  if redis.call('SET', key, '1', 'NX', 'EX', flag_ttl) then
    return 1
  end
  if stale > 0 then
    local left = redis.call('PTTL', key)
    if left >= 0 and flag_ttl * 1000 - left >= stale * 1000 then
      redis.call('SET', key, '1', 'EX', flag_ttl)
      return 3
    end
  end
  return 0
end

local pending_ttl, stale = string.match(ARGV[7], '^(%d+) ?(%d*)$')
pending_ttl, stale = tonumber(pending_ttl), tonumber(stale) or 0
local marked = 0
if pending_ttl > 0 then
  marked = mark(KEYS[6], pending_ttl, stale)
end
if marked > 0 then
  if job then
    if job_db ~= own_db then
      redis.call('SELECT', job_db)
    end
    redis.call('LPUSH', KEYS[11], ARGV[#ARGV])
    if job_db ~= own_db then
      redis.call('SELECT', own_db)
    end
    marked = marked + 1
  end
end

if request_id ~= '' then
  redis.call('HSET', KEYS[4], request_id, (len + n) .. ':' .. before .. ':' .. marked .. ':'
             .. digest)
  local kept = redis.call('LPUSH', KEYS[5], request_id)  -- the list's length
  local keep = tonumber(ARGV[5])
  while kept > keep do
    redis.call('HDEL', KEYS[4], redis.call('RPOP', KEYS[5]))
    kept = kept - 1
  end
  local req_ttl = tonumber(ARGV[6])
  if ttl > 0 and ttl < req_ttl then
    req_ttl = ttl
  end
  redis.call('EXPIRE', KEYS[4], req_ttl)
  redis.call('EXPIRE', KEYS[5], req_ttl)
end

if ttl > 0 then
  for i = 1, 10 do
    if i < 4 or i > 6 then
      redis.call('EXPIRE', KEYS[i], ttl)
    end
  end
end
local reply = state_reply()
-- Last, a read of every key a view is made of: a caller with client tracking (default
-- mode, NOLOOP) keeps them tracked after its own write (a write untracks the key for
-- the writer too), so the next write by anyone else is pushed to it at once.
redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[7], KEYS[9])
-- The flag is set after mark() whenever it ran (set, re-armed, or found set).
local pending = 1
if pending_ttl == 0 then
  pending = redis.call('EXISTS', KEYS[6])
end
return {len + n, tonumber(watermark), tonumber(version), before, 0, marked, reply,
        pending, tail_before}
