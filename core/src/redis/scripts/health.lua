-- Failure memory (docs/redis-data-model.md §14), shared by the endpoint acquire scripts,
-- release.lua and moved.lua (prepended by src/redis/scripts.rs, after lease.lua). An
-- ejected endpoint carries EJECTED on top of its load: every pick passes over it as it passes over a busy
-- one (the least-loaded choice, a session's and a prefix match's load guard), with no read
-- of its own, until no endpoint is left without it. `ejected` (zset: endpoint -> until, ms)
-- says until when; `health` (hash) holds per endpoint `f:<ep>` its failures in a row, `n:<ep>`
-- how often it was ejected (the backoff's exponent) and `t:<ep>` that it is on trial.
local EJECTED = 1e12

-- A load score without the ejection mark.
local function real(score)
  return tonumber(score) % EJECTED
end

-- Ejections whose time is up end: the endpoint goes back on trial (half-open).
local function end_ejections(load, health, ejected, now)
  for _, ep in ipairs(redis.call('ZRANGEBYSCORE', ejected, '-inf', now)) do
    redis.call('ZREM', ejected, ep)
    local s = redis.call('ZSCORE', load, ep)
    if s and tonumber(s) >= EJECTED then redis.call('ZINCRBY', load, -EJECTED, ep) end
    redis.call('HSET', health, 't:' .. ep, 1)
  end
end

-- After a take that left `after` on `ep`: an endpoint on trial takes no more than `trials`
-- requests until one of them answers (release.lua) or `until_ms` (the lease time) passes.
local function probe(load, health, ejected, ep, after, trials, until_ms)
  if trials > 0 and real(after) >= trials and redis.call('HEXISTS', health, 't:' .. ep) == 1 then
    redis.call('ZINCRBY', load, EJECTED, ep)
    redis.call('ZADD', ejected, until_ms, ep)
  end
end

-- What release.lua and moved.lua learn with: `rules` = {after = failures in a row that eject,
-- first = first ejection (ms), most = longest ejection (ms), percent = most endpoints ejected
-- at once (percent of the pool, at least one)}.

-- Eject `ep` for a backoff that doubles with each ejection, unless too many are out.
-- Returns 2 ejected, 3 refused (too many ejected already).
local function eject(load, health, ejected, ep, now, rules)
  local out = redis.call('ZSCORE', ejected, ep)
  if not out then
    local pool = redis.call('ZCARD', load)
    local most = math.max(1, math.floor(pool * rules.percent / 100))
    if redis.call('ZCARD', ejected) >= most then return 3 end
  end
  local n = redis.call('HINCRBY', health, 'n:' .. ep, 1)
  local ms = math.min(rules.first * 2 ^ math.min(n - 1, 20), rules.most)
  redis.call('ZADD', ejected, now + ms, ep)
  local s = redis.call('ZSCORE', load, ep)
  if s and tonumber(s) < EJECTED then redis.call('ZINCRBY', load, EJECTED, ep) end
  redis.call('HDEL', health, 'f:' .. ep, 't:' .. ep)
  return 2
end

-- What `outcome` ('s' answered, 'f' failed) teaches about `ep`: an answer clears its failures
-- and ends its trial (its backoff exponent halves); a failure on trial, or the `after`th in a
-- row, ejects it. Returns 1, or eject's 2 / 3.
local function learn(load, health, ejected, ep, outcome, now, rules)
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
  if trial or redis.call('HINCRBY', health, 'f:' .. ep, 1) >= rules.after then
    return eject(load, health, ejected, ep, now, rules)
  end
  return 1
end

-- Takes lease `m` off: a failed request's count stays on its endpoint `penalty` ms more (a pod
-- that fails fast must not look idle; the reclaim gives it back), its prefill booking goes
-- now; with no penalty the whole count goes now.
local function settle(load, leases, tenants, prefill, booked, m, penalty, now)
  if penalty > 0 then
    redis.call('ZADD', leases, 'XX', now + penalty, m)
    local id = string.match(m, '^([^|]*)|')
    if booked and id then unbook(prefill, booked, id) end
  else
    redis.call('ZREM', leases, m)
    give_back(load, m, tenants, prefill, booked)
  end
end
