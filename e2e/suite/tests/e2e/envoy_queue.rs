//! The waiting queue in real Envoy 1.40 (plain-Envoy artifact, 2 workers, per-proxy counts):
//! requests over the pool wait with their headers held and are resumed by a tick or by another
//! stream's end (queued_ms in the debug header); the deadline answers 429 + Retry-After; clients
//! gone while waiting leave no count behind (the pool is whole again afterwards).

use ailb_e2e::bed::{chat_body, Bed};
use ailb_e2e::envoy::Envoy;
use ailb_e2e::gateway::{http, open};
use ailb_testkit::wait_until;
use serde_json::json;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const DEBUG: &str = "x-ai-lb-debug";

#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: String,
    debug: String,
}

impl Answer {
    fn queued_ms(&self) -> Option<u64> {
        self.debug
            .split("; ")
            .find_map(|kv| kv.strip_prefix("queued_ms="))
            .and_then(|v| v.parse().ok())
    }
}

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
        Answer {
            status,
            retry_after: get("retry-after"),
            debug: get(DEBUG),
        }
    })
}

/// Waits until `n` requests were routed: the holders hold their slots before the next ones come
/// (polled, not slept: on a loaded machine Envoy may take a while to route them).
fn routed(envoy: &Envoy, n: i64) {
    assert!(
        wait_until(Duration::from_secs(5), || envoy.stat("ai_lb.glr.routed")
            >= n),
        "{}",
        envoy.logs()
    );
}

fn join(t: Vec<JoinHandle<Answer>>) -> Vec<Answer> {
    t.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn envoy_holds_requests_over_the_pool_and_admits_them_as_room_frees() {
    let bed = Bed::new(2, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    });
    let pods = bed.pod_addrs();
    let plugin = json!({"lb_policy": "global_least_request", "lb_config": {
        "endpoints": pods, "maxRequestCount": 1, "priorityHeader": "x-priority",
        "debugHeader": DEBUG, "queueTimeoutMs": 8000}});
    let envoy = Envoy::start(&pods, &plugin);

    // ~3 s holders take both slots; four more wait and go in two by two as room frees.
    let holders: Vec<_> = (0..2)
        .map(|_| send(envoy.url.clone(), "standard", 300))
        .collect();
    routed(&envoy, 2);
    let waiters: Vec<_> = (0..4)
        .map(|i| send(envoy.url.clone(), ["standard", "critical"][i % 2], 30))
        .collect();
    for h in join(holders) {
        assert_eq!((h.status, h.queued_ms()), (200, None), "{h:?}");
    }
    for w in join(waiters) {
        assert_eq!(w.status, 200, "{w:?}");
        let q = w
            .queued_ms()
            .unwrap_or_else(|| panic!("no queued_ms: {w:?}"));
        assert!(q >= 200, "waited for room: {w:?}");
    }
    assert_eq!(envoy.stat("ai_lb.queue.queued"), 4);
    assert_eq!(envoy.stat("ai_lb.queue.admitted"), 4);
    assert_eq!(envoy.stat("ai_lb.glr.routed"), 6);
}

