-- Shared by every script that acquires or releases (prepended by src/redis/scripts.rs).
-- A lease member is "<request id>|<endpoint>|<cost>"; a request of a tenant has
-- "<request id>~<tenant id>" as its first part (docs/redis-data-model.md §11). Giving it back
-- subtracts the cost from the endpoint's load, clamped at 0, and from the tenant's in-flight
-- count in `tenants` (when given; a count at 0 is deleted). ZADD XX: an endpoint that a
-- membership sync removed is not resurrected by a late release.

-- A prefix_cache request's uncached prompt tokens, booked on its endpoint until its first
-- response bytes (docs/redis-data-model.md §13): `booked` (hash: lease id -> "<endpoint>|<tokens>")
-- and `prefill` (zset: endpoint -> tokens). Given back once, whichever comes first: the first
-- bytes (prefill_done.lua), the lease's release, or its reclaim. Returns the endpoint, or nil
-- when nothing was booked (or it was already given back).
local function unbook(prefill, booked, id)
  local v = redis.call('HGET', booked, id)
  if not v then return nil end
  redis.call('HDEL', booked, id)
  local ep, t = string.match(v, '^(.*)|(%d+)$')
  if ep then
    local s = redis.call('ZADD', prefill, 'XX', 'INCR', -tonumber(t), ep)
    if s and tonumber(s) < 0 then redis.call('ZADD', prefill, 'XX', 0, ep) end
  end
  return ep
end

-- `prefill`, `booked`: nil for routes that book nothing (global_least_request).
local function give_back(load, member, tenants, prefill, booked)
  local id, ep, c = string.match(member, '^([^|]*)|(.*)|([^|]*)$')
  if ep then
    local s = redis.call('ZADD', load, 'XX', 'INCR', -tonumber(c), ep)
    if s and tonumber(s) < 0 then redis.call('ZADD', load, 'XX', 0, ep) end
    local t = tenants and string.match(id, '~(%x+)$')
    if t then
      if redis.call('HINCRBY', tenants, t, -tonumber(c)) <= 0 then
        redis.call('HDEL', tenants, t)
      end
    end
    if booked then unbook(prefill, booked, id) end
  end
end
