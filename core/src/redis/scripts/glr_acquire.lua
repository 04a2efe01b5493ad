-- global_least_request: atomic pick-and-increment with a lease.
-- KEYS[1] load    zset  member = endpoint, score = in-flight load
-- KEYS[2] leases  zset  member = "<request id>|<endpoint>|<cost>", score = expiry (ms)
-- KEYS[3] members string fingerprint of the endpoint set synced into KEYS[1]
-- ARGV[1] now (ms)  ARGV[2] lease ttl (ms)  ARGV[3] request id  ARGV[4] cost
-- ARGV[5] cap (0 = none)  ARGV[6] random u32  ARGV[7] fingerprint  ARGV[8] reclaim limit
-- ARGV[9..] the healthy endpoints, sent only when the caller's set changed.
-- Reply: {"OK", endpoint, load before} | {"FULL", min load} | {"SYNC"} | {"EMPTY"}
local load, leases = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])

if #ARGV > 8 then
  sync_members(load, KEYS[3], ARGV[7], 9, ARGV)
elseif redis.call('GET', KEYS[3]) ~= ARGV[7] then
  return {'SYNC'}
end
reclaim(load, leases, now, tonumber(ARGV[8]))

local pick, min = least_loaded(load, tonumber(ARGV[6]))
if not pick then return {'EMPTY'} end
local cost, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
if cap > 0 and tonumber(min) > 0 and tonumber(min) + cost > cap then
  return {'FULL', min}
end
take(load, leases, pick, ARGV[4], now + tonumber(ARGV[2]), ARGV[3])
return {'OK', pick, min}
