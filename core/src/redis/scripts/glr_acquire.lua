-- global_least_request: atomic pick-and-increment with a lease.
-- KEYS[1] load    zset  member = endpoint, score = in-flight load
-- KEYS[2] leases  zset  member = "<request id>|<endpoint>|<cost>", score = expiry (ms)
-- KEYS[3] members string fingerprint of the endpoint set synced into KEYS[1]
-- KEYS[4] session string the session's endpoint (only when ARGV[9] > 0)
-- KEYS[last] wait  zset   the waiting queue's waiters (only when ARGV[12] >= 0, pick.lua)
-- ARGV[1] now (ms)  ARGV[2] lease ttl (ms)  ARGV[3] request id  ARGV[4] cost
-- ARGV[5] cap (0 = none)  ARGV[6] random u32  ARGV[7] fingerprint  ARGV[8] reclaim limit
-- ARGV[9] session TTL (s, 0 = no session)  ARGV[10] session max imbalance, absolute
-- ARGV[11] session max imbalance, ratio
-- ARGV[12] the request's class rank for the waiting queue (-1 = no queue check)
-- ARGV[13..] the healthy endpoints, sent only when the caller's set changed.
-- Reply: {"OK", endpoint, load before} without a session, {"OK", endpoint, 0, 0, session
-- state (pick.lua's session_pick)} with one | {"FULL", min load} | {"SYNC"} | {"EMPTY"}
local load, leases = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])

if #ARGV > 12 then
  sync_members(load, KEYS[3], ARGV[7], 13, ARGV)
elseif redis.call('GET', KEYS[3]) ~= ARGV[7] then
  return {'SYNC'}
end
reclaim(load, leases, now, tonumber(ARGV[8]))

local first, min = lowest(load)
if not first then return {'EMPTY'} end
local cost, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local rank = tonumber(ARGV[12])
if rank >= 0 and outranked(KEYS[#KEYS], rank, now, load, cap, cost) then
  return {'FULL', min}
end
local session_ttl = tonumber(ARGV[9])
local pick, session = nil, 0
if session_ttl > 0 then
  pick, session = session_pick(load, KEYS[4], cost, cap, tonumber(min),
    tonumber(ARGV[10]), tonumber(ARGV[11]))
end
if not pick then
  if cap > 0 and tonumber(min) > 0 and tonumber(min) + cost > cap then
    return {'FULL', min}
  end
  pick = tie_break(load, first, min, tonumber(ARGV[6]))
end
take(load, leases, pick, ARGV[4], now + tonumber(ARGV[2]), ARGV[3])
if session_ttl > 0 then
  -- A kept binding only needs its TTL refreshed; a new or moved one is written.
  if session == 1 then
    redis.call('EXPIRE', KEYS[4], session_ttl)
  else
    redis.call('SET', KEYS[4], pick, 'EX', session_ttl)
  end
  return {'OK', pick, 0, 0, session}
end
return {'OK', pick, min}
