//! The waiting queue end to end (docs/sessions-and-queues.md "Waiting queue"): two emulator gateways × 2 workers
//! sharing one real redis-server in front of slow fake pods. Under overload, requests wait
//! (headers held) instead of a 429; a critical request waiting on gateway A gets the room that
//! frees on gateway B before B's own earlier standard waiters (the Redis wait set); the debug
//! header shows `queued_ms`; a deadline answers 429 + Retry-After; a client gone while waiting
//! leaks nothing (counts, leases and the wait set back to empty).

use ailb_core::redis::scripts::Keys;
use ailb_e2e::bed::{chat_body, wait_for_zero, Bed};
use ailb_e2e::gateway::{glr_config, http, open, CLUSTER, ROUTE};
use ailb_testkit::wait_until;
use serde_json::json;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const DEBUG: &str = "x-ai-lb-debug";

/// 10 ms per output token.
fn slow_pods(pods: usize) -> Bed {
    Bed::new(pods, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    })
}

#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: String,
    /// The debug header's `queued_ms` (None: it did not wait, or no header).
    queued_ms: Option<u64>,
    /// When the answer came, from the test's start.
    done: Duration,
}

fn send(url: String, class: &'static str, tokens: u64, t0: Instant) -> JoinHandle<Answer> {
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
        let queued_ms = get(DEBUG)
            .split("; ")
            .find_map(|kv| kv.strip_prefix("queued_ms="))
            .and_then(|v| v.parse().ok());
        Answer {
            status,
            retry_after: get("retry-after"),
            queued_ms,
            done: t0.elapsed(),
        }
    })
}

fn join(t: Vec<JoinHandle<Answer>>) -> Vec<Answer> {
    t.into_iter().map(|t| t.join().unwrap()).collect()
}

fn waiters(bed: &Bed) -> i64 {
    let keys = Keys::new("ailb", ROUTE, CLUSTER);
    let mut c = bed.redis.conn();
    c.cmd(&["ZCARD", keys.wait.as_str()]).as_i64().unwrap_or(-1)
}

#[test]
fn critical_waiting_on_one_gateway_gets_in_before_standard_waiting_on_the_other() {
    // One slot per pod for every class: 2 in the pool, counted across both gateways.
    critical_first(json!({"maxRequestCount": 1}));
}

#[test]
fn a_full_pool_waits_and_critical_on_one_gateway_gets_in_first() {
    // No endpoint cap: maxPoolRequests alone holds 2 in flight, for every class (POOL replies
    // wait as FULL ones do; the wait set holds the pool's room for the critical requests).
    let pool_full =
        critical_first(json!({"maxRequestCount": 0, "maxPoolRequests": 2, "criticalHeadroom": 0}));
    assert!(
        pool_full >= 6,
        "every waiter was refused by the pool: {pool_full}"
    );
}

/// Two ~1.5 s holders fill the pool through gateway B, then 4 standard requests wait on B and
/// 2 critical ones on A: the critical ones are served first. Returns `ai_lb.pool.full`.
fn critical_first(caps: serde_json::Value) -> i64 {
    let bed = slow_pods(2);
    let mut lb = json!({"priorityHeader": "x-priority", "debugHeader": DEBUG,
                        "queueTimeoutMs": 20000});
    if let (Some(lb), Some(caps)) = (lb.as_object_mut(), caps.as_object()) {
        lb.extend(caps.clone());
    }
    let cfg = glr_config(bed.redis.port, lb);
    let a = bed.gateway(&bed.spec("gw-a", Some(cfg.clone())));
    let b = bed.gateway(&bed.spec("gw-b", Some(cfg)));
    let t0 = Instant::now();
    // Two requests of ~1.5 s take both slots through gateway B.
    let holders: Vec<_> = (0..2)
        .map(|_| send(b.url.clone(), "standard", 150, t0))
        .collect();
    let stat = |name: &str| a.stat(name) + b.stat(name);
    // Each wave is in (counted, or waiting) before the next is sent.
    let settled = |what: &str, ok: &dyn Fn() -> bool| {
        assert!(wait_until(Duration::from_secs(5), ok), "{what}");
    };
    settled("holders in", &|| bed.counts().leases == 2);
    // Standard requests wait on B first, then critical ones on A.
    let standard: Vec<_> = (0..4)
        .map(|_| send(b.url.clone(), "standard", 50, t0))
        .collect();
    settled("standard waiting", &|| stat("ai_lb.queue.queued") == 4);
    let critical: Vec<_> = (0..2)
        .map(|_| send(a.url.clone(), "critical", 50, t0))
        .collect();
    settled("every request over the pool waits", &|| {
        stat("ai_lb.queue.queued") == 6
    });
    settled("each waiter is in the Redis wait set", &|| {
        waiters(&bed) == 6
    });

    let holders = join(holders);
    let standard = join(standard);
    let critical = join(critical);
    for h in &holders {
        assert_eq!((h.status, h.queued_ms), (200, None), "{h:?}");
    }
    for w in standard.iter().chain(&critical) {
        assert_eq!(w.status, 200, "waited, then served: {w:?}");
        assert!(
            w.queued_ms.is_some(),
            "queued_ms in the debug header: {w:?}"
        );
    }
    // The room freed on B went to A's critical requests although B's standard requests
    // waited longer and B's own releases retried them first.
    let last_critical = critical.iter().map(|w| w.done).max().unwrap();
    let first_standard = standard.iter().map(|w| w.done).min().unwrap();
    eprintln!("critical: {critical:?}\nstandard: {standard:?}");
    assert!(
        last_critical < first_standard,
        "critical done by {last_critical:?}, a standard already at {first_standard:?}"
    );
    assert_eq!(stat("ai_lb.queue.admitted"), 6);
    assert_eq!(stat("ai_lb.queue.timeout"), 0);
    assert_eq!(stat("ai_lb.glr.routed"), 8);
    let left = wait_for_zero(&bed, Duration::from_secs(5));
    assert!(left.is_zero(), "counts or leases left: {left:?}");
    assert_eq!(waiters(&bed), 0, "the wait set is empty again");
    stat("ai_lb.pool.full")
}

