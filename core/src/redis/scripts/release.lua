-- Release a lease: remove it and give its cost back, only if it was still there (idempotent),
-- and learn from the request's outcome (docs/redis-data-model.md §14).
-- KEYS[1] load zset, KEYS[2] leases zset, KEYS[3] tenants hash (docs/redis-data-model.md §11),
-- KEYS[4] health hash, KEYS[5] ejected zset (health.lua), then for a prefix_cache route
-- KEYS[6] prefill zset, KEYS[7] booked hash (§13): a booking not yet given back at the first
-- bytes goes with the lease.
-- ARGV[1] the outcome: 's' answered (not 5xx), 'f' failed (5xx), '-' nothing to learn (no
-- answer through this lease, or a lost reply's guesses)
-- ARGV[2] now (ms)  ARGV[3] failures in a row that eject (0: failure memory off)
-- ARGV[4] first ejection (ms)  ARGV[5] longest ejection (ms)  ARGV[6] most endpoints ejected
-- at once (percent of the pool, at least one)  ARGV[7] how long a failed request's count
-- stays on its endpoint (ms)
-- ARGV[8..] candidate lease members; the first one present is released. A caller that knows
-- its lease sends one; after a lost reply it sends one per endpoint the pick could have chosen.
-- Reply: 0 nothing released, 1 released, 2 released and its endpoint ejected, 3 released and
-- its endpoint's ejection refused (too many ejected already).
local load, leases, tenants, health, ejected = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local outcome, now = ARGV[1], tonumber(ARGV[2])
local after = tonumber(ARGV[3])

-- Eject `ep` for a backoff that doubles with each ejection, unless too many are out.
local function eject(ep)
  local out = redis.call('ZSCORE', ejected, ep)
  if not out then
    local pool = redis.call('ZCARD', load)
    local most = math.max(1, math.floor(pool * tonumber(ARGV[6]) / 100))
    if redis.call('ZCARD', ejected) >= most then return 3 end
  end
  local n = redis.call('HINCRBY', health, 'n:' .. ep, 1)
  local ms = math.min(tonumber(ARGV[4]) * 2 ^ math.min(n - 1, 20), tonumber(ARGV[5]))
  redis.call('ZADD', ejected, now + ms, ep)
  local s = redis.call('ZSCORE', load, ep)
  if s and tonumber(s) < EJECTED then redis.call('ZINCRBY', load, EJECTED, ep) end
  redis.call('HDEL', health, 'f:' .. ep, 't:' .. ep)
  return 2
end

-- What the outcome teaches about `ep`: an answer clears its failures and ends its trial (its
-- backoff exponent halves); a failure on trial, or the `after`th in a row, ejects it.
local function learn(ep)
  redis.call('PEXPIRE', health, 86400000)
  if outcome == 's' then
    redis.call('HDEL', health, 'f:' .. ep)
    if redis.call('HDEL', health, 't:' .. ep) == 1 then
      local n = tonumber(redis.call('HGET', health, 'n:' .. ep) or '0')
      redis.call('HSET', health, 'n:' .. ep, math.floor(n / 2))
      if redis.call('ZREM', ejected, ep) == 1 then
        local s = redis.call('ZSCORE', load, ep)
        if s and tonumber(s) >= EJECTED then redis.call('ZINCRBY', load, -EJECTED, ep) end
      end
    end
    return 1
  end
  local trial = redis.call('HEXISTS', health, 't:' .. ep) == 1
  if not trial and redis.call('ZSCORE', ejected, ep) then
    -- Out already: a request sent before the ejection neither extends nor repeats it.
    return 1
  end
  if trial or redis.call('HINCRBY', health, 'f:' .. ep, 1) >= after then
    return eject(ep)
  end
  return 1
end

for i = 8, #ARGV do
  local m = ARGV[i]
  if redis.call('ZSCORE', leases, m) then
    local id, ep = string.match(m, '^([^|]*)|(.*)|[^|]*$')
    local penalty = tonumber(ARGV[7])
    if outcome == 'f' and after > 0 and penalty > 0 then
      -- A pod that fails fast must not look idle: the failed request's count stays on it
      -- until the reclaim gives it back; its booking goes now.
      redis.call('ZADD', leases, 'XX', now + penalty, m)
      if KEYS[7] and id then unbook(KEYS[6], KEYS[7], id) end
    else
      redis.call('ZREM', leases, m)
      give_back(load, m, tenants, KEYS[6], KEYS[7])
    end
    if after > 0 and ep and outcome ~= '-' then return learn(ep) end
    return 1
  end
end
return 0
