-- global_least_request: atomic pick-and-increment with a lease.
-- KEYS[1] load    zset  member = endpoint, score = in-flight load
-- KEYS[2] leases  zset  member = "<request id>|<endpoint>|<cost>", score = expiry (ms)
-- KEYS[3] members string fingerprint of the endpoint set synced into KEYS[1]
-- KEYS[4] session string the session's endpoint (only when ARGV[9] > 0)
-- KEYS[#KEYS-4] health hash, KEYS[#KEYS-3] ejected zset (health.lua; always sent)
-- KEYS[#KEYS-2] wait zset, the waiting queue's waiters (pick.lua's outranked; always sent)
-- KEYS[#KEYS-1] tenants hash, KEYS[#KEYS] seen zset (pick.lua's admit; always sent)
-- ARGV[1] now (ms)  ARGV[2] lease ttl (ms)  ARGV[3] request id  ARGV[4] cost
-- ARGV[5] cap (0 = none)  ARGV[6] random u32  ARGV[7] fingerprint  ARGV[8] reclaim limit
-- ARGV[9] session TTL (s, 0 = no session)  ARGV[10] session max imbalance, absolute
-- ARGV[11] session max imbalance, ratio
-- ARGV[12] pool cap (0 = none)  ARGV[13] tenant id ('' = none)  ARGV[14] tenant limit
-- ARGV[15] tenant window (ms)  ARGV[16] the request's class rank for the waiting queue
-- (-1 = no queue check)  ARGV[17] requests an endpoint on trial takes (health.lua; 0 = off)
-- ARGV[18..] the healthy endpoints, sent only when the caller's set changed.
-- Reply: {"OK", endpoint, 0, 0, session state (0 without a session, else pick.lua's
-- session_pick), the endpoint's load before this request, 0, 0, 1 when every endpoint was
-- ejected (chosen as if none were)} | {"FULL", min load} | {"POOL", pool load} |
-- {"TENANT", tenant's load} | {"SYNC"} | {"EMPTY"}
local load, leases = KEYS[1], KEYS[2]
local tenants, seen = KEYS[#KEYS - 1], KEYS[#KEYS]
local now = tonumber(ARGV[1])

if #ARGV > 17 then
  sync_members(load, KEYS[3], ARGV[7], 18, ARGV)
elseif redis.call('GET', KEYS[3]) ~= ARGV[7] then
  return {'SYNC'}
end
reclaim(load, leases, now, tonumber(ARGV[8]), tenants)
local health, ejected = KEYS[#KEYS - 4], KEYS[#KEYS - 3]
end_ejections(load, health, ejected, now)

local cost, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local rank = tonumber(ARGV[16])
local session_ttl = tonumber(ARGV[9])
-- A sticky request reads its binding first: a kept session needs neither the least-loaded
-- endpoint nor the tie-break (pick.lua's session_pick; nothing is counted before admission).
local pick, session, min = nil, 0, nil
if session_ttl > 0 then
  pick, session, min = session_pick(load, KEYS[4], session_ttl, cost, cap, nil,
    tonumber(ARGV[10]), tonumber(ARGV[11]))
end
local first
if not pick or rank >= 0 then
  first, min = lowest(load)
  if not first then return {'EMPTY'} end
end
-- Every endpoint ejected: fail open, choosing as if none were (the marks cancel out).
local all_out = min and tonumber(min) >= EJECTED
local tenant, window, pool_cap = ARGV[13], tonumber(ARGV[15]), tonumber(ARGV[12])
local refused, pool_total = admit(load, tenants, seen, now, cost, pool_cap, tenant,
  tonumber(ARGV[14]), window)
if refused then return refused end
if rank >= 0 and outranked(KEYS[#KEYS - 2], rank, now, load, cap, pool_cap, cost, pool_total) then
  return {'FULL', real(min)}
end
if not pick then
  if cap > 0 and real(min) > 0 and real(min) + cost > cap then
    return {'FULL', real(min)}
  end
  pick = tie_break(load, first, min, tonumber(ARGV[6]))
end
local expiry = now + tonumber(ARGV[2])
local before = take(load, leases, pick, ARGV[4], expiry, lease_id(ARGV[3], tenant))
probe(load, health, ejected, pick, before + cost, tonumber(ARGV[17]), expiry)
tenant_take(tenants, seen, now, cost, tenant, window)
if session_ttl > 0 then
  -- A kept binding's TTL was refreshed by its read when due; a new or moved one is written.
  if session ~= 1 then
    redis.call('SET', KEYS[4], pick, 'EX', session_ttl)
  end
end
return {'OK', pick, 0, 0, session, real(before), 0, 0, all_out and 1 or 0}
