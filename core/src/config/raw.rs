//! The configuration as JSON gives it: serde structs naming every key the plugin knows, with
//! no validation. Higress's keys are [`Go`] values (read later as its Go plugin reads them),
//! our own keys are [`Own<T>`] (read later strictly as `T`). Keys no struct names land in
//! `other`; the compile step (route.rs, the policy modules) warns about them.

use super::go::{Field, FromJson, Go, Own};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// Declares a raw object: one [`Field`] per key (`Some` when present, even if `null`),
/// `KEYS` (and `TYPES`) in declaration order, `present()` listing the keys that were given, and a serde
/// `Deserialize` that, like gjson, never fails on a value. (Written out by this macro rather
/// than `#[derive(Deserialize)]`: the derived visitor for 60 optional fields cost 40 KB of
/// wasm, this one a few hundred bytes.)
macro_rules! raw_object {
    ($(#[$meta:meta])* $name:ident { $($field:ident: $ty:ty = $key:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        pub struct $name {
            $(pub $field: Field<$ty>,)*
            /// Keys not named above.
            pub other: Map<String, Value>,
        }

        impl $name {
            pub const KEYS: &'static [&'static str] = &[$($key),*];

            /// Each key with its Rust type as written (`Go` for Higress's keys, `Own<T>` for
            /// ours): the list spec.yaml is checked against.
            #[allow(dead_code)] // read by the tests only
            pub const TYPES: &'static [(&'static str, &'static str)] =
                &[$(($key, stringify!($ty))),*];

            /// The named keys that were given, in declaration order.
            #[allow(dead_code)] // not every raw object needs it
            pub fn present(&self) -> Vec<&'static str> {
                let mut keys = Vec::new();
                $(if self.$field.is_some() { keys.push($key); })*
                keys
            }

            /// Reads an object; anything else reads as an empty object (as gjson's `Get` on a
            /// non-object finds nothing).
            pub fn from_value(v: &Value) -> Self {
                let Value::Object(map) = v else {
                    return Self::default();
                };
                Self {
                    $($field: Field(map.get($key).map(<$ty>::from_json)),)*
                    other: map
                        .iter()
                        .filter(|(k, _)| !Self::KEYS.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                }
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                Value::deserialize(d).map(|v| Self::from_value(&v))
            }
        }
    };
}

raw_object! {
    /// The global config or one `_rules_` entry.
    RawRoute {
        lb_type: Go = "lb_type",
        lb_policy: Go = "lb_policy",
        lb_config: Go = "lb_config",
        rules: Go = "_rules_",
        match_route: Go = "_match_route_",
        match_route_prefix: Go = "_match_route_prefix_",
        match_domain: Go = "_match_domain_",
        match_service: Go = "_match_service_",
    }
}

