//! Failure memory end to end (docs/redis-data-model.md §14): one of four fake pods answers
//! every generation with 500 at once (an engine whose HTTP server is up but whose generation
//! fails). Without failure memory global_least_request sends it most requests, on every
//! gateway: it gives its count back first and looks idlest. With it (the default) the pod is
//! ejected for both gateways after a few failures and draws almost nothing after; with every
//! pod failing the picks fail open, counted; a pod that only hangs is ejected by the 504s of the
//! gateway's upstream timeout; nothing leaks either way.

use ailb_e2e::bed::{chat, chats, failing_bed, probe_until_zero, Bed};
use ailb_e2e::gateway::{glr_config, Gateway};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

const BAD: &str = "pod-0";

/// `n` requests from 8 clients, alternating between the gateways: (pod, status) of each.
fn send(gateways: &[&Gateway], n: usize) -> Vec<(String, u16)> {
    let urls: Vec<String> = gateways.iter().map(|g| g.url.clone()).collect();
    chats(&urls, n)
}

fn gateways(bed: &Bed, lb: Value) -> (Gateway, Gateway) {
    let cfg = glr_config(bed.redis.port, lb);
    let a = bed.gateway(&bed.spec("gw-a", Some(cfg.clone())));
    let b = bed.gateway(&bed.spec("gw-b", Some(cfg)));
    (a, b)
}

fn sum(gws: [&Gateway; 2], stat: &str) -> i64 {
    gws.iter().map(|g| g.stat(stat)).sum()
}

fn to_bad(sent: &[(String, u16)]) -> usize {
    sent.iter().filter(|(pod, _)| pod == BAD).count()
}

#[test]
fn a_pod_that_fails_fast_is_ejected_for_every_gateway_instead_of_drawing_the_traffic() {
    let bed = failing_bed(&[BAD]);
    // Without failure memory: the black hole draws most requests.
    let (a, b) = gateways(&bed, json!({"ejectAfterFailures": 0}));
    let off = send(&[&a, &b], 200);
    let off_share = to_bad(&off) as f64 / off.len() as f64;
    assert!(
        off_share > 0.5,
        "the black hole without failure memory: {off_share}"
    );
    assert!(probe_until_zero(&bed, &a.url, Duration::from_secs(10)).is_zero());
    drop((a, b));

    // With it, on defaults (the run without it learned nothing): a handful of failures, then
    // nothing.
    let (a, b) = gateways(&bed, json!({}));
    let on = send(&[&a, &b], 400);
    let failed = to_bad(&on);
    let per_pod: BTreeMap<&str, usize> = on.iter().fold(BTreeMap::new(), |mut m, (p, _)| {
        *m.entry(p.as_str()).or_default() += 1;
        m
    });
    eprintln!("failure memory off: {off_share:.2} to {BAD}; on: {per_pod:?}");
    // ejectAfterFailures (5), plus the requests already on their way when it was ejected.
    assert!(failed <= 5 + 8, "{failed} requests reached the failing pod");
    assert!((failed as f64 / on.len() as f64) < 0.05);
    assert!(on.iter().filter(|(_, s)| *s == 200).count() >= on.len() - failed);
    assert_eq!(
        sum([&a, &b], "ai_lb.eject.ejected"),
        1,
        "ejected once, for both"
    );
    assert!(sum([&a, &b], "ai_lb.eject.failures") >= 5);
    assert_eq!(sum([&a, &b], "ai_lb.eject.fail_open"), 0);
    // The failed requests' penalty and every lease come back.
    assert!(probe_until_zero(&bed, &a.url, Duration::from_secs(10)).is_zero());
}

#[test]
fn with_every_pod_failing_the_picks_fail_open_and_say_so() {
    let bed = failing_bed(&["pod-0", "pod-1", "pod-2", "pod-3"]);
    let lb = json!({"ejectAfterFailures": 2, "maxEjectedPercent": 100, "failurePenaltyMs": 0});
    let (a, b) = gateways(&bed, lb);
    let sent = send(&[&a, &b], 160);
    assert!(
        sent.iter().all(|(pod, s)| *s == 500 && !pod.is_empty()),
        "served, as failures"
    );
    let used: std::collections::BTreeSet<&str> = sent.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(used.len(), 4, "no pod is left out for good: {used:?}");
    assert_eq!(
        sum([&a, &b], "ai_lb.eject.ejected"),
        4,
        "each once: late failures change nothing"
    );
    assert!(sum([&a, &b], "ai_lb.eject.fail_open") > 0);
    assert!(probe_until_zero(&bed, &a.url, Duration::from_secs(10)).is_zero());
}

