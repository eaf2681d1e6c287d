-- lease.lua: release or extend a per-session worker lease, only by its owner.
--
-- KEYS[1] lease    string  the owner's random token, with an expiry
-- ARGV[1] owner token
-- ARGV[2] "release" or "extend"
-- ARGV[3] new expiry in milliseconds (extend only)
--
-- Returns 1 when the caller owned the lease, 0 otherwise.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == 'release' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
end
return 1
