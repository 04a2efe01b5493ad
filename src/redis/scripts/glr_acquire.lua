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
  -- Membership sync: new endpoints start at 0, endpoints gone from the set are dropped
  -- (their leases stay; releasing them later is a no-op because of ZADD XX).
  local keep = {}
  for i = 9, #ARGV do
    keep[ARGV[i]] = true
    redis.call('ZADD', load, 'NX', 0, ARGV[i])
  end
  local all = redis.call('ZRANGE', load, 0, -1)
  for _, ep in ipairs(all) do
    if not keep[ep] then redis.call('ZREM', load, ep) end
  end
  redis.call('SET', KEYS[3], ARGV[7])
elseif redis.call('GET', KEYS[3]) ~= ARGV[7] then
  return {'SYNC'}
end

-- Amortised self-healing: on a fraction of calls (the caller decides: ARGV[8] > 0), give
-- back a few leases whose holder never released them (crashed gateway, lost reply).
local limit = tonumber(ARGV[8])
local expired = {}
if limit > 0 then
  expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, limit)
end
for _, m in ipairs(expired) do
  redis.call('ZREM', leases, m)
  give_back(load, m)
end

local first = redis.call('ZRANGE', load, 0, 0, 'WITHSCORES')
if #first == 0 then return {'EMPTY'} end
local pick, min = first[1], first[2]
local cost, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
if cap > 0 and tonumber(min) > 0 and tonumber(min) + cost > cap then
  return {'FULL', min}
end
-- Uniform tie-break: the endpoints sharing the minimum are ranks 0..ties-1.
local ties = redis.call('ZCOUNT', load, min, min)
if ties > 1 then
  pick = redis.call('ZRANGE', load, tonumber(ARGV[6]) % ties, tonumber(ARGV[6]) % ties)[1]
end
redis.call('ZINCRBY', load, cost, pick)
redis.call('ZADD', leases, now + tonumber(ARGV[2]), ARGV[3] .. '|' .. pick .. '|' .. ARGV[4])
return {'OK', pick, min}
