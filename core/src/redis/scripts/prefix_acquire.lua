-- prefix_cache: route to the endpoint holding the longest known prefix of this prompt, unless
-- it is too loaded; then count the request exactly as global_least_request does, and book its
-- uncached prompt tokens on the endpoint until its first bytes (docs/redis-data-model.md §13).
-- KEYS[1] load, KEYS[2] leases, KEYS[3] members (as in glr_acquire.lua)
-- KEYS[4] prefill zset, KEYS[5] booked hash, KEYS[6] rates hash (§13)
-- KEYS[7] the pods' generations (hash, prefix_forget.lua; §5)
-- KEYS[8] the latency models' coefficients (hash, latency_merge.lua; §15)
-- KEYS[9..] the prompt's chained prefix keys, shortest prefix first (computed by the plugin),
-- then, only when ARGV[12] > 0, the session key (as in glr_acquire.lua), then the health
-- hash, the ejected zset, the wait zset, the tenants hash and the seen zset (as in
-- glr_acquire.lua; always sent).
-- ARGV[1..8] as in glr_acquire.lua
-- ARGV[9] prefix key TTL (s)  ARGV[10] max imbalance, absolute  ARGV[11] max imbalance, ratio
-- ARGV[12] session TTL (s, 0 = no session); the session's guard is ARGV[10], ARGV[11]
-- ARGV[13..16] pool cap, tenant id, tenant limit, tenant window (as glr_acquire.lua's 12..15)
-- ARGV[17] the request's class rank for the waiting queue (-1 = no queue check)
-- ARGV[18] the prompt's tokens (estimate)  ARGV[19] affinity threshold (share of the prompt)
-- ARGV[20] max TTFT penalty (ms)  ARGV[21] prefill rate before learning (tokens/s)
-- ARGV[22] 1: use the learned rates, 0: ARGV[21] for every endpoint
-- ARGV[23] requests an endpoint on trial takes (health.lua; 0 = off)
-- ARGV[24] 1: place by predicted latency (§15), 0: by the token gate
-- ARGV[25] the request's TTFT objective (ms, 0 = none)  ARGV[26] its TPOT objective (ms, 0 = none)
-- ARGV[27] 1: the request may be shed when no endpoint is predicted to meet its objectives
-- ARGV[28..27+n] the prompt's tokens up to the end of each chain key's block (n chain keys)
-- ARGV[28+n..] the healthy endpoints, sent only when the caller's set changed.
-- Reply: {"OK", endpoint, matched depth, spilled 0|1, session state (0 without a session, else
-- pick.lua's session_pick), the endpoint's load before this request, its prefill tokens before
-- this request, the tokens booked, 1 when every endpoint was ejected, the predicted TTFT and
-- TPOT (µs) on it (-1: not predicted)} | {"FULL", min load}
-- | {"SHED", predicted TTFT (µs), predicted TPOT (µs)} (nothing taken)
-- | {"POOL", pool load}
-- | {"TENANT", tenant's load} | {"SYNC"} | {"EMPTY"}
local load, leases = KEYS[1], KEYS[2]
local prefill, booked, rates = KEYS[4], KEYS[5], KEYS[6]
local tenants, seen = KEYS[#KEYS - 1], KEYS[#KEYS]
local now = tonumber(ARGV[1])
local session_ttl = tonumber(ARGV[12])
local n = #KEYS - 13
if session_ttl > 0 then n = n - 1 end

if #ARGV > 27 + n then
  sync_members(load, KEYS[3], ARGV[7], 28 + n, ARGV, prefill)
elseif redis.call('GET', KEYS[3]) ~= ARGV[7] then
  return {'SYNC'}
end
reclaim(load, leases, now, tonumber(ARGV[8]), tenants, prefill, booked)
local health, ejected = KEYS[#KEYS - 4], KEYS[#KEYS - 3]
end_ejections(load, health, ejected, now)
local tenant, window = ARGV[14], tonumber(ARGV[16])

-- The deepest known prefix whose endpoint is still a member (healthy). A key pointing at an
-- endpoint that left is skipped, not followed: the chain itself never depends on Redis.
-- Deepest first, in two reads: a conversation's next turn matches all but its newest blocks,
-- so the last few keys usually answer; the rest are read only when they do not.
local skey = KEYS[#KEYS - 5]
-- A key's value is its pod (generation 0) or `<pod>#<generation>`; a key written at an older
-- generation than the pod's current one is unknown: the pod lost that cache since
-- (docs/redis-data-model.md §5 "Engine-verified keys"). One HGET per distinct pod read.
local gens, gen_of = KEYS[7], {}
local function gen(ep)
  local g = gen_of[ep]
  if g == nil then
    g = tonumber(redis.call('HGET', gens, ep)) or 0
    gen_of[ep] = g
  end
  return g
end
local function owner(v)
  local ep, g = string.match(v, '^(.*)#(%d+)$')
  if ep then return ep, tonumber(g) end
  return v, 0
end
local depth, matched, matched_load = 0, nil, nil
local function scan(lo, hi)
  if hi < lo then return false end
  local owners = redis.call('MGET', unpack(KEYS, 8 + lo, 8 + hi))
  for i = hi, lo, -1 do
    local ep, g = nil, 0
    if owners[i - lo + 1] then ep, g = owner(owners[i - lo + 1]) end
    if ep and g == gen(ep) then
      local score = redis.call('ZSCORE', load, ep)
      if score then
        depth, matched, matched_load = i, ep, tonumber(score)
        return true
      end
    end
  end
  return false
end
local tail_from = math.max(1, n - 3)
if not scan(tail_from, n) then scan(1, tail_from - 1) end

local cost, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local first, min_s = lowest(load)
if not first then return {'EMPTY'} end
-- Every endpoint ejected: fail open, choosing as if none were (the marks cancel out).
local all_out = tonumber(min_s) >= EJECTED
local pool_cap = tonumber(ARGV[13])
local refused, pool_total = admit(load, tenants, seen, now, cost, pool_cap, tenant,
  tonumber(ARGV[15]), window)
if refused then return refused end
local min = tonumber(min_s)
local rank = tonumber(ARGV[17])
if rank >= 0 and outranked(KEYS[#KEYS - 2], rank, now, load, cap, pool_cap, cost, pool_total) then
  return {'FULL', real(min_s)}
end
local pick, spilled, session = matched, 0, 0
local kept = nil
if session_ttl > 0 then
  -- A session kept on its endpoint wins over the prefix match (issue: sessions compose with
  -- prefix routing); over the guard, the prefix match and then the least-loaded decide.
  kept, session = session_pick(load, skey, session_ttl, cost, cap, min,
    tonumber(ARGV[10]), tonumber(ARGV[11]))
end
local lat = ARGV[24] == '1'
if kept then
  pick = kept
elseif matched and not lat then
  -- Load guard: leave the cached endpoint only if it is busier than the least-loaded one by
  -- more than both thresholds (absolute and relative), or at the cap.
  local over_cap = cap > 0 and matched_load + cost > cap
  if over_cap or (matched_load - min > tonumber(ARGV[10]) and matched_load > min * tonumber(ARGV[11])) then
    pick, spilled = nil, 1
  end
end
-- Sticky until saturated (§13): a match must cover `threshold` of the prompt, and the warm
-- endpoint's estimated TTFT (its booked prefill tokens and this request's uncached ones, at its
-- prefill rate) may exceed the best cold endpoint's by at most the penalty. An estimate under
-- the penalty cannot exceed any other by more, so a quiet warm endpoint costs two reads.
local prompt, threshold, penalty = tonumber(ARGV[18]), tonumber(ARGV[19]), tonumber(ARGV[20])
local start_rate, learn = tonumber(ARGV[21]), ARGV[22] == '1'
local function cached(d)
  if d == 0 then return 0 end
  return tonumber(ARGV[27 + d])
end
local function eta_ms(ep, uncached)
  local rate = learn and tonumber(redis.call('HGET', rates, ep)) or start_rate
  local queued = tonumber(redis.call('ZSCORE', prefill, ep) or '0')
  return (queued + uncached) * 1000 / math.max(rate, 1)
end
-- The cold endpoint (all of the prompt to prefill) with the lowest estimate, among the few with
-- the fewest booked tokens and the least loaded; one at the cap is not a choice.
local function best_cold(warm)
  local best, best_eta = nil, nil
  local candidates = redis.call('ZRANGE', prefill, 0, 3)
  candidates[#candidates + 1] = first
  for _, ep in ipairs(candidates) do
    local score = ep ~= warm and redis.call('ZSCORE', load, ep)
    if score and (all_out or tonumber(score) < EJECTED)
        and not (cap > 0 and real(score) + cost > cap) then
      local e = eta_ms(ep, prompt)
      if not best_eta or e < best_eta then best, best_eta = ep, e end
    end
  end
  return best, best_eta
end
if pick and pick == matched and not kept and not lat then
  if cached(depth) < threshold * prompt then
    pick, spilled = nil, 1
  else
    local warm = eta_ms(matched, math.max(prompt - cached(depth), 0))
    if warm > penalty then
      local cold, cold_eta = best_cold(matched)
      if cold and warm - cold_eta > penalty then pick, spilled = cold, 1 end
    end
  end
end
-- Latency-aware (§15): every endpoint's TTFT and TPOT for this request predicted from its
-- coefficients (the fleet's prior for one without), its booked prefill tokens and its load.
-- With objectives the endpoint that meets them with the most room is chosen, the warm one
-- whenever it meets them; when none does, a sheddable request is shed with a probability
-- that grows with the predicted miss. Without objectives the lowest predicted TTFT wins, the
-- warm endpoint within the penalty. The plain-Envoy build's rule is the same
-- (core/src/latency/choose.rs); both are held to one table (choose_cases.rs).
local pred_ttft, pred_tpot = -1, -1
if lat and not kept then
  pick, spilled = nil, 0
  local slo_ttft, slo_tpot = tonumber(ARGV[25]), tonumber(ARGV[26])
  local has_slo = slo_ttft > 0 or slo_tpot > 0
  local coef = {}
  local rows = redis.call('HGETALL', KEYS[8])
  for i = 1, #rows, 2 do
    local c = {}
    for x in string.gmatch(rows[i + 1], '[^,]+') do c[#c + 1] = tonumber(x) end
    if #c == 6 then coef[rows[i]] = c end
  end
  local per_k = 1e6 / math.max(start_rate, 1)
  local default = coef['*'] or {0, per_k, 0, 0, 0, 0}
  local queued = {}
  local q = redis.call('ZRANGE', prefill, 0, -1, 'WITHSCORES')
  for i = 1, #q, 2 do queued[q[i]] = tonumber(q[i + 1]) end
  local function predict(ep, running)
    local c = coef[ep] or default
    local un = prompt
    if ep == matched then un = math.max(prompt - cached(depth), 0) end
    local ttft = c[1] + c[2] * ((queued[ep] or 0) + un) / 1000 + c[3] * running
    local tpot = c[4] + c[5] * running + c[6] * prompt / 1000
    return math.max(ttft, 0), math.max(tpot, 0)
  end
  -- The larger share of either objective the prediction uses (above 1: missed).
  local function over(ttft, tpot)
    local m = 0
    if slo_ttft > 0 then m = math.max(m, ttft / slo_ttft) end
    if slo_tpot > 0 then m = math.max(m, tpot / slo_tpot) end
    return m
  end
  local best, best_key, best_load, bt, bp = nil, nil, nil, 0, 0
  local warm = nil
  local loads = redis.call('ZRANGE', load, 0, -1, 'WITHSCORES')
  for i = 1, #loads, 2 do
    local ep, s = loads[i], tonumber(loads[i + 1])
    if (all_out or s < EJECTED) and not (cap > 0 and real(s) + cost > cap) then
      local running = real(s)
      local ttft, tpot = predict(ep, running)
      local key = ttft
      if has_slo then key = over(ttft, tpot) end
      if ep == matched then warm = {key, ttft, tpot} end
      if not best_key or key < best_key or (key == best_key and running < best_load) then
        best, best_key, best_load, bt, bp = ep, key, running, ttft, tpot
      end
    end
  end
  if warm and ((has_slo and warm[1] <= 1) or (not has_slo and warm[2] - bt <= penalty)) then
    pick, pred_ttft, pred_tpot = matched, warm[2], warm[3]
  elseif best then
    if has_slo and best_key > 1 and ARGV[27] == '1' then
      -- Graduated admission: shed with probability 1 - 1/miss (none at the objective, one
      -- in two at twice it); nothing was taken yet.
      local r = (tonumber(ARGV[6]) % 1000003) / 1000003
      if r < 1 - 1 / best_key then
        return {'SHED', math.floor(bt * 1000), math.floor(bp * 1000)}
      end
    end
    pick, pred_ttft, pred_tpot = best, bt, bp
    if matched and best ~= matched then spilled = 1 end
  end
end
if not pick then
  if cap > 0 and real(min) > 0 and real(min) + cost > cap then
    return {'FULL', real(min)}
  end
  pick = tie_break(load, first, min_s, tonumber(ARGV[6]))
end

local ttl = tonumber(ARGV[9])
if depth > 0 then
  redis.call('EXPIRE', KEYS[8 + depth], ttl)
end
-- The chosen endpoint will hold the whole prompt: the keys past the match point to it, so this
-- conversation's next turn follows it. After a spill the shorter, shared keys stay where they
-- were: moving them would herd every conversation sharing that prefix onto the new endpoint.
local stamp = pick
if depth < n and gen(pick) > 0 then stamp = pick .. '#' .. gen(pick) end
for i = depth + 1, n do
  redis.call('SET', KEYS[8 + i], stamp, 'EX', ttl)
end
local expiry = now + tonumber(ARGV[2])
local before = take(load, leases, pick, ARGV[4], expiry, lease_id(ARGV[3], tenant))
probe(load, health, ejected, pick, before + cost, tonumber(ARGV[23]), expiry)
tenant_take(tenants, seen, now, cost, tenant, window)
local uncached, ahead = prompt, 0
if pick == matched then uncached = math.max(prompt - cached(depth), 0) end
if uncached > 0 then
  ahead = tonumber(redis.call('ZINCRBY', prefill, uncached, pick)) - uncached
  redis.call('HSET', booked, lease_id(ARGV[3], tenant), pick .. '|' .. uncached)
else
  -- Nothing booked (a fully cached prompt): the tokens ahead still tell the latency models
  -- what this request waited behind.
  ahead = tonumber(redis.call('ZSCORE', prefill, pick) or '0')
end
if session_ttl > 0 then
  -- A kept binding's TTL was refreshed by its read when due; a new or moved one is written.
  if session ~= 1 then
    redis.call('SET', skey, pick, 'EX', session_ttl)
  end
end
if pred_ttft >= 0 then pred_ttft, pred_tpot = math.floor(pred_ttft * 1000), math.floor(pred_tpot * 1000) end
return {'OK', pick, depth, spilled, session, real(before), ahead, uncached, all_out and 1 or 0,
  pred_ttft, pred_tpot}
