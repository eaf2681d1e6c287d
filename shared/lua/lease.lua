-- lease.lua: release or extend a per-session worker lease, only by its owner.
--
-- KEYS[1] lease    string  the owner's random token, with an expiry
-- KEYS[2] dirty    string  requests left by jobs that found the lease busy
--                          ("finish" only; one line each, appended)
-- ARGV[1] owner token
-- ARGV[2] "release", "extend" or "finish"
-- ARGV[3] new expiry in milliseconds ("extend", and "finish" when it keeps the lease)
--
-- "release" / "extend": 1 when the caller owned the lease, 0 otherwise.
-- "finish": {'lost'} when the caller does not own the lease (nothing changed);
-- {'released'} when the dirty flag was empty and the lease was released; or
-- {'dirty', requests} when requests were waiting: they are taken (the flag is
-- cleared) and the lease is extended for the caller to run them. Taking the
-- flag and releasing in one step leaves no moment in which a busy job's
-- request can land after the owner's last look and before its release.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  if ARGV[2] == 'finish' then
    return {'lost'}
  end
  return 0
end
if ARGV[2] == 'release' then
  redis.call('DEL', KEYS[1])
elseif ARGV[2] == 'finish' then
  local requests = redis.call('GET', KEYS[2])
  if requests then
    redis.call('DEL', KEYS[2])
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
    return {'dirty', requests}
  end
  redis.call('DEL', KEYS[1])
  return {'released'}
else
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
end
return 1
