-- First response bytes of prefix_cache requests, batched per route (docs/redis-data-model.md
-- §13): their booked prefill tokens are given back, and each endpoint's learned prefill rate
-- moves a fifth of the way to the rate its request showed.
-- KEYS[1] prefill zset, KEYS[2] booked hash, KEYS[3] rates hash (endpoint -> tokens/s)
-- ARGV in triples: lease id, endpoint, rate sample (tokens/s; 0 = none: too few tokens to
-- tell the rate from the fixed costs).
-- Reply: how many bookings were given back (0 for those the release or a reclaim gave back first).
local n = 0
for i = 1, #ARGV - 2, 3 do
  if unbook(KEYS[1], KEYS[2], ARGV[i]) then n = n + 1 end
  local sample = tonumber(ARGV[i + 2])
  if sample and sample > 0 then
    local r = tonumber(redis.call('HGET', KEYS[3], ARGV[i + 1]))
    if r then sample = math.floor(r * 0.8 + sample * 0.2) end
    redis.call('HSET', KEYS[3], ARGV[i + 1], sample)
  end
end
return n
