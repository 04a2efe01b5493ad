//! Priority ceilings (docs/sessions-and-queues.md "Priority ceilings") against the mock host: a
//! forged `critical` from a tenant capped at `standard` is admitted and shed exactly as a
//! `standard` request (plain Envoy's counts), sends `standard`'s cap to the acquire script
//! (Higress), and is counted and logged at most once per tenant per interval.

use super::tests::configured;
use super::*;
use crate::balancer::telemetry::CLAMP_LOG_INTERVAL_MS;
use crate::config::Build;
use crate::host::mock::MockHost;
use serde_json::{json, Value};

const CLUSTER: &str = "outbound|8000||llm.static";
const PRIO: &str = "x-priority";
const TENANT: &str = "x-tenant";
const DEBUG: &str = "x-ai-lb-debug";

/// maxRequestCount 4 on 2 endpoints: sheddable admitted up to load 3 per endpoint, standard 4,
/// critical 6. `free` may use standard at most, `gold` critical, anyone else sheddable. A
/// share of 1 keeps tenant fairness from refusing anything here.
fn lb(ceilings: bool) -> Value {
    let mut lb = json!({"maxRequestCount": 4, "priorityHeader": "X-Priority",
                        "criticalHeadroom": 2, "priorityReserve": 1, "debugHeader": DEBUG,
                        "tenantHeader": TENANT, "defaultTenantShare": 1.0});
    if ceilings {
        lb["priorityCeilings"] = json!({"gold": "critical", "free": "standard"});
        lb["defaultPriorityCeiling"] = json!("sheddable");
    }
    lb
}

fn envoy(ceilings: bool) -> (MockHost, Balancer) {
    let mut cfg = lb(ceilings);
    cfg["endpoints"] = json!(["10.0.0.1:8000", "10.0.0.2:8000"]);
    let doc = json!({"lb_policy": "global_least_request", "lb_config": cfg});
    let config = PluginConfig::parse_for(doc.to_string().as_bytes(), Build::Envoy).unwrap();
    let mut host = MockHost::new();
    let e = Balancer::configure(&mut host, config, 42, LogLevel::Trace);
    (host, e)
}

