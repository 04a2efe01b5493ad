-- Shared by every script that acquires or releases (prepended by src/redis/scripts.rs).
-- A lease member is "<request id>|<endpoint>|<cost>". Giving it back subtracts the cost from
-- the endpoint's load, clamped at 0. ZADD XX: an endpoint that a membership sync removed is
-- not resurrected by a late release.
local function give_back(load, member)
  local ep, c = string.match(member, '^[^|]*|(.*)|([^|]*)$')
  if ep then
    local s = redis.call('ZADD', load, 'XX', 'INCR', -tonumber(c), ep)
    if s and tonumber(s) < 0 then redis.call('ZADD', load, 'XX', 0, ep) end
  end
end

