//! The pool cap and tenant fairness end to end (docs/sessions-and-queues.md "Tenant fairness"): two emulator
//! gateways × 2 workers sharing one real redis-server in front of slow fake pods. A flooding
//! tenant is held to its share while a quiet one is active (429 + Retry-After, counted in
//! ai_lb.tenant.shed), a lone tenant uses the whole pool, `maxPoolRequests` holds across both
//! gateways, and every count, lease and tenant count comes back.

use ailb_e2e::bed::{chat_body, wait_for_zero, wait_wave, Bed};
use ailb_e2e::gateway::{glr_config, http, Gateway};
use serde_json::json;
use std::thread::JoinHandle;
use std::time::Duration;

const TENANT: &str = "x-gateway-inference-fairness-id";

/// 10 ms per output token: a 500-token request holds its pod slot for ~5 s.
fn slow_pods(pods: usize) -> Bed {
    Bed::new(pods, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    })
}

/// (status, retry-after) of one request.
type Answer = (u16, String);

fn send(url: String, tenant: Option<&'static str>, tokens: u64) -> JoinHandle<Answer> {
    std::thread::spawn(move || {
        let body = chat_body("a tenant's request", tokens);
        let mut headers = vec![("content-type", "application/json")];
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

/// Sends `n` requests of `tenant`, alternating gateways, and lets them reach their pods or
/// their refusal.
fn wave(
    bed: &Bed,
    gws: &[&Gateway],
    n: usize,
    tenant: Option<&'static str>,
) -> Vec<JoinHandle<Answer>> {
    let before = bed.counts().leases;
    let threads: Vec<_> = (0..n)
        .map(|i| send(gws[i % gws.len()].url.clone(), tenant, 500))
        .collect();
    wait_wave(bed, before, &threads);
    threads
}

/// (served, refused for the tenant's share, refused by the pool cap).
fn tally(answers: Vec<JoinHandle<Answer>>) -> (usize, usize, usize) {
    let mut t = (0, 0, 0);
    for (status, retry) in answers.into_iter().map(|h| h.join().unwrap()) {
        match (status, retry.as_str()) {
            (200, _) => t.0 += 1,
            // shed_tenant carries Retry-After; the pool cap without priority classes answers
            // as maxRequestCount does, without it.
            (429, "1") => t.1 += 1,
            (429, "") => t.2 += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    t
}

fn config(bed: &Bed) -> serde_json::Value {
    // Pool of 8 across both gateways; default share 0.5: each tenant's limit is 4.
    glr_config(
        bed.redis.port,
        json!({"maxPoolRequests": 8, "tenantHeader": TENANT, "tenantWindow": 3000}),
    )
}

#[test]
fn a_flooding_tenant_does_not_take_the_pool_from_a_quiet_one() {
    let bed = slow_pods(2);
    let cfg = config(&bed);
    let a = bed.gateway(&bed.spec("gw-a", Some(cfg.clone())));
    let b = bed.gateway(&bed.spec("gw-b", Some(cfg)));
    let gws = [&a, &b];

    let quiet_first = wave(&bed, &gws, 1, Some("quiet"));
    let flood = wave(&bed, &gws, 10, Some("flood"));
    let quiet_more = wave(&bed, &gws, 3, Some("quiet"));
    // The pool is full now (4 + 4): anyone else is refused by the cap.
    let peak = bed.counts();
    let over = wave(&bed, &gws, 2, None);

    assert_eq!(peak.total(), 8.0, "{peak:?}");
    assert_eq!(tally(quiet_first), (1, 0, 0));
    assert_eq!(
        tally(flood),
        (4, 6, 0),
        "the flood gets its share (4 of 8) while the quiet tenant is active"
    );
    assert_eq!(
        tally(quiet_more),
        (3, 0, 0),
        "the quiet tenant still finds room"
    );
    assert_eq!(tally(over), (0, 0, 2));

    let stat = |name: &str| a.stat(name) + b.stat(name);
    assert_eq!(stat("ai_lb.tenant.shed"), 6);
    assert_eq!(stat("ai_lb.pool.full"), 2);
    assert_eq!(stat("ai_lb.glr.rejected_429"), 8);
    assert_eq!(stat("ai_lb.glr.routed"), 8);
    assert_eq!(stat("ai_lb.tenant.fallback"), 0);
    let left = wait_for_zero(&bed, Duration::from_secs(5));
    assert!(
        left.is_zero(),
        "counts, leases or tenant counts left: {left:?}"
    );
}

#[test]
fn a_lone_tenant_uses_the_whole_pool_and_the_pool_cap_holds_across_gateways() {
    let bed = slow_pods(2);
    let cfg = config(&bed);
    let a = bed.gateway(&bed.spec("gw-a", Some(cfg.clone())));
    let b = bed.gateway(&bed.spec("gw-b", Some(cfg)));
    let gws = [&a, &b];

    let alone = wave(&bed, &gws, 11, Some("alone"));
    let peak = bed.counts();
    assert_eq!(
        tally(alone),
        (8, 0, 3),
        "work-conserving: the whole pool, then the cap"
    );
    assert_eq!(peak.total(), 8.0, "{peak:?}");
    assert_eq!(peak.tenants, 1);
    let stat = |name: &str| a.stat(name) + b.stat(name);
    assert_eq!(stat("ai_lb.tenant.shed"), 0);
    assert_eq!(stat("ai_lb.pool.full"), 3);
    assert!(
        a.stat("ai_lb.glr.routed") > 0 && b.stat("ai_lb.glr.routed") > 0,
        "both gateways admitted some"
    );
    let left = wait_for_zero(&bed, Duration::from_secs(5));
    assert!(
        left.is_zero(),
        "counts, leases or tenant counts left: {left:?}"
    );
}
