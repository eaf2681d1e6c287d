-- view.lua: everything the guard needs for one prepare(), in one atomic read,
-- optionally only what changed since the caller's last read.
--
-- KEYS[1] state    hash   read whole
-- KEYS[2] log      list   read from the watermark (or the caller's end) to the end;
--                         only its length when the read is deferred (ARGV[11])
-- KEYS[3] cum      list   lookups: tokens before the watermark, total, the caller's end
-- KEYS[4] sums     hash   the current summary record
-- KEYS[5] cheap    hash   cheap-stage decisions of the current view
-- KEYS[6] pending  string whether a job is queued
-- ARGV[1] the caller's epoch ('' = no cached view: read everything)
-- ARGV[2] the caller's log generation
-- ARGV[3] the caller's version (its summary is the current one if unchanged)
-- ARGV[4] the caller's start and ARGV[5] its end: it holds log[start:end]
-- ARGV[6] the running token total at that end (cum[end - 1], 0 when end = 0)
-- ARGV[7] '1': also return the running totals of the messages sent (the
--         worker's counts; the guard does not ask)
-- ARGV[8] the caller's cheap-stage generation (state field cheap_gen)
-- ARGV[9] the state's 'tail' when the caller read (or appended) up to its end
--         ("<end>:<nonce>" of the append that made the log that long; '' = unknown)
-- ARGV[10] sha1 hex of log[end - 1] as the caller holds it ('' = it holds none)
-- ARGV[11] the most messages, and ARGV[12] the most tokens (cum), this script
--         returns itself ('' = no limit). A larger range is left to the caller
--         (deferred = 1: messages and totals empty), who reads log[start:length]
--         and cum[...] with plain LRANGE in one MULTI/EXEC that re-reads epoch,
--         gen and cum[length - 1]: Lua copies every string into and out of the
--         script (~4 us per 1.2 kB message, 4x a plain LRANGE), so 10k messages
--         cost ~48 ms here against ~12 ms outside. The read is still the view of
--         this script's moment: log[start:length] cannot change while epoch and
--         gen hold (append-only), and the caller checks that they do.
--
-- Only truncate_after removes or replaces log entries, and it bumps the log
-- generation ('gen'); a session that is deleted (or expires) and comes back
-- gets a new epoch. So while both match, log[start:end] is what the caller
-- holds, whatever summaries were committed or rewound meanwhile: when the
-- watermark is still inside [start, end] and the token total at end is
-- unchanged (a guard against a log replaced behind the generation, e.g. a
-- restored backup), only log[end:] is sent, and the summary only if the
-- version changed.
--
-- A failover can lose an acknowledged append (replication is asynchronous) and
-- another writer can then append a batch of exactly its token count: length
-- and total agree again, the entries do not. So log[end - 1] must also be the
-- entry the caller holds: when nothing was appended since, the same 'tail' (every
-- append draws a new random one: another tail, another append); after one append,
-- the caller's tail as 'tail_prev'; else the same bytes (its sha1, computed only
-- then: what others appended is read anyway).
--
-- Error reply "SESSION_DAMAGED <log key> <log length> <totals length> <watermark>" when
-- the log and its totals differ in length or the watermark is past the log's end.
--
-- Returns {state_json, messages, tokens_before_watermark, tokens_total, length,
--          summary_json_or_false, cheap_json, pending, start, incremental,
--          summary_included, totals, cheap_included, deferred}
-- cheap_json is false (and cheap_included 0) when the caller's decisions are current.
-- totals: with ARGV[7] = '1', cum[start - 1 .. length - 1] (from cum[0] when
-- start is 0), read with the messages so that they describe the same log;
-- otherwise empty.
-- messages are log[start:]: start is the watermark for a full read, the
-- caller's end for an incremental one. Few reply elements on purpose: each
-- costs the client a parse step (state and cheap come as one JSON string).

local state = redis.call('HGETALL', KEYS[1])
local cur = redis.call('HMGET', KEYS[1], 'watermark', 'version', 'epoch', 'gen', 'tail',
                       'tail_prev')
local w = tonumber(cur[1]) or 0
local len = redis.call('LLEN', KEYS[2])
-- A session some of whose keys Redis evicted (or someone deleted) no longer agrees with
-- itself: the log and its running totals are written together, and the watermark never
-- passes the log's end. Nothing is read from it (reset_damaged.lua starts it afresh).
local totals_len = redis.call('LLEN', KEYS[3])
if totals_len ~= len or w > len then
  return redis.error_reply('SESSION_DAMAGED ' .. KEYS[2] .. ' ' .. len .. ' ' .. totals_len
                           .. ' ' .. w)
end
local total = 0
if len > 0 then
  total = tonumber(redis.call('LINDEX', KEYS[3], -1)) or 0
end

local before = 0
if w > 0 then
  before = tonumber(redis.call('LINDEX', KEYS[3], w - 1)) or 0
end
local start = w
local at_start = before  -- the running total at start (tokens of log[:start])
local incremental = 0
-- Whether log[known - 1] is the entry the caller holds (see above).
local function holds(known)
  local digest = ARGV[10] or ''
  if known == 0 or digest == '' then
    return true
  end
  local tail = ARGV[9] or ''
  if tail ~= '' then
    if known == len then  -- another tail: another append made the log that long
      return cur[5] == tail
    end
    if cur[6] == tail then  -- the one append since began at the caller's end
      return true
    end
  end
  if not redis.sha1hex then  -- fakeredis (tests) has none: the total alone, as before
    return true
  end
  return redis.sha1hex(redis.call('LINDEX', KEYS[2], known - 1)) == digest
end
if ARGV[1] ~= '' and cur[3] == ARGV[1] and (cur[4] or '0') == ARGV[2] then
  local known_start = tonumber(ARGV[4])
  local known = tonumber(ARGV[5])
  if known_start and known and known_start <= w and w <= known and known <= len then
    local at = 0
    if known > 0 then
      at = tonumber(redis.call('LINDEX', KEYS[3], known - 1)) or -1
    end
    if at == tonumber(ARGV[6]) and holds(known) then
      start = known
      at_start = at
      incremental = 1
    end
  end
end

-- A large range is left to plain reads by the caller (see ARGV[11]); only for a
-- session with an epoch, which those reads check against.
local deferred = 0
local most, most_tokens = tonumber(ARGV[11] or ''), tonumber(ARGV[12] or '')
if cur[3] and start < len and ((most and len - start > most)
                               or (most_tokens and total - at_start > most_tokens)) then
  deferred = 1
end
local messages = {}
if start < len and deferred == 0 then
  messages = redis.call('LRANGE', KEYS[2], start, -1)
end
local summary = false
local included = 0
if incremental == 0 or cur[2] ~= ARGV[3] then
  included = 1
  if w > 0 then
    summary = redis.call('HGET', KEYS[4], w) or false
  end
end
-- Cheap decisions change only with cheap_gen (cheap.lua) or the version (commit,
-- edit, rewind): an incremental reader that holds both gets none (O(1), not O(view)).
local cheap = false
local cheap_included = 0
local cheap_gen = redis.call('HGET', KEYS[1], 'cheap_gen') or ''
if incremental == 0 or cur[2] ~= ARGV[3] or cheap_gen ~= (ARGV[8] or '') then
  cheap = cjson.encode(redis.call('HGETALL', KEYS[5]))
  cheap_included = 1
end
local pending = redis.call('EXISTS', KEYS[6])
local totals = {}
if ARGV[7] == '1' and start < len and deferred == 0 then
  totals = redis.call('LRANGE', KEYS[3], math.max(start - 1, 0), -1)
end
-- Every key of the view read, whatever the branches above skipped: a caller with client
-- tracking in default mode (shared.store.own_writes) stays told of any write to them.
redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
return {cjson.encode(state), messages, before, total, len, summary, cheap, pending, start,
        incremental, included, totals, cheap_included, deferred}
