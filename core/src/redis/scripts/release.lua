-- Release a lease: remove it and give its cost back, only if it was still there (idempotent).
-- KEYS[1] load zset, KEYS[2] leases zset, KEYS[3] tenants hash (docs/redis-data-model.md §11),
-- then for a prefix_cache route KEYS[4] prefill zset, KEYS[5] booked hash (§13): a booking
-- not yet given back at the first bytes goes with the lease.
-- ARGV[1..] candidate lease members; the first one present is released. A caller that knows
-- its lease sends one; after a lost reply it sends one per endpoint the pick could have chosen.
-- Reply: 1 if a lease was released, 0 otherwise.
for i = 1, #ARGV do
  if redis.call('ZREM', KEYS[2], ARGV[i]) == 1 then
    give_back(KEYS[1], ARGV[i], KEYS[3], KEYS[4], KEYS[5])
    return 1
  end
end
return 0
