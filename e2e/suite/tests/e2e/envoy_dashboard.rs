//! plugin-config/grafana-dashboard.json against real Envoy 1.40: every counter a panel queries
//! is in the proxy's `/stats/prometheus` under that exact name, once the plugin runs.

use ailb_e2e::bed::{chat, Bed};
use ailb_e2e::envoy::Envoy;
use ailb_e2e::gateway::http;
use ailb_testkit::dashboard::{counters_in, GRAFANA_DASHBOARD};
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// The plugin counters every panel query names.
fn dashboard_metrics() -> BTreeSet<String> {
    let dash: Value = serde_json::from_str(GRAFANA_DASHBOARD).unwrap();
    let queries = dash["panels"].as_array().unwrap().iter().flat_map(|p| {
        p["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["expr"].as_str().unwrap())
    });
    queries.flat_map(counters_in).collect()
}

#[test]
fn every_dashboard_query_names_a_series_envoy_exports() {
    let bed = Bed::new(2, |_| {});
    let pods = bed.pod_addrs();
    let plugin = json!({"lb_policy": "global_least_request", "lb_config": {"endpoints": pods}});
    let envoy = Envoy::start(&pods, &plugin);
    assert_eq!(chat(&envoy.url, "hello", 1).0, 200, "{}", envoy.logs());
    let (status, _, body) = http(&envoy.admin, "GET", "/stats/prometheus", &[], b"").unwrap();
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body);
    let exported: BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let wanted = dashboard_metrics();
    assert!(wanted.len() > 40, "{} metrics", wanted.len());
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|m| !exported.contains(m.as_str()))
        .collect();
    assert!(missing.is_empty(), "not exported by Envoy: {missing:?}");
    // The routed request is counted under the dashboard's name.
    let routed = text
        .lines()
        .find(|l| l.starts_with("ai_lb_glr_routed"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert_eq!(routed, Some(1.0), "{text}");
}
