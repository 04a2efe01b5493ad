-- prefix_cache's latency models, merged across gateways (docs/redis-data-model.md §15): a
-- gateway adds the statistics of its samples since its last merge to each pod's record, writes
-- the coefficients it solved from the fleet's records last time, and reads every record back.
-- Records are CSV lists of numbers that add elementwise (sums of sufficient statistics); every
-- record is halved each half-life, once for the fleet, so old samples fade at one pace however
-- many gateways merge.
-- KEYS[1] records (hash: endpoint -> CSV, field '@t' = when last decayed, ms)
-- KEYS[2] coefficients (hash: endpoint -> CSV, '*' = the fleet prior)
-- ARGV[1] now (ms)  ARGV[2] half-life (ms)  ARGV[3] key TTL (s)  ARGV[4] n records sent
-- ARGV[5..4+2n] endpoint, CSV record; then endpoint, CSV coefficients pairs to the end.
-- Reply: the records, as HGETALL gives them (without '@t').
local records, coef = KEYS[1], KEYS[2]
local now, half_life, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n = tonumber(ARGV[4])

local function parse(csv)
  local v = {}
  for x in string.gmatch(csv, '[^,]+') do
    local num = tonumber(x)
    if not num or num ~= num or num == math.huge or num == -math.huge then return nil end
    v[#v + 1] = num
  end
  return v
end
local function csv(v)
  local out = {}
  for i = 1, #v do out[i] = string.format('%.17g', v[i]) end
  return table.concat(out, ',')
end

-- Decay: at most every hundredth of a half-life, all records at once. A record whose weight
-- (the TTFT statistics' 10th number, stats.rs to_fields) has faded under a
-- thousandth of a sample is dropped: its pod has not answered for ten half-lives.
local last = tonumber(redis.call('HGET', records, '@t'))
if not last or last > now then
  redis.call('HSET', records, '@t', now)
elseif now - last >= half_life / 100 then
  local f = 0.5 ^ ((now - last) / half_life)
  local all = redis.call('HGETALL', records)
  for i = 1, #all, 2 do
    if all[i] ~= '@t' then
      local v = parse(all[i + 1])
      if v then
        for j = 1, #v do v[j] = v[j] * f end
      end
      if not v or #v < 10 or v[10] < 0.001 then
        redis.call('HDEL', records, all[i])
      else
        redis.call('HSET', records, all[i], csv(v))
      end
    end
  end
  redis.call('HSET', records, '@t', now)
end

for i = 5, 4 + 2 * n, 2 do
  local add = parse(ARGV[i + 1])
  if add then
    local cur = redis.call('HGET', records, ARGV[i])
    cur = cur and parse(cur)
    if cur and #cur == #add then
      for j = 1, #add do add[j] = add[j] + cur[j] end
    end
    redis.call('HSET', records, ARGV[i], csv(add))
  end
end
for i = 5 + 2 * n, #ARGV - 1, 2 do
  redis.call('HSET', coef, ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', records, ttl)
redis.call('EXPIRE', coef, ttl)

local out = {}
local all = redis.call('HGETALL', records)
for i = 1, #all, 2 do
  if all[i] ~= '@t' then
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
