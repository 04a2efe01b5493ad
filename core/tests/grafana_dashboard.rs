//! plugin-config/grafana-dashboard.json: every panel query names only counters the plugin
//! defines, in the form Envoy's `/stats/prometheus` gives them (the `wasmcustom` namespace
//! stripped, dots as underscores: `ai_lb.glr.routed` is `ai_lb_glr_routed`; real Envoy is
//! checked in e2e/suite/tests/e2e/envoy_dashboard.rs).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::stats::Stats;
use ailb_testkit::dashboard::{
    counters_in, families_in, prometheus_name, GRAFANA_DASHBOARD, POD_FAMILIES,
};
use serde_json::Value;
use std::collections::BTreeSet;

#[test]
fn every_panel_query_names_a_counter_the_plugin_defines() {
    let known: BTreeSet<String> = Stats::names().iter().map(|n| prometheus_name(n)).collect();
    let dash: Value = serde_json::from_str(GRAFANA_DASHBOARD).unwrap();
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 8, "{} panels", panels.len());
    let mut used = BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().unwrap();
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            let names = counters_in(expr);
            let families = families_in(expr);
            for f in &families {
                assert!(
                    POD_FAMILIES.contains(&f.as_str()),
                    "{title}: {f} is no per-pod family"
                );
            }
            assert!(
                !names.is_empty() || !families.is_empty(),
                "{title}: {expr} reads no plugin counter"
            );
            for n in names {
                assert!(known.contains(&n), "{title}: {n} is not a plugin counter");
                used.insert(n);
            }
        }
    }
    // Every policy's decisions are on the board.
    for policy in [
        "glr",
        "prefix",
        "metrics",
        "cluster_metrics",
        "cluster_hash",
    ] {
        assert!(used.contains(&format!("ai_lb_{policy}_routed")), "{policy}");
    }
    // The verified hit rate: what the engines say they had cached, of the prompts sent.
    for n in ["ai_lb_prefix_cached_tokens", "ai_lb_prefix_prompt_tokens"] {
        assert!(used.contains(n), "{n}");
    }
}

#[test]
fn each_per_pod_family_matches_the_names_the_plugin_defines() {
    // The plugin's per-pod names (stats/pods.rs), as Envoy exports them: dots and the port's
    // colon as underscores.
    let [ttft, tpot] = ailb_core::stats::PodGauges::names("10.0.0.7:8000");
    let exported = |n: &str| n.replace(['.', ':'], "_");
    for (family, name) in POD_FAMILIES.iter().zip([exported(&ttft), exported(&tpot)]) {
        let (head, tail) = family.split_once(".+").unwrap();
        assert!(
            name.starts_with(head) && name.ends_with(tail),
            "{family} {name}"
        );
    }
    let dash: Value = serde_json::from_str(GRAFANA_DASHBOARD).unwrap();
    let used: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .flat_map(|t| families_in(t["expr"].as_str().unwrap()))
        .collect();
    assert_eq!(used, POD_FAMILIES, "the prediction error is on the board");
}

#[test]
fn a_misspelt_counter_is_caught() {
    let known: BTreeSet<String> = Stats::names().iter().map(|n| prometheus_name(n)).collect();
    let names =
        counters_in("sum(rate(ai_lb_prefix_hits[5m])) / sum(rate(ai_lb_prefix_routed[5m]))");
    assert_eq!(names, ["ai_lb_prefix_hits", "ai_lb_prefix_routed"]);
    assert!(!known.contains("ai_lb_prefix_hits"));
    assert!(known.contains("ai_lb_prefix_routed"));
}
