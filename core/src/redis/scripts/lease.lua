-- Shared by every script that acquires or releases (prepended by src/redis/scripts.rs).
-- A lease member is "<request id>|<endpoint>|<cost>"; a request of a tenant has
-- "<request id>~<tenant id>" as its first part (docs/redis-data-model.md §11). Giving it back
-- subtracts the cost from the endpoint's load, clamped at 0, and from the tenant's in-flight
-- count in `tenants` (when given; a count at 0 is deleted). ZADD XX: an endpoint that a
-- membership sync removed is not resurrected by a late release.
local function give_back(load, member, tenants)
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
  end
end
