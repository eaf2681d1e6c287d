-- reset_damaged.lua: remove a damaged session's keys, so that it starts afresh as an
-- expired one would; a session that is not damaged (any more) is left as it is.
--
-- KEYS[1] log      list   checked: its length against the totals' and the watermark
-- KEYS[2] cum      list   checked
-- KEYS[3] state    hash   checked: its watermark
-- KEYS[4..] every other key of the session (summaries, cheap decisions, request ids,
--           flags, lease, tool-call id map): unlinked with the three above
--
-- Damaged, as view.lua and append.lua refuse it: the log and its running totals differ
-- in length, or the watermark is past the log's end. Checked here again, in the same
-- script as the removal, so that a session a writer mended (or deleted and began
-- again) between the caller's refused call and this one is never removed.
--
-- Returns 1 when the keys were removed, 0 when the session was not damaged.

local len = redis.call('LLEN', KEYS[1])
local totals_len = redis.call('LLEN', KEYS[2])
local watermark = tonumber(redis.call('HGET', KEYS[3], 'watermark')) or 0
if totals_len == len and watermark <= len then
  return 0
end
redis.call('UNLINK', unpack(KEYS))
return 1
