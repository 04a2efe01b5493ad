//! Priority classes end to end (docs/sessions-and-queues.md "Priority classes"): two emulator gateways × 2 workers
//! sharing one real redis-server in front of slow fake pods; as the pool fills, the lowest class
//! is refused first (429 + Retry-After, counted in ai_lb.priority.shed), critical uses its headroom, and
//! every count and lease comes back, shed requests holding none.

use ailb_e2e::bed::{chat_body, wait_for_zero, wait_wave, Bed};
use ailb_e2e::gateway::{glr_config, http, Gateway};
use serde_json::json;
use std::thread::JoinHandle;
use std::time::Duration;

const DEBUG: &str = "x-ai-lb-debug";

/// 10 ms per output token: a 500-token request holds its pod slot for ~5 s.
fn slow_pods(pods: usize) -> Bed {
    Bed::new(pods, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    })
}

/// (status, retry-after, debug reason) of one request of `class`.
type Answer = (u16, String, String);

fn send(url: String, class: &'static str, tokens: u64) -> JoinHandle<Answer> {
    std::thread::spawn(move || {
        let body = chat_body(&format!("{class} request"), tokens);
        let headers = [("content-type", "application/json"), ("x-priority", class)];
        let (status, hdrs, _) = http(&url, "POST", "/v1/chat/completions", &headers, &body)
            .unwrap_or((0, Vec::new(), Vec::new()));
        let get = |name: &str| {
            hdrs.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let reason = get(DEBUG)
            .rsplit("reason=")
            .next()
            .unwrap_or("")
            .to_string();
        (status, get("retry-after"), reason)
    })
}

/// Sends `n` requests of `class`, alternating gateways, and lets them reach their pods or
/// their refusal.
fn wave(
    bed: &Bed,
    gws: &[&Gateway],
    n: usize,
    class: &'static str,
    tokens: u64,
) -> Vec<JoinHandle<Answer>> {
    let before = bed.counts().leases;
    let threads: Vec<_> = (0..n)
        .map(|i| send(gws[i % gws.len()].url.clone(), class, tokens))
        .collect();
    wait_wave(bed, before, &threads);
    threads
}

fn shed(answers: Vec<JoinHandle<Answer>>) -> usize {
    answers
        .into_iter()
        .map(|t| t.join().unwrap())
        .filter(|(status, retry, reason)| {
            if *status == 429 {
                // (A local reply carries no debug header here: the reason is checked in the
                // core unit tests and counted below.)
                assert_eq!(retry, "1", "a shed carries Retry-After");
                true
            } else {
                assert_eq!(*status, 200, "admitted requests are served ({reason})");
                false
            }
        })
        .count()
}

#[test]
fn under_overload_shedding_follows_class_order_and_nothing_leaks() {
    let bed = slow_pods(2);
    // Per pod: sheddable up to 1 in flight, standard 2, critical 3 (maxRequestCount 2,
    // priorityReserve 1, criticalHeadroom 1); 2 pods, counted across both gateways.
    let cfg = glr_config(
        bed.redis.port,
        json!({"maxRequestCount": 2, "priorityHeader": "x-priority", "criticalHeadroom": 1,
               "priorityReserve": 1, "debugHeader": DEBUG}),
    );
    let a = bed.gateway(&bed.spec("gw-a", Some(cfg.clone())));
    let b = bed.gateway(&bed.spec("gw-b", Some(cfg)));
    let gws = [&a, &b];
    let long = 500;

    let sheddable = wave(&bed, &gws, 2, "sheddable", long);
    let sheddable_over = wave(&bed, &gws, 2, "sheddable", long);
    let standard = wave(&bed, &gws, 2, "standard", long);
    let standard_over = wave(&bed, &gws, 2, "standard", long);
    let critical = wave(&bed, &gws, 2, "critical", long);
    let critical_over = wave(&bed, &gws, 2, "critical", long);
    let unknown_over = wave(&bed, &gws, 1, "vip", long);

    assert_eq!(shed(sheddable), 0, "sheddable fits while the pool is idle");
    assert_eq!(
        shed(sheddable_over),
        2,
        "sheddable refused at cap - reserve"
    );
    assert_eq!(shed(standard), 0, "standard still admitted up to the cap");
    assert_eq!(shed(standard_over), 2, "standard refused at the cap");
    assert_eq!(shed(critical), 0, "critical uses its headroom");
    assert_eq!(shed(critical_over), 2, "critical refused at cap + headroom");
    assert_eq!(
        shed(unknown_over),
        1,
        "an unknown class is the default class"
    );

    let stat = |name: &str| a.stat(name) + b.stat(name);
    assert_eq!(stat("ai_lb.priority.shed"), 7);
    assert_eq!(stat("ai_lb.glr.rejected_429"), 7);
    assert_eq!(stat("ai_lb.priority.unknown_class"), 1);
    assert_eq!(stat("ai_lb.glr.routed"), 6);
    let left = wait_for_zero(&bed, Duration::from_secs(5));
    assert!(left.is_zero(), "counts or leases left: {left:?}");
}
