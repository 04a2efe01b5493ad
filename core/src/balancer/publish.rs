//! How a choice reaches the router: Higress's override call, or, in plain Envoy, the
//! `ip:port[,ip:port]` request header read by the `override_host` load-balancing policy
//! (docs/higress-abi.md §10). Client-sent copies of that header are removed first, so a client
//! can never steer routing. Cluster policies write the chosen cluster's name into their
//! `cluster_header` in both builds (the route's `cluster_header` action reads it); client-sent
//! copies of that header are removed the same way.

use crate::config::{PluginConfig, Publish, RouteConfig};
use crate::host::Host;
use crate::host::HostResult;

/// Every destination header a route config uses (plain Envoy's override_host header, any
/// build's `cluster_header`), each once: computed with the config, not per request.
pub fn destination_headers(config: &PluginConfig) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for c in config.all() {
        if let Publish::Header { name, .. } | Publish::ClusterHeader { name } = &c.publish {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    names
}

/// Drop client-sent copies of every destination header (`destination_headers`), whichever
/// route this request takes.
pub fn strip_destination_headers(host: &mut dyn Host, names: &[String]) {
    for name in names {
        let _ = host.remove_request_header(name);
    }
}

/// Points the router at `endpoint` (then `fallbacks`, where the header format allows them).
pub fn publish(
    host: &mut dyn Host,
    config: &RouteConfig,
    endpoint: &str,
    fallbacks: &[String],
) -> HostResult<()> {
    match &config.publish {
        Publish::OverrideHost => host.set_upstream_override_host(endpoint),
        Publish::Header { name, fallbacks: n } => {
            host.set_request_header(name, &destination_list(endpoint, fallbacks, *n))
        }
        Publish::ClusterHeader { name } => host.set_request_header(name, endpoint),
    }
}

/// `chosen` then up to `n` fallbacks, comma-separated (the override_host header format).
pub fn destination_list(chosen: &str, fallbacks: &[String], n: usize) -> String {
    let mut v = chosen.to_string();
    for f in fallbacks.iter().filter(|f| *f != chosen).take(n) {
        v.push(',');
        v.push_str(f);
    }
    v
}
