//! Priority ceilings end to end (docs/sessions-and-queues.md "Priority ceilings"): two emulator
//! gateways × 2 workers sharing one real redis-server in front of slow fake pods. A flood of
//! forged `critical` requests from a tenant capped at `standard` is admitted and refused as
//! `standard` across both gateways, so the honest critical tenant still finds the headroom;
//! callers without a tenant or with one not named get the default ceiling. Every clamp is
//! counted, each tenant logged at most once per worker, and every count, lease and tenant
//! count comes back.

use ailb_e2e::bed::{chat_body, wait_for_zero, wait_wave, Bed};
use ailb_e2e::gateway::{glr_config, http, Gateway};
use serde_json::json;
use std::thread::JoinHandle;
use std::time::Duration;

/// The header Higress's auth plugins set (docs/sessions-and-queues.md "Letting the gateway's
/// auth set the tenant"); here the test sets it as the auth plugin would.
const TENANT: &str = "x-mse-consumer";

/// 10 ms per output token: a 500-token request holds its pod slot for ~5 s.
fn slow_pods(pods: usize) -> Bed {
    Bed::new(pods, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    })
}

/// (status, retry-after) of one request of `class` from `tenant`.
type Answer = (u16, String);

fn send(url: String, class: &'static str, tenant: Option<&'static str>) -> JoinHandle<Answer> {
    std::thread::spawn(move || {
        let body = chat_body(&format!("{class} request"), 500);
        let mut headers = vec![("content-type", "application/json"), ("x-priority", class)];
        headers.extend(tenant.map(|t| (TENANT, t)));
        let (status, hdrs, _) = http(&url, "POST", "/v1/chat/completions", &headers, &body)
            .unwrap_or((0, Vec::new(), Vec::new()));
        let retry = hdrs
            .iter()
            .find(|(k, _)| k == "retry-after")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        (status, retry)
    })
}

/// Sends `n` requests, alternating gateways, and lets them reach their pods or their refusal.
fn wave(
    bed: &Bed,
    gws: &[&Gateway],
    n: usize,
    class: &'static str,
    tenant: Option<&'static str>,
) -> Vec<JoinHandle<Answer>> {
    let before = bed.counts().leases;
    let threads: Vec<_> = (0..n)
        .map(|i| send(gws[i % gws.len()].url.clone(), class, tenant))
        .collect();
    wait_wave(bed, before, &threads);
    threads
}

/// How many were refused (429 with Retry-After); the rest must be served.
fn shed(answers: Vec<JoinHandle<Answer>>) -> usize {
    answers
        .into_iter()
        .map(|t| t.join().unwrap())
        .filter(|(status, retry)| {
            if *status == 429 {
                assert_eq!(retry, "1", "a shed carries Retry-After");
                true
            } else {
                assert_eq!(*status, 200, "admitted requests are served");
                false
            }
        })
        .count()
}

#[test]
fn a_forged_critical_flood_is_treated_as_its_tenants_ceiling() {
    let bed = slow_pods(2);
    // Per pod: sheddable up to 1 in flight, standard 2, critical 3; 2 pods, counted across
    // both gateways. A share of 1 keeps tenant fairness out of the way (the pool's 4).
    let cfg = glr_config(
        bed.redis.port,
        json!({"maxRequestCount": 2, "priorityHeader": "x-priority", "criticalHeadroom": 1,
               "priorityReserve": 1, "tenantHeader": TENANT, "defaultTenantShare": 1.0,
               "priorityCeilings": {"gold": "critical", "free": "standard"},
               "defaultPriorityCeiling": "sheddable"}),
    );
    let a = bed.gateway(&bed.spec("gw-a", Some(cfg.clone())));
    let b = bed.gateway(&bed.spec("gw-b", Some(cfg)));
    let gws = [&a, &b];

    let flood = wave(&bed, &gws, 4, "critical", Some("free"));
    let flood_over = wave(&bed, &gws, 4, "critical", Some("free"));
    let anonymous = wave(&bed, &gws, 2, "critical", None);
    let intruder = wave(&bed, &gws, 1, "critical", Some("intruder"));
    let honest = wave(&bed, &gws, 2, "critical", Some("gold"));
    let honest_over = wave(&bed, &gws, 1, "critical", Some("gold"));

    assert_eq!(shed(flood), 0, "the flood fills the standard cap");
    assert_eq!(
        shed(flood_over),
        4,
        "forged critical refused at the standard cap, not given the headroom"
    );
    assert_eq!(shed(anonymous), 2, "no tenant: the default ceiling");
    assert_eq!(shed(intruder), 1, "a tenant not named: the default ceiling");
    assert_eq!(
        shed(honest),
        0,
        "the honest critical tenant finds the headroom"
    );
    assert_eq!(shed(honest_over), 1, "critical refused at cap + headroom");

    let stat = |name: &str| a.stat(name) + b.stat(name);
    assert_eq!(stat("ai_lb.priority.clamped"), 11);
    assert_eq!(stat("ai_lb.priority.shed"), 8);
    assert_eq!(stat("ai_lb.tenant.shed"), 0);
    assert_eq!(stat("ai_lb.glr.routed"), 6);
    // Logged at most once per tenant per worker (2 gateways × 2 workers), never the flood.
    let logs = format!("{}\n{}", a.logs(), b.logs());
    let lines = |needle: &str| logs.lines().filter(|l| l.contains(needle)).count();
    let free = lines("tenant `free` asked for `critical` above its ceiling `standard`");
    assert!((1..=4).contains(&free), "{free} lines for free:\n{logs}");
    let anon = lines("a caller without a tenant asked for `critical`");
    assert!(
        (1..=2).contains(&anon),
        "{anon} lines without a tenant:\n{logs}"
    );
    assert_eq!(
        lines("intruder"),
        0,
        "an unnamed tenant is logged by its id"
    );
    assert_eq!(lines("unlisted tenant id"), 1, "{logs}");
    let left = wait_for_zero(&bed, Duration::from_secs(5));
    assert!(left.is_zero(), "counts or leases left: {left:?}");
}