#[test]
fn envoy_critical_requests_get_the_room_before_earlier_standard_ones_on_any_worker() {
    let bed = Bed::new(2, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    });
    let pods = bed.pod_addrs();
    let plugin = json!({"lb_policy": "global_least_request", "lb_config": {
        "endpoints": pods, "maxRequestCount": 1, "priorityHeader": "x-priority",
        "debugHeader": DEBUG, "queueTimeoutMs": 20000}});
    let envoy = Envoy::start(&pods, &plugin);
    let t0 = Instant::now();
    let timed = |class: &'static str, tokens: u64| {
        let url = envoy.url.clone();
        std::thread::spawn(move || {
            let a = send(url, class, tokens).join().unwrap();
            (a, t0.elapsed())
        })
    };
    let holders: Vec<_> = (0..2).map(|_| timed("standard", 120)).collect();
    routed(&envoy, 2);
    // Standard requests wait first, critical ones later; the workers they land on are
    // Envoy's choice, and their queues are per worker.
    let standard: Vec<_> = (0..4).map(|_| timed("standard", 40)).collect();
    assert!(
        wait_until(Duration::from_secs(5), || envoy.stat("ai_lb.queue.queued")
            >= 4),
        "queued {}, routed {}, pod_down {}, fallback {}: {}",
        envoy.stat("ai_lb.queue.queued"),
        envoy.stat("ai_lb.glr.routed"),
        envoy.stat("ai_lb.glr.pod_down"),
        envoy.stat("ai_lb.glr.fallback"),
        envoy.logs()
    );
    let critical: Vec<_> = (0..2).map(|_| timed("critical", 40)).collect();
    let done = |t: Vec<JoinHandle<(Answer, Duration)>>| -> Vec<(Answer, Duration)> {
        t.into_iter().map(|t| t.join().unwrap()).collect()
    };
    for (h, _) in done(holders) {
        assert_eq!(h.status, 200, "{h:?}");
    }
    let standard = done(standard);
    let critical = done(critical);
    for (w, _) in standard.iter().chain(&critical) {
        assert_eq!(w.status, 200, "{w:?}");
        assert!(w.queued_ms().is_some(), "{w:?}");
    }
    let last_critical = critical.iter().map(|(_, d)| *d).max().unwrap();
    let first_standard = standard.iter().map(|(_, d)| *d).min().unwrap();
    assert!(
        last_critical < first_standard,
        "critical done by {last_critical:?}, a standard already at {first_standard:?}"
    );
    assert_eq!(envoy.stat("ai_lb.queue.admitted"), 6);
}

#[test]
fn envoy_deadline_and_abandon_leave_the_pool_whole() {
    let bed = Bed::new(2, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    });
    let pods = bed.pod_addrs();
    let plugin = json!({"lb_policy": "global_least_request", "lb_config": {
        "endpoints": pods, "maxRequestCount": 1, "priorityHeader": "x-priority",
        "debugHeader": DEBUG, "queueTimeoutMs": 500}});
    let envoy = Envoy::start(&pods, &plugin);
    let holders: Vec<_> = (0..2)
        .map(|_| send(envoy.url.clone(), "standard", 200))
        .collect();
    routed(&envoy, 2);
    // Clients that give up while waiting: each goes once the proxy holds it.
    let headers = [
        ("content-type", "application/json"),
        ("x-priority", "critical"),
    ];
    for n in 1..=3 {
        let body = chat_body("impatient", 30);
        let s = open(&envoy.url, "POST", "/v1/chat/completions", &headers, &body).unwrap();
        assert!(wait_until(Duration::from_secs(5), || envoy
            .stat("ai_lb.queue.queued")
            >= n));
        drop(s);
    }
    assert!(
        wait_until(Duration::from_secs(5), || envoy
            .stat("ai_lb.queue.abandoned")
            == 3),
        "abandoned {}: {}",
        envoy.stat("ai_lb.queue.abandoned"),
        envoy.logs()
    );
    // The deadline: the 429 it would have got, with Retry-After.
    let start = Instant::now();
    let late = join(
        (0..2)
            .map(|_| send(envoy.url.clone(), "sheddable", 30))
            .collect(),
    );
    assert!(start.elapsed() >= Duration::from_millis(500));
    for w in &late {
        assert_eq!((w.status, w.retry_after.as_str()), (429, "1"), "{w:?}");
    }
    for w in &late {
        // Envoy runs its local reply through the filter: the 429 says how long it waited.
        assert!(
            w.queued_ms().is_some_and(|q| q >= 500) && w.debug.contains("reason=shed_priority"),
            "{w:?}"
        );
    }
    assert_eq!(envoy.stat("ai_lb.queue.timeout"), 2);
    for h in join(holders) {
        assert_eq!(h.status, 200, "{h:?}");
    }
    // Nothing leaked: the pool's two slots are free again, no wait.
    let again = join(
        (0..2)
            .map(|_| send(envoy.url.clone(), "standard", 30))
            .collect(),
    );
    for a in &again {
        assert_eq!((a.status, a.queued_ms()), (200, None), "{a:?}");
    }
    assert_eq!(envoy.stat("ai_lb.queue.admitted"), 0);
    assert_eq!(envoy.stat("ai_lb.queue.queued"), 5);
}
