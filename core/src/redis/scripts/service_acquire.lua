-- cluster_metrics AdaptiveScore, global in-flight: Higress's selection (lowest local score x
-- (global count + 1), ties uniformly at random) plus a lease so a crashed gateway's counts heal.
-- KEYS[1] counts hash, KEYS[2] leases zset
-- ARGV[1] now (ms)  ARGV[2] lease ttl (ms)  ARGV[3] key ttl (s, 0 = none)  ARGV[4] request id
-- ARGV[5] random u32  ARGV[6] reclaim limit  ARGV[7..] pairs: service, local score
-- Reply: {"OK", service, count after, score} | {"EMPTY"}
local counts, leases = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])

local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, tonumber(ARGV[6]))
for _, m in ipairs(expired) do
  if redis.call('ZREM', leases, m) == 1 then give_back_service(counts, m) end
end

-- Reservoir sampling among equal scores, from the caller's random number (no server PRNG).
local seed = tonumber(ARGV[5]) % 2147483648
local best, best_score, ties = nil, nil, 0
for i = 7, #ARGV - 1, 2 do
  local g = tonumber(redis.call('HGET', counts, ARGV[i]) or '0') or 0
  if g < 0 then g = 0 end
  local s = tonumber(ARGV[i + 1]) * (g + 1)
  if best == nil or s < best_score then
    best, best_score, ties = ARGV[i], s, 1
  elseif s == best_score then
    ties = ties + 1
    seed = (seed * 1103515245 + 12345) % 2147483648
    if seed % ties == 0 then best = ARGV[i] end
  end
end
if best == nil then return {'EMPTY'} end

local n = redis.call('HINCRBY', counts, best, 1)
redis.call('ZADD', leases, now + tonumber(ARGV[2]), ARGV[4] .. '|' .. best .. '|1')
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  -- Both keys live and die together, so no count outlives the lease that would heal it.
  redis.call('EXPIRE', counts, ttl)
  redis.call('PEXPIRE', leases, math.max(ttl * 1000, tonumber(ARGV[2])))
end
return {'OK', best, n, tostring(best_score)}
