//! Cluster-level balancing in the emulator: services as clusters (each with its own fake pods)
//! behind one route that follows Envoy's `cluster_header`, the way Higress routes for its
//! `lb_type: cluster` policies (docs/higress-cluster-policies.md §1).

use crate::bed::Bed;
use crate::gateway::{GatewaySpec, ROUTE};
use ailb_fakepod::PodConfig;
use serde_json::{json, Value};

/// The header the route reads (Higress's default `cluster_header`).
pub const TARGET_HEADER: &str = "x-higress-target-cluster";

/// A service: its cluster name and the indexes of its pods in the bed.
#[derive(Clone, Debug)]
pub struct Service {
    pub name: String,
    pub pods: Vec<usize>,
}

/// `names[i]` served by `per_service` consecutive pods of the bed (pod-0.. for the first).
pub fn services(names: &[&str], per_service: usize) -> Vec<Service> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| Service {
            name: n.to_string(),
            pods: (i * per_service..(i + 1) * per_service).collect(),
        })
        .collect()
}

/// Pod tuning for three services of two pods: pods 2 and 3 (the second service) three times
/// slower to the first token, pods 4 and 5 (the third) answering `error_rate` of requests with
/// 500 (seeded by `fault_seed`).
pub fn slow_and_failing(c: &mut PodConfig, error_rate: f64, fault_seed: u64) {
    match c.name.as_str() {
        "pod-2" | "pod-3" => c.ttft_multiplier = 3.0,
        "pod-4" | "pod-5" => {
            c.error_rate = error_rate;
            c.fault_seed = fault_seed;
        }
        _ => {}
    }
}

/// The service a pod (`x-pod: pod-N`) belongs to.
pub fn service_of<'a>(services: &'a [Service], pod: &str) -> Option<&'a str> {
    let i: usize = pod.strip_prefix("pod-")?.parse().ok()?;
    services
        .iter()
        .find(|s| s.pods.contains(&i))
        .map(|s| s.name.as_str())
}

/// The emulator config of `spec` with one round-robin cluster per service and the one route
/// following [`TARGET_HEADER`] instead of a fixed cluster.
pub fn cluster_config(bed: &Bed, spec: &GatewaySpec, services: &[Service]) -> Value {
    let mut cfg = spec.config();
    let addrs = bed.pod_addrs();
    let clusters: Vec<Value> = services
        .iter()
        .map(|s| {
            let endpoints: Vec<Value> = s
                .pods
                .iter()
                .filter_map(|&i| addrs.get(i))
                .map(|a| json!({"address": a, "health": "Healthy"}))
                .collect();
            json!({"name": s.name, "lb_policy": "round_robin",
                   "timeout_ms": spec.upstream_timeout_ms, "endpoints": endpoints})
        })
        .collect();
    cfg["clusters"] = Value::Array(clusters);
    cfg["routes"] =
        json!([{"name": ROUTE, "match": {"prefix": "/"}, "cluster_header": TARGET_HEADER}]);
    cfg
}

/// A `cluster_metrics` plugin config (`lb_type: cluster`) over `services` in `mode`.
pub fn metrics_plugin(services: &[Service], mode: &str) -> Value {
    let list: Vec<&str> = services.iter().map(|s| s.name.as_str()).collect();
    json!({"lb_type": "cluster", "lb_policy": "cluster_metrics",
           "lb_config": {"mode": mode, "service_list": list}})
}

/// A `cluster_hash` plugin config hashing `hash_header` over `(cluster, weight)` entries.
pub fn hash_plugin(hash_header: &str, entries: &[(&str, i64)]) -> Value {
    let clusters: Vec<Value> = entries
        .iter()
        .map(|(c, w)| json!({"cluster": c, "weight": w}))
        .collect();
    json!({"lb_type": "cluster", "lb_policy": "cluster_hash",
           "lb_config": {"hash_header": hash_header, "clusters": clusters}})
}