/// Sends request `ctx` of class `class` from `tenant` and leaves it open: its debug reason.
fn envoy_send(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    class: &str,
    tenant: Option<&str>,
) -> String {
    host.request_headers = vec![(PRIO.into(), class.into())];
    host.request_headers
        .extend(tenant.map(|t| (TENANT.to_string(), t.to_string())));
    host.response_headers = vec![(":status".into(), "200".into())];
    host.body = br#"{"model":"m","prompt":"hi"}"#.to_vec();
    host.live_contexts.push(ctx);
    e.on_request_headers(host, ctx, false);
    let len = host.body.len();
    e.on_request_body(host, ctx, len, true);
    e.on_response_headers(host, ctx);
    host.response_headers
        .iter()
        .find(|(k, _)| k == DEBUG)
        .map(|(_, v)| v.rsplit("reason=").next().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// Fills the pool with `class` requests from `tenant` until one is refused, then sends 4
/// honest `critical` requests from `gold`: the reasons of all, in order.
fn flood(ceilings: bool, class: &str, tenant: Option<&str>) -> (Vec<String>, MockHost) {
    let (mut host, mut e) = envoy(ceilings);
    let mut reasons = Vec::new();
    let mut ctx = 2;
    for _ in 0..14 {
        ctx += 1;
        reasons.push(envoy_send(&mut host, &mut e, ctx, class, tenant));
    }
    for _ in 0..5 {
        ctx += 1;
        reasons.push(envoy_send(&mut host, &mut e, ctx, "critical", Some("gold")));
    }
    (reasons, host)
}

fn count(reasons: &[String], reason: &str) -> usize {
    reasons.iter().filter(|r| *r == reason).count()
}

#[test]
fn a_forged_critical_from_a_tenant_capped_at_standard_is_shed_like_standard() {
    let (forged, host) = flood(true, "critical", Some("free"));
    let (honest, _) = flood(true, "standard", Some("free"));
    assert_eq!(
        forged, honest,
        "forged critical = standard, request by request"
    );
    // 8 admitted (2 endpoints at the standard cap 4), the other 6 shed; then gold's critical
    // requests still find the headroom: 4 admitted (cap + headroom 6 per endpoint), 1 shed.
    assert_eq!(count(&forged[..14], "shed_priority"), 6, "{forged:?}");
    assert_eq!(count(&forged[14..], "shed_priority"), 1, "{forged:?}");
    assert_eq!(host.metric("ai_lb.priority.clamped"), 14);
    assert_eq!(host.metric("ai_lb.priority.admitted_headroom"), 4);
    // Without ceilings the same forged flood takes the headroom and gold is shed at once.
    let (open, _) = flood(false, "critical", Some("free"));
    assert_eq!(count(&open[..14], "shed_priority"), 2, "{open:?}");
    assert_eq!(count(&open[14..], "shed_priority"), 5, "{open:?}");
}

#[test]
fn unknown_callers_get_the_default_ceiling() {
    for tenant in [None, Some("intruder"), Some(""), Some(" , gold")] {
        let (forged, _) = flood(true, "critical", tenant);
        let (honest, _) = flood(true, "sheddable", tenant);
        assert_eq!(forged, honest, "{tenant:?}");
        assert_eq!(
            count(&forged[..14], "shed_priority"),
            8,
            "{tenant:?}: {forged:?}"
        );
    }
}

fn higress() -> (MockHost, Balancer) {
    let mut cfg = lb(true);
    cfg["serviceFQDN"] = json!("redis.static");
    cfg["servicePort"] = json!(6379);
    let doc = json!({"lb_policy": "global_least_request", "lb_config": cfg});
    let config = PluginConfig::parse(doc.to_string().as_bytes()).unwrap();
    let host = MockHost::new()
        .with_route("chat", CLUSTER)
        .with_hosts(&[("10.0.0.1:80", "Healthy"), ("10.0.0.2:80", "Healthy")]);
    configured(host, config)
}

/// Starts a Higress request; the class cap its acquire sent.
fn higress_start(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    class: &str,
    tenant: Option<&str>,
) -> String {
    host.request_headers = vec![(PRIO.into(), class.into())];
    host.request_headers
        .extend(tenant.map(|t| (TENANT.to_string(), t.to_string())));
    host.live_contexts.push(ctx);
    assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
    assert_eq!(e.on_request_body(host, ctx, 20, true), Verdict::Pause);
    host.last_query_args()[15].clone()
}

fn warned(host: &MockHost) -> Vec<String> {
    host.logs
        .borrow()
        .iter()
        .filter(|(l, m)| *l == LogLevel::Warn && m.contains("priority clamped"))
        .map(|(_, m)| m.clone())
        .collect()
}

#[test]
fn the_acquire_gets_the_ceilings_cap_and_each_tenant_is_logged_once_per_interval() {
    let (mut host, mut e) = higress();
    let huge = "x".repeat(10_000);
    let cases = [
        ("critical", Some("gold"), "6"),
        ("critical", Some("free"), "4"),
        ("critical", Some("free"), "4"),
        ("standard", Some("free"), "4"),
        ("sheddable", Some("free"), "3"),
        ("critical", Some("intruder"), "3"),
        ("critical", Some(huge.as_str()), "3"),
        ("critical", None, "3"),
        ("critical", None, "3"),
    ];
    for (n, (class, tenant, cap)) in cases.iter().enumerate() {
        let sent = higress_start(&mut host, &mut e, 2 + n as u32, class, *tenant);
        assert_eq!(sent, *cap, "{class} from {tenant:?}");
    }
    assert_eq!(host.metric("ai_lb.priority.clamped"), 6);
    // One warning per tenant: free, intruder, the huge name, no tenant; the repeats at debug.
    let lines = warned(&host);
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(
        lines[0].contains("#3 ")
            && lines[0].contains("tenant `free` asked for `critical` above its ceiling `standard`"),
        "{}",
        lines[0]
    );
    // A tenant not named is logged by its id, never by the bytes it sent.
    let id = crate::config::tenant_id(b"intruder");
    assert!(
        lines[1].contains(&format!("unlisted tenant id {id}")),
        "{}",
        lines[1]
    );
    assert!(
        lines.iter().all(|l| !l.contains("xxxx") && l.len() < 300),
        "{lines:?}"
    );
    assert!(
        lines[3].contains("a caller without a tenant"),
        "{}",
        lines[3]
    );
    host.now_ms += CLAMP_LOG_INTERVAL_MS;
    higress_start(&mut host, &mut e, 40, "critical", Some("free"));
    assert_eq!(warned(&host).len(), 5, "again after the interval");
}

#[test]
fn forged_tenant_names_do_not_grow_the_log_memory_without_bound() {
    use crate::balancer::telemetry::MAX_CLAMP_TENANTS;
    let (mut host, mut e) = higress();
    let n = MAX_CLAMP_TENANTS + 50;
    for i in 0..n {
        let tenant = format!("forged-{i}");
        higress_start(&mut host, &mut e, 2 + i as u32, "critical", Some(&tenant));
    }
    assert_eq!(
        host.metric("ai_lb.priority.clamped"),
        n as i64,
        "every clamp counted"
    );
    assert_eq!(warned(&host).len(), MAX_CLAMP_TENANTS, "the rest at debug");
    // Once the remembered ones are old, new tenants are warned again.
    host.now_ms += CLAMP_LOG_INTERVAL_MS;
    higress_start(&mut host, &mut e, 9_000, "critical", Some("late"));
    assert_eq!(warned(&host).len(), MAX_CLAMP_TENANTS + 1);
}
