-- Shared by the cluster_metrics global in-flight scripts (prepended by core/src/redis/inflight.rs).
-- KEYS[1] is Higress's hash `<prefix>:<route>:AdaptiveScore` (field = service, value = requests
-- in flight on every gateway; docs/higress-cluster-policies.md §3.6), KEYS[2] our lease zset
-- beside it (member "<request id>|<service>|1", score = expiry ms; docs/redis-data-model.md §8).
-- Giving a lease back decrements its service; at 0 or below the field is deleted (Go reads an
-- absent field as 0), so a count never goes negative and a release after the hash expired does
-- not recreate it without a TTL.
local function give_back_service(counts, member)
  local svc = string.match(member, '^[^|]*|(.*)|[^|]*$')
  if svc then
    local n = redis.call('HINCRBY', counts, svc, -1)
    if n <= 0 then redis.call('HDEL', counts, svc) end
  end
end
