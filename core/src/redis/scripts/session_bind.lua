-- endpoint_metrics session binding (docs/redis-data-model.md §10): one call, one key.
-- KEYS[1] the session key; ARGV[1] sessionTTL (s); ARGV[2] the scheduler's pick;
-- ARGV[3..] the pods a session may stay on (healthy, with metrics, not saturated).
-- Reply: {"OK", endpoint, 0, 0, state}: 1 kept, 2 new, 3 rebound (the acquire replies' shape).
local ttl = tonumber(ARGV[1])
local cur = redis.call('GET', KEYS[1])
if cur then
  for i = 2, #ARGV do
    if ARGV[i] == cur then
      -- Refreshed once a tenth of the TTL has passed, as pick.lua's session_get does.
      if redis.call('PTTL', KEYS[1]) < ttl * 900 then
        redis.call('EXPIRE', KEYS[1], ttl)
      end
      return {'OK', cur, 0, 0, 1}
    end
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ttl)
if cur then
  return {'OK', ARGV[2], 0, 0, 3}
end
return {'OK', ARGV[2], 0, 0, 2}
