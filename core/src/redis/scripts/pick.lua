-- Shared by the acquire scripts (prepended by src/redis/scripts.rs, after lease.lua).

-- Membership sync: new endpoints start at 0, endpoints gone from the set are dropped (their
-- leases stay; releasing them later is a no-op because of ZADD XX). `also`: another per-endpoint
-- zset kept to the same members (prefix_cache's prefill tokens), or nil.
local function sync_members(load, members_key, fingerprint, first, argv, also)
  local keep = {}
  for i = first, #argv do
    keep[argv[i]] = true
    redis.call('ZADD', load, 'NX', 0, argv[i])
    if also then redis.call('ZADD', also, 'NX', 0, argv[i]) end
  end
  for _, ep in ipairs(redis.call('ZRANGE', load, 0, -1)) do
    if not keep[ep] then redis.call('ZREM', load, ep) end
  end
  if also then
    for _, ep in ipairs(redis.call('ZRANGE', also, 0, -1)) do
      if not keep[ep] then redis.call('ZREM', also, ep) end
    end
  end
  redis.call('SET', members_key, fingerprint)
end

-- Amortised self-healing: give back up to `limit` leases whose holder never released them.
-- The tenant counts and prefill bookings (nil for global_least_request) heal with them.
local function reclaim(load, leases, now, limit, tenants, prefill, booked)
  if limit > 0 then
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, limit)) do
      redis.call('ZREM', leases, m)
      give_back(load, m, tenants, prefill, booked)
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

-- Count the request on `ep` and write its lease. Returns `ep`'s load before it (the reply's
-- last item: above maxRequestCount it is the top class's headroom, counted by the plugin).
local function take(load, leases, ep, cost, expiry, request_id)
  local after = redis.call('ZINCRBY', load, cost, ep)
  redis.call('ZADD', leases, expiry, request_id .. '|' .. ep .. '|' .. cost)
  return tonumber(after) - tonumber(cost)
end

-- The pool's load: the sum of its endpoints' loads, O(endpoints).
local function pool_load(load)
  local total = 0
  local all = redis.call('ZRANGE', load, 0, -1, 'WITHSCORES')
  for i = 2, #all, 2 do total = total + real(all[i]) end
  return total
end

-- The pool cap and tenant fairness (docs/redis-data-model.md §11), checked before the pick.
-- The pool's load is the sum of the endpoints' loads: kept by the same take / give_back /
-- reclaim as each endpoint's, so it heals with them. `tenants` (hash: tenant -> in-flight
-- cost) and `seen` (zset: tenant -> its last request, ms) say which tenants are active: in
-- flight, or seen within `window` ms. A tenant at `limit` (its share of the capacity) is
-- refused while another tenant is active; alone, it may use everything. Like the endpoint cap,
-- an idle pool or tenant always admits one request. A refused tenant is waiting: it is
-- marked seen, so the room the others free goes to it. Returns nil (admitted) or the refusal,
-- and the pool's load when `pool_cap` is set (nil otherwise), which `outranked` reuses.
local function mark_waiting(seen, now, tenant, window)
  redis.call('ZADD', seen, now, tenant)
  redis.call('PEXPIRE', seen, window)
end

local function admit(load, tenants, seen, now, cost, pool_cap, tenant, limit, window)
  if pool_cap <= 0 and tenant == '' then return nil end
  if tenant ~= '' then
    redis.call('ZREMRANGEBYSCORE', seen, '-inf', now - window)
  end
  local total
  if pool_cap > 0 then
    total = pool_load(load)
    if total > 0 and total + cost > pool_cap then
      if tenant ~= '' then mark_waiting(seen, now, tenant, window) end
      return {'POOL', tostring(total)}, total
    end
  end
  if tenant ~= '' then
    local held = tonumber(redis.call('HGET', tenants, tenant) or '0')
    if held > 0 and held + cost > limit then
      local others = redis.call('ZCARD', seen)
      if redis.call('ZSCORE', seen, tenant) then others = others - 1 end
      local busy = redis.call('HLEN', tenants) - 1
      if others > 0 or busy > 0 then
        mark_waiting(seen, now, tenant, window)
        return {'TENANT', tostring(held)}, total
      end
    end
  end
  return nil, total
end

