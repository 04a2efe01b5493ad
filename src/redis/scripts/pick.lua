-- Shared by the acquire scripts (prepended by src/redis/scripts.rs, after lease.lua).

-- Membership sync: new endpoints start at 0, endpoints gone from the set are dropped (their
-- leases stay; releasing them later is a no-op because of ZADD XX).
local function sync_members(load, members_key, fingerprint, first, argv)
  local keep = {}
  for i = first, #argv do
    keep[argv[i]] = true
    redis.call('ZADD', load, 'NX', 0, argv[i])
  end
  for _, ep in ipairs(redis.call('ZRANGE', load, 0, -1)) do
    if not keep[ep] then redis.call('ZREM', load, ep) end
  end
  redis.call('SET', members_key, fingerprint)
end

-- Amortised self-healing: give back up to `limit` leases whose holder never released them.
local function reclaim(load, leases, now, limit)
  if limit > 0 then
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, limit)) do
      redis.call('ZREM', leases, m)
      give_back(load, m)
    end
  end
end

-- The least-loaded endpoint, uniformly at random among ties (they are ranks 0..ties-1).
-- Returns endpoint, its load (string), or nil when the set is empty.
local function least_loaded(load, random)
  local first = redis.call('ZRANGE', load, 0, 0, 'WITHSCORES')
  if #first == 0 then return nil end
  local pick, min = first[1], first[2]
  local ties = redis.call('ZCOUNT', load, min, min)
  if ties > 1 then
    pick = redis.call('ZRANGE', load, random % ties, random % ties)[1]
  end
  return pick, min
end

-- Count the request on `ep` and write its lease.
local function take(load, leases, ep, cost, expiry, request_id)
  redis.call('ZINCRBY', load, cost, ep)
  redis.call('ZADD', leases, expiry, request_id .. '|' .. ep .. '|' .. cost)
end

