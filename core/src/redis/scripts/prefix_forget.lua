-- prefix_cache, engine-verified keys (docs/redis-data-model.md §5): an engine cached far less
-- of a prompt than its pod was thought to hold.
-- KEYS[1] the generations hash (pod -> generation; pod .. '@ms' -> when it was last bumped)
-- KEYS[2..] chain keys
-- ARGV[1] the pod  ARGV[2] prefix key TTL (s)  ARGV[3] now (ms)  ARGV[4] the least time
-- between two bumps of one pod (ms)  ARGV[5] 'keys' or 'pod'
-- 'keys': one conversation came back short (eviction). Its keys past what the engine had
-- cached (KEYS[2..]) stop naming the pod, at whatever generation; a key naming another pod
-- since is left to it. Nothing else of the pod is touched. Reply: {0, keys forgotten}
-- 'pod': the pod was emptied (a restart or a flush, found across unrelated conversations). Bump
-- its generation, so every prefix key naming it at an older one stops matching, and write this
-- request's chain (KEYS[2..]) at the new generation: the pod has just computed that prompt. A
-- pod is bumped at most once per ARGV[4]: the requests in flight on a restarted pod all come
-- back short, and the first bump is enough (a second would drop the chains the first
-- re-wrote). Reply: {bumped 0|1, the pod's generation}
local gens, pod, now = KEYS[1], ARGV[1], tonumber(ARGV[3])
if ARGV[5] == 'keys' then
  local forgotten = 0
  for i = 2, #KEYS do
    local v = redis.call('GET', KEYS[i])
    if v and (v == pod or string.match(v, '^(.*)#%d+$') == pod) then
      redis.call('DEL', KEYS[i])
      forgotten = forgotten + 1
    end
  end
  return {0, forgotten}
end
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