#[test]
fn a_deadline_answers_429_and_a_client_gone_while_waiting_leaks_nothing() {
    let bed = slow_pods(2);
    let cfg = glr_config(
        bed.redis.port,
        json!({"maxRequestCount": 1, "priorityHeader": "x-priority", "debugHeader": DEBUG,
               "queueTimeoutMs": 600}),
    );
    let a = bed.gateway(&bed.spec("gw-a", Some(cfg.clone())));
    let b = bed.gateway(&bed.spec("gw-b", Some(cfg)));
    let gws = [&a, &b];
    let t0 = Instant::now();
    // ~3 s holders fill the pool.
    let holders: Vec<_> = (0..2)
        .map(|i| send(gws[i].url.clone(), "standard", 300, t0))
        .collect();
    assert!(
        wait_until(Duration::from_secs(5), || bed.counts().leases == 2),
        "holders in: {:?}",
        bed.counts()
    );

    // Clients that give up while waiting: the request is sent and, once it waits, the
    // connection dropped.
    let headers = [
        ("content-type", "application/json"),
        ("x-priority", "critical"),
    ];
    for gw in gws {
        for _ in 0..2 {
            let queued = gw.stat("ai_lb.queue.queued");
            let body = chat_body("impatient", 50);
            let s = open(&gw.url, "POST", "/v1/chat/completions", &headers, &body).unwrap();
            assert!(
                wait_until(Duration::from_secs(5), || gw.stat("ai_lb.queue.queued")
                    > queued),
                "the impatient request waits"
            );
            drop(s);
        }
    }
    let stat = |name: &str| a.stat(name) + b.stat(name);
    assert!(
        wait_until(Duration::from_secs(5), || stat("ai_lb.queue.abandoned")
            == 4),
        "abandoned: {}",
        stat("ai_lb.queue.abandoned")
    );
    assert_eq!(waiters(&bed), 0, "abandoned waiters leave the wait set");

    // Waiters that reach the deadline get the 429 they would have got, with Retry-After.
    let start = Instant::now();
    let late = join(
        (0..4)
            .map(|i| send(gws[i % 2].url.clone(), "sheddable", 50, t0))
            .collect(),
    );
    let waited = start.elapsed();
    for w in &late {
        assert_eq!((w.status, w.retry_after.as_str()), (429, "1"), "{w:?}");
    }
    assert!(
        waited >= Duration::from_millis(600),
        "held until the deadline: {waited:?}"
    );
    assert_eq!(stat("ai_lb.queue.timeout"), 4);
    assert_eq!(stat("ai_lb.queue.queued"), 8);
    assert_eq!(stat("ai_lb.queue.admitted"), 0);
    for h in join(holders) {
        assert_eq!(h.status, 200);
    }
    let left = wait_for_zero(&bed, Duration::from_secs(5));
    assert!(left.is_zero(), "counts or leases left: {left:?}");
    assert_eq!(waiters(&bed), 0);
    for gw in gws {
        // Every request ended: nothing tracked in any VM (the emulator's leak check).
        assert_eq!(gw.stat("ai_lb.glr.routed"), 1);
    }
}
