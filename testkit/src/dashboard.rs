//! plugin-config/grafana-dashboard.json and the plugin counters its queries name, for the
//! dashboard's tests (core/tests/grafana_dashboard.rs, e2e/suite/tests/e2e/envoy_dashboard.rs).

/// The shipped dashboard's JSON text.
pub const GRAFANA_DASHBOARD: &str = include_str!("../../plugin-config/grafana-dashboard.json");

/// The plugin counters (`ai_lb_…` identifiers) a PromQL expression names, in order.
pub fn counters_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
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
