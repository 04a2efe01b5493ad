-- cluster_metrics global in-flight: give a lease back (idempotent, like release.lua).
-- KEYS[1] counts hash, KEYS[2] leases zset
-- ARGV[1..] candidate lease members; the first one present is released.
-- Reply: 1 if a lease was released, 0 otherwise.
for i = 1, #ARGV do
  if redis.call('ZREM', KEYS[2], ARGV[i]) == 1 then
    give_back_service(KEYS[1], ARGV[i])
    return 1
  end
end
return 0