/// A pod that only times out: the gateway's upstream timeout answers 504, which the plugin
/// sees as a failure (Envoy's router local reply passes its response phase), so the pod is
/// ejected for both gateways; meanwhile its hanging requests keep it looking busy. The
/// timeouts' counts all come back.
#[test]
fn a_pod_that_only_times_out_is_ejected_by_its_504s() {
    let bed = Bed::new(4, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        if c.name == BAD {
            (c.error_rate, c.error_fault) = (1.0, "hang".into());
        }
    });
    let cfg = glr_config(bed.redis.port, json!({"ejectAfterFailures": 2}));
    let gw = |id: &str| {
        let mut spec = bed.spec(id, Some(cfg.clone()));
        spec.upstream_timeout_ms = 500;
        bed.gateway(&spec)
    };
    let (a, b) = (gw("gw-a"), gw("gw-b"));
    // Sequential requests: the hanging pod is picked whenever it looks idle again (a failed
    // request's count stays failurePenaltyMs, 1 s), until its second 504 ejects it.
    let (mut timeouts, start) = (0, std::time::Instant::now());
    let mut i = 0;
    while sum([&a, &b], "ai_lb.eject.ejected") == 0 && start.elapsed() < Duration::from_secs(15) {
        let (status, _) = chat(if i % 2 == 0 { &a.url } else { &b.url }, "q", 2);
        timeouts += usize::from(status == 504);
        i += 1;
    }
    assert_eq!(timeouts, 2, "ejected at its second timeout");
    assert_eq!(
        sum([&a, &b], "ai_lb.eject.ejected"),
        1,
        "ejected once, for both"
    );
    // Ejected: the next requests all go elsewhere and are answered.
    let after = send(&[&a, &b], 80);
    assert!(
        after.iter().all(|(pod, s)| *s == 200 && pod != BAD),
        "after the ejection: {after:?}"
    );
    assert!(probe_until_zero(&bed, &a.url, Duration::from_secs(10)).is_zero());
}

/// Redis down while a pod is ejected: no pick can run, so every request falls back to the
/// host's own balancing, counted (the ejection lives in Redis: the failing pod takes its turn
/// there, and its 500s reach the client). Redis back empty, as after a crash without
/// persistence: the pod's failures are learned anew and it is ejected again. Nothing leaks.
#[test]
fn redis_down_while_a_pod_is_ejected_falls_back_then_learns_again() {
    let mut bed = failing_bed(&[BAD]);
    let (a, b) = gateways(&bed, json!({"ejectAfterFailures": 3}));
    send(&[&a, &b], 80);
    assert_eq!(sum([&a, &b], "ai_lb.eject.ejected"), 1);

    bed.redis.stop();
    let fallbacks = sum([&a, &b], "ai_lb.glr.fallback");
    let down = send(&[&a, &b], 40);
    assert!(
        down.iter()
            .all(|(pod, s)| *s == 200 || (pod == BAD && *s == 500)),
        "answered by the host's balancing: {down:?}"
    );
    assert_eq!(sum([&a, &b], "ai_lb.glr.fallback") - fallbacks, 40);

    bed.redis.restart();
    // The gateways' Redis clients reconnect on their next calls.
    let back = send(&[&a, &b], 160);
    let ejected = sum([&a, &b], "ai_lb.eject.ejected");
    assert_eq!(ejected, 2, "ejected again after Redis came back empty");
    // ejectAfterFailures (3), plus the requests already on their way when it was ejected.
    assert!(to_bad(&back) <= 3 + 8, "{} reached the pod", to_bad(&back));
    assert!(probe_until_zero(&bed, &a.url, Duration::from_secs(10)).is_zero());
}