raw_object! {
    /// `lb_config`: every policy's keys (each policy reads its own; README tables).
    RawLbConfig {
        // Higress: the Redis service (global_least_request, prefix_cache, cluster_metrics).
        service_fqdn: Go = "serviceFQDN",
        service_port: Go = "servicePort",
        username: Go = "username",
        password: Go = "password",
        timeout: Go = "timeout",
        database: Go = "database",
        // Higress: global_least_request.
        max_request_count: Go = "maxRequestCount",
        clean_interval: Go = "cleanInterval",
        enable_detail_log: Go = "enableDetailLog",
        // Higress: prefix_cache.
        redis_key_ttl: Go = "redisKeyTTL",
        // Higress: endpoint_metrics.
        metric_policy: Go = "metric_policy",
        target_metric: Go = "target_metric",
        rate_limit: Go = "rate_limit",
        // Higress PR #4260 (open): endpoint_metrics' rate-limit window; PR #4043 (open): engine.
        window_size: Go = "window_size",
        window_seconds: Go = "window_seconds",
        engine: Go = "engine",
        // Higress: cluster_metrics.
        mode: Go = "mode",
        service_list: Go = "service_list",
        cluster_header: Go = "cluster_header",
        queue_size: Go = "queue_size",
        ewma_beta: Go = "ewma_beta",
        p2c_choices: Go = "p2c_choices",
        ttft_weight: Go = "ttft_weight",
        total_latency_weight: Go = "total_latency_weight",
        error_penalty: Go = "error_penalty",
        failure_cooldown_ms: Go = "failure_cooldown_ms",
        metrics_missing_policy: Go = "metrics_missing_policy",
        global_inflight_enabled: Go = "global_inflight_enabled",
        global_inflight_key_prefix: Go = "global_inflight_key_prefix",
        global_inflight_timeout: Go = "global_inflight_timeout",
        global_inflight_key_ttl: Go = "global_inflight_key_ttl",
        // Higress: cluster_hash.
        hash_header: Go = "hash_header",
        // Higress PR #3921 (open): where the hash key comes from.
        key: Go = "key",
        clusters: Go = "clusters",
        // Ours: every endpoint policy.
        lease_ttl: Own<u64> = "leaseTTL",
        cost_mode: Own<String> = "costMode",
        failure_mode: Own<String> = "failureMode",
        debug_header: Own<String> = "debugHeader",
        max_body_bytes: Own<u64> = "maxBodyBytes",
        redis_key_prefix: Own<String> = "redisKeyPrefix",
        priority_header: Own<String> = "priorityHeader",
        priority_classes: Own<Vec<String>> = "priorityClasses",
        default_priority_class: Own<String> = "defaultPriorityClass",
        critical_headroom: Own<u64> = "criticalHeadroom",
        priority_reserve: Own<u64> = "priorityReserve",
        priority_ceilings: Own<std::collections::BTreeMap<String, String>> = "priorityCeilings",
        default_priority_ceiling: Own<String> = "defaultPriorityCeiling",
        queue_timeout_ms: Own<u64> = "queueTimeoutMs",
        max_queued: Own<u64> = "maxQueued",
        // Ours: failure memory (global_least_request, prefix_cache).
        eject_after_failures: Own<u64> = "ejectAfterFailures",
        ejection_ms: Own<u64> = "ejectionMs",
        max_ejection_ms: Own<u64> = "maxEjectionMs",
        max_ejected_percent: Own<u64> = "maxEjectedPercent",
        half_open_trials: Own<u64> = "halfOpenTrials",
        failure_penalty_ms: Own<u64> = "failurePenaltyMs",
        // Ours: session stickiness (every endpoint policy).
        session_header: Own<String> = "sessionHeader",
        session_cookie: Own<String> = "sessionCookie",
        session_body_field: Own<String> = "sessionBodyField",
        session_ttl: Own<u64> = "sessionTTL",
        // Ours: agents' own session identities and Responses continuations (every endpoint
        // policy; docs/sessions-and-queues.md "Agent sessions").
        agent_sessions: Own<bool> = "agentSessions",
        agent_session_ttl: Own<u64> = "agentSessionTTL",
        // Ours: the pool cap and tenant fairness (global_least_request, prefix_cache).
        max_pool_requests: Own<u64> = "maxPoolRequests",
        tenant_header: Own<String> = "tenantHeader",
        tenant_shares: Own<std::collections::BTreeMap<String, f64>> = "tenantShares",
        default_tenant_share: Own<f64> = "defaultTenantShare",
        tenant_window: Own<u64> = "tenantWindow",
        // Ours: cluster_metrics AdaptiveScore.
        inflight_capacity: Own<u64> = "inflight_capacity",
        // Ours: the plain-Envoy build.
        endpoints: Own<Vec<String>> = "endpoints",
        destination_header: Own<String> = "destinationHeader",
        fallback_count: Own<u64> = "fallbackCount",
        max_body_wait_ms: Own<u64> = "maxBodyWaitMs",
        // Ours: data-parallel ranks (global_least_request, prefix_cache).
        data_parallel_size: Own<u64> = "dataParallelSize",
        data_parallel_rank: Own<String> = "dataParallelRank",
        // Ours: prefix_cache.
        block_chunk_bytes: Own<u64> = "blockChunkBytes",
        block_tokens: Own<u64> = "blockTokens",
        max_blocks: Own<u64> = "maxBlocks",
        affinity_max_imbalance: Own<u64> = "affinityMaxImbalance",
        affinity_max_imbalance_ratio: Own<f64> = "affinityMaxImbalanceRatio",
        local_index_max_entries: Own<u64> = "localIndexMaxEntries",
        prefix_anchor: Own<String> = "prefixAnchor",
        affinity_threshold: Own<f64> = "affinityThreshold",
        max_ttft_penalty_ms: Own<u64> = "maxTTFTPenaltyMs",
        peak_prefill_throughput: Own<u64> = "peakPrefillThroughput",
        verify_cached_tokens: Own<bool> = "verifyCachedTokens",
        latency_model: Own<Value> = "latencyModel",
        // Ours: endpoint_metrics.
        metrics_source: Own<String> = "metricsSource",
        host_list_cache_ms: Own<u64> = "hostListCacheMs",
        scrape_cluster: Own<String> = "scrapeCluster",
        scrape_path: Own<String> = "scrapePath",
        scrape_port: Own<u16> = "scrapePort",
        scrape_host_header: Own<String> = "scrapeHostHeader",
        scrape_interval_ms: Own<u64> = "scrapeIntervalMs",
        scrape_timeout_ms: Own<u64> = "scrapeTimeoutMs",
        metrics_max_age_ms: Own<u64> = "metricsMaxAgeMs",
        queue_threshold_critical: Own<f64> = "queueThresholdCritical",
        kv_cache_threshold: Own<f64> = "kvCacheThreshold",
        queueing_threshold_lora: Own<f64> = "queueingThresholdLora",
        lora_affinity_threshold: Own<f64> = "loraAffinityThreshold",
        weights: Own<Value> = "weights",
        max_running_hint: Own<u32> = "maxRunningHint",
        criticality_header: Own<String> = "criticalityHeader",
        sheddable_models: Own<Vec<String>> = "sheddableModels",
    }
}

raw_object! {
    /// `weights` of `endpoint_metrics` (ours: unknown keys here are errors).
    RawWeights {
        queue: Own<f64> = "queue",
        kv: Own<f64> = "kv",
        running: Own<f64> = "running",
        in_flight: Own<f64> = "inFlight",
    }
}

/// Keys of earlier versions that a config may still carry, and what became of them.
pub const LEGACY_KEYS: &[(&str, &str)] = &[(
    "criticalModels",
    "a key of the removed least_busy policy; endpoint_metrics marks sheddable requests with `sheddableModels` / `criticalityHeader` instead",
)];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_named_key_is_taken_and_the_rest_kept() {
        let mut all = Map::new();
        for k in RawLbConfig::KEYS {
            all.insert(k.to_string(), Value::Null);
        }
        all.insert("criticalModels".into(), json!(["m"]));
        let raw: RawLbConfig = serde_json::from_value(Value::Object(all)).unwrap();
        assert_eq!(raw.present(), RawLbConfig::KEYS.to_vec());
        assert_eq!(raw.other.keys().collect::<Vec<_>>(), vec!["criticalModels"]);
        // A present null is Some; a non-object is empty.
        assert!(RawRoute::from_value(&json!({"lb_type": null}))
            .lb_type
            .is_some());
        assert!(RawRoute::from_value(&json!("x")).present().is_empty());
    }
}
