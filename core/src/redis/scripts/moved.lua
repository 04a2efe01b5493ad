-- A request the host's retry served from another endpoint than the one its lease counts
-- (docs/redis-data-model.md §14, "Served elsewhere"): the lease's endpoint failed, which
-- failure memory learns as release.lua does, and the count moves to the endpoint that
-- answered, under the same request id, so the stream end's release gives it back there.
-- KEYS as release.lua: load, leases, tenants, health, ejected, then for a prefix_cache route
-- prefill and booked (the booking goes with the failed try).
-- ARGV[1] now (ms)  ARGV[2] failures in a row that eject (0: failure memory off)
-- ARGV[3] first ejection (ms)  ARGV[4] longest ejection (ms)  ARGV[5] most endpoints ejected
-- at once (percent)  ARGV[6] how long a failed request's count stays on its endpoint (ms)
-- ARGV[7] the lease member  ARGV[8] the endpoint that answered  ARGV[9] the moved lease's
-- expiry (ms)
-- Reply as release.lua's: 0 the lease was gone (reclaimed: nothing moved or learned), 1
-- moved, 2 moved and the first endpoint ejected, 3 moved and its ejection refused. An
-- endpoint that answered but is not in the pool (a membership sync removed it) takes no count.
local load, leases, tenants, health, ejected = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, after, m, to = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[7], ARGV[8]
if not redis.call('ZSCORE', leases, m) then return 0 end
local id, ep, cost = string.match(m, '^([^|]*)|(.*)|([^|]*)$')
if not ep then return 0 end
settle(load, leases, tenants, KEYS[6], KEYS[7], m, after > 0 and tonumber(ARGV[6]) or 0, now)
if redis.call('ZADD', load, 'XX', 'INCR', cost, to) then
  redis.call('ZADD', leases, tonumber(ARGV[9]), id .. '|' .. to .. '|' .. cost)
  local t = string.match(id, '~(%x+)$')
  if t then redis.call('HINCRBY', tenants, t, tonumber(cost)) end
end
if after > 0 then
  local rules = {after = after, first = tonumber(ARGV[3]), most = tonumber(ARGV[4]),
    percent = tonumber(ARGV[5])}
  return learn(load, health, ejected, ep, 'f', now, rules)
end
return 1
