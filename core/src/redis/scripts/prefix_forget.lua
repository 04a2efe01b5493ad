-- prefix_cache, engine-verified keys (docs/redis-data-model.md §5): an engine cached far less
-- of a prompt than its pod was thought to hold, so the pod lost cache (eviction, restart).
-- Bump the pod's generation, so every prefix key naming it at an older one stops matching,
-- and write this request's chain at the new generation: the pod has just computed that prompt.
-- KEYS[1] the generations hash (pod -> generation; pod .. '@ms' -> when it was last bumped)
-- KEYS[2..] this request's chain keys
-- ARGV[1] the pod  ARGV[2] prefix key TTL (s)  ARGV[3] now (ms)  ARGV[4] the least time
-- between two bumps of one pod (ms): the requests in flight on a restarted pod all come back
-- short, and the first bump is enough (a second would drop the chains the first re-wrote).
-- Reply: {bumped 0|1, the pod's generation}
local gens, pod, now = KEYS[1], ARGV[1], tonumber(ARGV[3])
local last = tonumber(redis.call('HGET', gens, pod .. '@ms'))
local bumped, gen = 0, nil
if not last or now - last >= tonumber(ARGV[4]) then
  gen = redis.call('HINCRBY', gens, pod, 1)
  redis.call('HSET', gens, pod .. '@ms', now)
  bumped = 1
else
  gen = tonumber(redis.call('HGET', gens, pod)) or 0
end
local owner = pod
if gen > 0 then owner = pod .. '#' .. gen end
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], owner, 'EX', ARGV[2])
end
return {bumped, gen}