/// A flapping pod, failing and healing again and again: what it draws in each failing spell
/// stays bounded (its second failure ejects it for both gateways, unless its first failure's
/// held count already kept it out for the spell), each healing takes it back (after its
/// ejection and one trial, or its held count), and nothing leaks.
#[test]
fn a_flapping_pod_draws_little_in_each_failing_spell_and_is_taken_back_in_each_healthy_one() {
    let bed = failing_bed(&[BAD]);
    let lb = json!({"ejectAfterFailures": 2, "ejectionMs": 300, "maxEjectionMs": 1200});
    let (a, b) = gateways(&bed, lb);
    let engine = bed.pods[0].engine().clone();
    for spell in 1..=3 {
        engine.set_error_rate(1.0);
        let before = sum([&a, &b], "ai_lb.eject.ejected");
        let failing = send(&[&a, &b], 80);
        let ejected = sum([&a, &b], "ai_lb.eject.ejected") - before;
        eprintln!(
            "spell {spell}: {} to the pod, {ejected} ejections",
            to_bad(&failing)
        );
        // Ejected at its second failure; an ejection that ends within the spell gives one
        // trial, whose failure ejects it again at once.
        assert!(ejected <= 3, "spell {spell}: {ejected} ejections");
        assert!(
            to_bad(&failing) as i64 <= 2 + 8 + (ejected - 1).max(0),
            "spell {spell}: {} to the failing pod",
            to_bad(&failing)
        );
        engine.set_error_rate(0.0);
        // Back after its ejection (at most maxEjectionMs) and a trial answered.
        let start = std::time::Instant::now();
        let back = std::iter::repeat_with(|| send(&[&a, &b], 16))
            .take_while(|_| start.elapsed() < Duration::from_secs(5))
            .any(|sent| sent.iter().any(|(pod, s)| pod == BAD && *s == 200));
        assert!(back, "spell {spell}: the healed pod was not taken back");
    }
    assert!(sum([&a, &b], "ai_lb.eject.ejected") >= 1);
    assert!(probe_until_zero(&bed, &a.url, Duration::from_secs(10)).is_zero());
}

/// A route that retries 5xx hides the failing pod's 500s from the client: each of its tries is
/// answered by another pod, whose 200 is what the plugin's response phase sees. The plugin
/// reads `upstream.address`, learns the failure against the pod it picked and moves the lease
/// to the pod that answered (docs/redis-data-model.md §14 "Served elsewhere"), so the pod is
/// still ejected for both gateways, and no client sees an error. Before, the 200 was learned
/// against the failing pod: it was never ejected and every request it drew paid a failed try.
#[test]
fn a_pod_whose_failures_a_retry_hides_is_still_ejected_for_every_gateway() {
    let bed = failing_bed(&[BAD]);
    let cfg = glr_config(bed.redis.port, json!({"ejectAfterFailures": 3}));
    let start = |id: &str| {
        let mut spec = bed.spec(id, Some(cfg.clone()));
        spec.retry_policy = Some(json!({"retry_on": "5xx", "num_retries": 1}));
        bed.gateway(&spec)
    };
    let (a, b) = (start("gw-a"), start("gw-b"));
    let sent = send(&[&a, &b], 400);
    assert!(sent.iter().all(|(_, s)| *s == 200), "the retries answered");
    assert_eq!(to_bad(&sent), 0, "no answer from the failing pod");
    let tries = sum([&a, &b], "gateway.upstream_rq_retry");
    eprintln!("retried around {BAD}: {tries} tries of 400 requests");
    // ejectAfterFailures (3), plus the picks already on their way when it was ejected.
    assert!(
        (3..=3 + 8).contains(&tries),
        "{tries} tries on the failing pod"
    );
    assert_eq!(sum([&a, &b], "ai_lb.glr.pod_down"), tries);
    assert_eq!(sum([&a, &b], "ai_lb.eject.failures"), tries);
    assert_eq!(
        sum([&a, &b], "ai_lb.eject.ejected"),
        1,
        "ejected once, for both"
    );
    // Every moved lease and every held failed count come back.
    assert!(probe_until_zero(&bed, &a.url, Duration::from_secs(10)).is_zero());
}
