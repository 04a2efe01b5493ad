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
local rules = {after = after, first = tonumber(ARGV[4]), most = tonumber(ARGV[5]),
  percent = tonumber(ARGV[6])}

for i = 8, #ARGV do
  local m = ARGV[i]
  if redis.call('ZSCORE', leases, m) then
    local ep = string.match(m, '^[^|]*|(.*)|[^|]*$')
    local failed = outcome == 'f' and after > 0
    settle(load, leases, tenants, KEYS[6], KEYS[7], m, failed and tonumber(ARGV[7]) or 0, now)
    if after > 0 and ep and outcome ~= '-' then
      return learn(load, health, ejected, ep, outcome, now, rules)
    end
    return 1
  end
end
return 0
