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

-- The lowest-scored endpoint and its load (string), or nil when the set is empty.
local function lowest(load)
  local first = redis.call('ZRANGE', load, 0, 0, 'WITHSCORES')
  return first[1], first[2]
end

-- Uniform choice among the endpoints tied at the minimum `min` (they are ranks 0..ties-1).
local function tie_break(load, first, min, random)
  local ties = redis.call('ZCOUNT', load, min, min)
  if ties > 1 then
    return redis.call('ZRANGE', load, random % ties, random % ties)[1]
  end
  return first
end

-- The least-loaded endpoint, uniformly at random among ties; its load; nil when empty.
local function least_loaded(load, random)
  local first, min = lowest(load)
  if not first then return nil end
  return tie_break(load, first, min, random), min
end

-- Count the request on `ep` and write its lease.
local function take(load, leases, ep, cost, expiry, request_id)
  redis.call('ZINCRBY', load, cost, ep)
  redis.call('ZADD', leases, expiry, request_id .. '|' .. ep .. '|' .. cost)
end


-- Read the session's endpoint and refresh its TTL in one command: GETEX (Redis >= 6.2). An
-- older server answers an error; it then takes GET + EXPIRE (docs/redis-data-model.md §10).
local function session_get(skey, ttl)
  local ep = redis.pcall('GETEX', skey, 'EX', ttl)
  if type(ep) == 'table' and ep.err then
    ep = redis.call('GET', skey)
    if ep then redis.call('EXPIRE', skey, ttl) end
  end
  return ep
end

-- Session stickiness (docs/redis-data-model.md §10). `skey` holds the session's endpoint. It
-- keeps the session while it is a member (healthy, in the synced set) and not over the guard:
-- the cap, or busier than the least-loaded endpoint `min` by more than both imbalance bounds.
-- The read refreshes the binding's TTL, so a kept session costs no further write.
-- Returns the endpoint (nil when the session must be placed) and the session's state:
-- 1 kept, 2 new (no binding), 3 rebound (its endpoint left or is over the guard).
local function session_pick(load, skey, ttl, cost, cap, min, max_abs, max_ratio)
  local ep = session_get(skey, ttl)
  if not ep then return nil, 2 end
  local score = redis.call('ZSCORE', load, ep)
  if not score then return nil, 3 end
  score = tonumber(score)
  if (cap > 0 and score + cost > cap) or (score - min > max_abs and score > min * max_ratio) then
    return nil, 3
  end
  return ep, 1
end
