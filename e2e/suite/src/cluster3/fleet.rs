//! The fleet: fake pods, the Redis Cluster, and emulator gateways configured with every route;
//! one request through a gateway, and the decisions the gateways counted.

use super::routes::{route_counts, route_name, Route, RouteCounts, POLICIES, SERVICES};
use crate::gateway::{http, redis_cluster as cluster_name, Gateway, CLUSTER};
use crate::redis_cluster::{RedisCluster, USER};
use ailb_fakepod::{PodConfig, PodHandle};
use serde_json::{json, Value as Json};

pub struct Fleet {
    pub rt: tokio::runtime::Runtime,
    pub pods: Vec<PodHandle>,
    pub redis: RedisCluster,
    /// Routes per policy.
    pub per_policy: usize,
}

impl Fleet {
    /// 3 fake pods (`tune` adjusts them) and the cluster; `per_policy` routes of each policy.
    pub fn new(per_policy: usize, tune: impl Fn(&mut PodConfig)) -> Fleet {
        let (rt, pods) = crate::bed::spawn_pods(3, tune);
        Fleet {
            rt,
            pods,
            redis: RedisCluster::start(),
            per_policy,
        }
    }

    pub fn routes(&self) -> Vec<Route> {
        POLICIES
            .iter()
            .flat_map(|&p| {
                (0..self.per_policy).map(move |i| Route {
                    policy: p,
                    name: route_name(p, i),
                })
            })
            .collect()
    }

    /// The plugin config: one rule per policy over its routes, Redis = the proxy with the ACL
    /// user and `password`.
    pub fn plugin(&self, password: &str, lease_ttl_s: u64) -> Json {
        let port = self.redis.proxy.port;
        let names =
            |p: &str| -> Vec<String> { (0..self.per_policy).map(|i| route_name(p, i)).collect() };
        let redis = json!({"serviceFQDN": "redis.static", "servicePort": port,
                           "username": USER, "password": password, "timeout": 1000,
                           "leaseTTL": lease_ttl_s});
        let mut cm = redis.clone();
        if let Some(o) = cm.as_object_mut() {
            o.remove("timeout");
            o.insert("global_inflight_timeout".into(), json!(1000));
            o.insert("mode".into(), json!("AdaptiveScore"));
            o.insert("service_list".into(), json!(SERVICES));
            o.insert("global_inflight_enabled".into(), json!(true));
        }
        json!({"_rules_": [
            {"_match_route_": names("glr"), "lb_policy": "global_least_request", "lb_config": redis},
            {"_match_route_": names("px"), "lb_policy": "prefix_cache", "lb_config": redis},
            {"_match_route_": names("cm"), "lb_type": "cluster", "lb_policy": "cluster_metrics",
             "lb_config": cm}
        ]})
    }

    /// The emulator config of gateway `id` running `plugin`.
    pub fn gateway_config(&self, id: &str, plugin: &Json) -> Json {
        let port = self.redis.proxy.port;
        let addrs: Vec<String> = self.pods.iter().map(|p| p.addr.to_string()).collect();
        let ep = |a: &String| json!({"address": a, "health": "Healthy"});
        let mut clusters = vec![json!({"name": CLUSTER, "lb_policy": "round_robin",
                                       "endpoints": addrs.iter().map(ep).collect::<Vec<_>>()})];
        for (s, a) in SERVICES.iter().zip(&addrs) {
            clusters.push(json!({"name": s, "lb_policy": "round_robin", "endpoints": [ep(a)]}));
        }
        let routes: Vec<Json> = self
            .routes()
            .iter()
            .map(|r| {
                let m = json!({"prefix": format!("/{}/", r.name)});
                if r.policy == "cm" {
                    json!({"name": r.name, "match": m,
                           "cluster_header": crate::cluster::TARGET_HEADER})
                } else {
                    json!({"name": r.name, "match": m, "cluster": CLUSTER})
                }
            })
            .collect();
        json!({
            "listen": "127.0.0.1:0", "admin": "127.0.0.1:0", "workers": 2,
            "gateway_id": id, "log_level": "warn",
            "redis_clusters": [{"name": cluster_name(port), "address": format!("127.0.0.1:{port}")}],
            "clusters": clusters, "routes": routes,
            "plugin": {"wasm": crate::plugin_wasm(), "config": plugin},
        })
    }

    /// `n` gateways running the plugin with `password`.
    pub fn gateways(&self, n: usize, password: &str, lease_ttl_s: u64) -> Vec<Gateway> {
        let plugin = self.plugin(password, lease_ttl_s);
        (0..n)
            .map(|i| {
                let id = format!("c3-{i}");
                Gateway::start_config(&self.gateway_config(&id, &plugin), &id)
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect()
    }

    /// A route's counts read on the master that owns it (not through the proxy).
    pub fn counts_on_master(&self, route: &Route) -> Option<RouteCounts> {
        let key = route.anchor_key();
        route_counts(route, &|a| self.redis.on_master(&key, a))
    }
}

/// One chat request on `route` through the gateway at `url`: (status, `x-pod`).
pub fn send(url: &str, route: &Route, text: &str, max_tokens: u64) -> (u16, String) {
    let body = crate::bed::chat_body(text, max_tokens);
    match http(
        url,
        "POST",
        &route.path(),
        &[("content-type", "application/json")],
        &body,
    ) {
        Ok((status, headers, _)) => {
            let pod = headers
                .iter()
                .find(|(k, _)| k == "x-pod")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            (status, pod)
        }
        Err(_) => (0, String::new()),
    }
}

/// The plugin's decisions and fallbacks summed over `gateways`: (decisions, fallbacks).
/// cluster_metrics counts a Redis-less decision as `inflight_local`.
pub fn decisions(gateways: &[Gateway]) -> (i64, i64) {
    let mut all = 0;
    let mut fell = 0;
    for g in gateways {
        let s = g.stats();
        let get = |k: &str| s.get(k).copied().unwrap_or(0);
        fell += get("ai_lb.glr.fallback")
            + get("ai_lb.prefix.fallback")
            + get("ai_lb.cluster_metrics.inflight_local");
        all += get("ai_lb.glr.routed")
            + get("ai_lb.glr.fallback")
            + get("ai_lb.prefix.routed")
            + get("ai_lb.prefix.fallback")
            + get("ai_lb.cluster_metrics.inflight_global")
            + get("ai_lb.cluster_metrics.inflight_local");
    }
    (all, fell)
}
