//! plugin-config/grafana-dashboard.json and the plugin counters its queries name, for the
//! dashboard's tests (core/tests/grafana_dashboard.rs, e2e/suite/tests/e2e/envoy_dashboard.rs).

/// The shipped dashboard's JSON text.
pub const GRAFANA_DASHBOARD: &str = include_str!("../../plugin-config/grafana-dashboard.json");

/// The per-pod metric families a panel may select by name pattern (`{__name__=~"…"}`): their
/// names hold the pod's address (docs/metrics.md), so no query can name one member.
pub const POD_FAMILIES: &[&str] = &[
    "ai_lb_latency_.+_ttft_mape_pct",
    "ai_lb_latency_.+_tpot_mape_pct",
];

/// The name patterns (`{__name__=~"…"}`) a PromQL expression selects by, in order.
pub fn families_in(expr: &str) -> Vec<String> {
    expr.split("__name__=~\"")
        .skip(1)
        .filter_map(|t| t.split('"').next())
        .map(str::to_string)
        .collect()
}

/// The plugin counters (`ai_lb_…` identifiers) a PromQL expression names, in order, outside
/// its name patterns ([`families_in`]).
pub fn counters_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut plain = expr.to_string();
    for f in families_in(expr) {
        plain = plain.replace(&f, "");
    }
    let mut rest = plain.as_str();
    while let Some(at) = rest.find("ai_lb_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// A counter's name as Envoy's `/stats/prometheus` shows it: the `wasmcustom` namespace
/// stripped, dots as underscores (`ai_lb.glr.routed` is `ai_lb_glr_routed`).
pub fn prometheus_name(counter: &str) -> String {
    counter.replace('.', "_")
}
