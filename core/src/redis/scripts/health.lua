-- Failure memory (docs/redis-data-model.md §14), shared by the endpoint acquire scripts and
-- release.lua (prepended by src/redis/scripts.rs, after lease.lua). An ejected endpoint
-- carries EJECTED on top of its load: every pick passes over it as it passes over a busy
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