-- The tenant's share of a request just taken (its lease id carries the tenant: lease.lua).
local function tenant_take(tenants, seen, now, cost, tenant, window)
  if tenant ~= '' then
    redis.call('HINCRBY', tenants, tenant, cost)
    redis.call('ZADD', seen, now, tenant)
    redis.call('PEXPIRE', seen, window)
  end
end

-- The lease id of a request: its request id, and its tenant when it has one.
local function lease_id(request_id, tenant)
  if tenant ~= '' then return request_id .. '~' .. tenant end
  return request_id
end


-- Read the session's endpoint; a binding in use has its TTL refreshed once a tenth of it has
-- passed (PTTL below 90% of it), so an idle session is forgotten 0.9 to 1 TTL after its last
-- turn. Two reads cost less than refreshing on every turn (a write: GETEX or EXPIRE), and work
-- on any Redis version (docs/redis-data-model.md §10).
local function session_get(skey, ttl)
  local ep = redis.call('GET', skey)
  if ep and redis.call('PTTL', skey) < ttl * 900 then
    redis.call('EXPIRE', skey, ttl)
  end
  return ep
end

-- Session stickiness (docs/redis-data-model.md §10). `skey` holds the session's endpoint. It
-- keeps the session while it is a member (healthy, in the synced set) and not over the guard:
-- the cap, or busier than the least-loaded endpoint `min` by more than both imbalance bounds.
-- The read refreshes the binding's TTL when due (session_get), so a kept session seldom writes.
-- `min` may be nil: it is then read only when the imbalance test needs it (a load above
-- `max_abs`; at or below it no endpoint can be `max_abs` less busy), so a kept session
-- usually costs no ZRANGE.
-- Returns the endpoint (nil when the session must be placed), the session's state (1 kept,
-- 2 new: no binding, 3 rebound: its endpoint left or is over the guard) and `min` if known.
local function session_pick(load, skey, ttl, cost, cap, min, max_abs, max_ratio)
  local ep = session_get(skey, ttl)
  if not ep then return nil, 2, min end
  local score = redis.call('ZSCORE', load, ep)
  if not score then return nil, 3, min end
  score = tonumber(score)
  if cap > 0 and score + cost > cap then return nil, 3, min end
  if score > max_abs then
    if not min then
      local _, m = lowest(load)
      min = tonumber(m)
    end
    if score - min > max_abs and score > min * max_ratio then return nil, 3, min end
  end
  return ep, 1, min
end

-- Waiting queue (docs/redis-data-model.md §12). `wait` holds every gateway's waiting requests,
-- score = rank * WAIT_RANK + expiry (ms), so one range per class counts its live waiters and
-- drops the expired ones (a crashed gateway's waiters leave at their deadline). A request of
-- `rank` is outranked while higher classes wait and the free room (in requests of its `cost`)
-- is no more than their number: that room is theirs. The free room is the least of the room
-- below its endpoint `cap` (summed over the endpoints) and the room below its `pool_cap`
-- (maxPoolRequests), whichever of the two is set. `pool_total`: the pool's load if `admit`
-- already summed it (nil: summed here).
local WAIT_RANK = 4398046511104 -- 2^42 ms: past year 2109, and 8 classes stay exact in a double
local function outranked(wait, rank, now, load, cap, pool_cap, cost, pool_total)
  if rank <= 0 or (cap <= 0 and pool_cap <= 0) then return false end
  local above = 0
  for r = 0, rank - 1 do
    local base = r * WAIT_RANK
    redis.call('ZREMRANGEBYSCORE', wait, string.format('%.0f', base),
      string.format('%.0f', base + now))
    above = above + redis.call('ZCOUNT', wait, string.format('(%.0f', base + now),
      string.format('(%.0f', base + WAIT_RANK))
  end
  if above == 0 then return false end
  if pool_cap > 0 then
    local total = pool_total or pool_load(load)
    if math.floor(math.max(pool_cap - total, 0) / cost) <= above then return true end
  end
  if cap <= 0 then return false end
  local free = 0
  local open = redis.call('ZRANGEBYSCORE', load, '-inf', '(' .. cap, 'WITHSCORES')
  for i = 2, #open, 2 do
    free = free + math.floor((cap - tonumber(open[i])) / cost)
    if free > above then return false end
  end
  return true
end
