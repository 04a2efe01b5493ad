//! The Envoy configs the tests run, built as JSON: the shapes of `envoy/envoy.yaml` (one
//! `override_host` cluster for the pods) and `envoy/envoy-cluster.yaml` (one cluster per
//! service), on free ports, and the body settings that decide whether the plugin reads the
//! request body before routing.

use serde_json::{json, Value};

/// The ORIGINAL_DST cluster the plugin scrapes pods through.
pub const SCRAPE_CLUSTER: &str = "ailb_scrape";

/// The Envoy settings that decide whether the plugin sees the request body before routing
/// (docs/plain-envoy.md).
#[derive(Debug, Clone, Copy)]
pub struct Body {
    /// The wasm filter's `allow_on_headers_stop_iteration`.
    pub stop_iteration: bool,
    /// The route's `request_body_buffer_limit` (None: the listener's
    /// `per_connection_buffer_limit_bytes`, Envoy's 1 MiB, which is also the most one read
    /// delivers).
    pub route_body_limit: Option<u64>,
}

impl Default for Body {
    fn default() -> Self {
        Body {
            stop_iteration: true,
            route_body_limit: None,
        }
    }
}

impl Body {
    pub fn apply(&self, config: &mut Value) {
        let listener = &mut config["static_resources"]["listeners"][0];
        let hcm = &mut listener["filter_chains"][0]["filters"][0]["typed_config"];
        if let Some(limit) = self.route_body_limit {
            if let Some(routes) = hcm["route_config"]["virtual_hosts"][0]["routes"].as_array_mut() {
                for r in routes {
                    r["request_body_buffer_limit"] = json!(limit);
                }
            }
        }
        let wasm = &mut hcm["http_filters"][0]["typed_config"]["config"];
        match wasm.as_object_mut() {
            Some(w) if self.stop_iteration => {
                w.insert("allow_on_headers_stop_iteration".into(), json!(true));
            }
            Some(w) => {
                w.remove("allow_on_headers_stop_iteration");
            }
            None => {}
        }
    }
}

fn socket(addr: &str) -> Value {
    let (ip, port) = addr.rsplit_once(':').unwrap_or((addr, "0"));
    json!({"socket_address": {"address": ip, "port_value": port.parse::<u16>().unwrap_or(0)}})
}

/// Removes the wasm filter from a config [`envoy_config`] or [`cluster_config`] built.
pub(super) fn drop_wasm_filter(config: &mut Value) {
    let hcm = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    if let Some(filters) = hcm["http_filters"].as_array_mut() {
        filters.retain(|f| f["name"] != "envoy.filters.http.wasm");
    }
}

/// The same shape as `envoy/envoy.yaml`, on the given ports and pods.
pub fn envoy_config(
    port: u16,
    admin: u16,
    pods: &[String],
    plugin: &Value,
    wasm: &std::path::Path,
) -> Value {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|p| json!({"endpoint": {"address": socket(p)}}))
        .collect();
    json!({
      "static_resources": {
        "listeners": [{
          "name": "llm",
          "address": socket(&format!("127.0.0.1:{port}")),
          "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
              "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
              "stat_prefix": "llm",
              "route_config": {"name": "llm", "virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": [{
                "name": "llm-route", "match": {"prefix": "/"},
                "route": {"cluster": "llm_pods", "timeout": "60s",
                          "retry_policy": {"retry_on": "connect-failure,reset", "num_retries": 2}}}]}]},
              "http_filters": [
                {"name": "envoy.filters.http.wasm", "typed_config": {
                  "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                  "config": {
                    "name": "ai-load-balancer", "root_id": "ai-load-balancer",
                    "failure_policy": "FAIL_OPEN",
                    "allow_on_headers_stop_iteration": true,
                    "vm_config": {"vm_id": "ai-load-balancer", "runtime": "envoy.wasm.runtime.v8",
                                  "code": {"local": {"filename": wasm}}},
                    "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                      "value": plugin.to_string()}}}},
                {"name": "envoy.filters.http.router", "typed_config": {
                  "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
              ]}}]}]
        }],
        "clusters": [
          {"name": "llm_pods", "type": "STATIC", "connect_timeout": "1s",
           "load_assignment": {"cluster_name": "llm_pods", "endpoints": [{"lb_endpoints": endpoints}]},
           "load_balancing_policy": {"policies": [{"typed_extension_config": {
             "name": "envoy.load_balancing_policies.override_host",
             "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
               "override_host_sources": [{"header": "x-gateway-destination-endpoint"}],
               "fallback_policy": {"policies": [{"typed_extension_config": {
                 "name": "envoy.load_balancing_policies.round_robin",
                 "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"}}}]}}}}]}},
          {"name": SCRAPE_CLUSTER, "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
           "connect_timeout": "0.3s", "original_dst_lb_config": {"use_http_header": true}}
        ]
      },
      "admin": {"address": socket(&format!("127.0.0.1:{admin}"))}
    })
}

/// The same shape as `envoy/envoy-cluster.yaml`, on the given ports and services.
pub fn cluster_config(
    port: u16,
    admin: u16,
    services: &[(&str, String)],
    plugin: &Value,
    wasm: &std::path::Path,
) -> Value {
    let clusters: Vec<Value> = services
        .iter()
        .map(|(name, addr)| {
            json!({"name": name, "type": "STATIC", "connect_timeout": "1s",
                   "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                       {"endpoint": {"address": socket(addr)}}]}]}})
        })
        .collect();
    let mut config = envoy_config(port, admin, &[], plugin, wasm);
    let hcm = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"] =
        json!({"cluster_header": "x-higress-target-cluster", "timeout": "60s"});
    hcm["http_filters"][0]["typed_config"]["config"]["failure_policy"] = json!("FAIL_CLOSED");
    config["static_resources"]["clusters"] = Value::Array(clusters);
    config
}
