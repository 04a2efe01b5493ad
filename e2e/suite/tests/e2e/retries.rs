//! The emulator's route retry policy (Envoy's `RouteAction.retry_policy`, e2e/gateway
//! router.rs) under global_least_request: a request the plugin overrode to a failing pod is
//! retried on another pod through the cluster's own LB (a retry ignores the override, as in
//! Higress's Envoy 1.27), never back to a pod it tried while another is left; the plugin's
//! response phase sees only the last try, and learns its pick's failure when another pod
//! answered; only the conditions and codes the policy names are retried; without a policy
//! nothing changes. Every try's active count comes back.

use ailb_e2e::bed::{chat_body, probe_until_zero, Bed};
use ailb_e2e::gateway::{glr_config, http, Gateway};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const DEBUG: &str = "x-ai-lb-debug";

/// One request: the pod the plugin chose (its debug header), the pod that answered (`x-pod`),
/// the status, how many debug headers the response had and how long it took.
struct Sent {
    chosen: String,
    served: String,
    status: u16,
    debug_headers: usize,
    took: Duration,
}

/// `pods` fake pods; `faults` gives some of them an `--error-fault` drawn for every request.
fn bed(pods: usize, faults: &[(&str, &str)]) -> Bed {
    let faults: Vec<(String, String)> = faults
        .iter()
        .map(|(p, f)| (p.to_string(), f.to_string()))
        .collect();
    Bed::new(pods, move |c| {
        c.max_running = 64;
        c.decode_us_per_token = 1_000;
        if let Some((_, f)) = faults.iter().find(|(p, _)| *p == c.name) {
            (c.error_rate, c.error_fault) = (1.0, f.clone());
        }
    })
}

/// A global_least_request gateway whose route has `policy`. Failure memory counts every 5xx
/// the plugin sees (`ai_lb.eject.failures`) without ejecting anyone or holding a failed pod's
/// count, so a failing pod stays as likely a pick as the others.
fn gateway(
    bed: &Bed,
    policy: Option<Value>,
    tune: impl Fn(&mut ailb_e2e::gateway::GatewaySpec),
) -> Gateway {
    let lb = json!({"debugHeader": DEBUG, "ejectAfterFailures": 1000, "failurePenaltyMs": 0});
    let mut spec = bed.spec("gw-retry", Some(glr_config(bed.redis.port, lb)));
    spec.retry_policy = policy;
    tune(&mut spec);
    bed.gateway(&spec)
}

/// `n` sequential requests (each pick sees the others' counts given back: the plugin's
/// choice is uniform over the pods).
fn send(bed: &Bed, gw: &Gateway, n: usize) -> Vec<Sent> {
    let pod_of = |addr: &str| {
        bed.pods
            .iter()
            .find(|p| p.addr.to_string() == addr)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| format!("?{addr}"))
    };
    (0..n)
        .map(|_| {
            let start = Instant::now();
            let ct = [("content-type", "application/json")];
            let (status, headers, _) = http(
                &gw.url,
                "POST",
                "/v1/chat/completions",
                &ct,
                &chat_body("q", 2),
            )
            .expect("request");
            let get = |name: &str| -> Vec<&str> {
                let named = headers.iter().filter(|(k, _)| k == name);
                named.map(|(_, v)| v.as_str()).collect()
            };
            let debug = get(DEBUG);
            let chosen = debug
                .first()
                .and_then(|d| d.strip_prefix("endpoint="))
                .and_then(|d| d.split(';').next())
                .map(pod_of)
                .unwrap_or_default();
            Sent {
                chosen,
                served: get("x-pod")
                    .first()
                    .copied()
                    .unwrap_or_default()
                    .to_string(),
                status,
                debug_headers: debug.len(),
                took: start.elapsed(),
            }
        })
        .collect()
}

fn chosen<'a>(sent: &'a [Sent], pod: &str) -> Vec<&'a Sent> {
    sent.iter().filter(|s| s.chosen == pod).collect()
}

/// The gateway's endpoints: (address, requests_total, active).
fn upstreams(gw: &Gateway) -> Vec<(String, i64, i64)> {
    let (_, _, body) = http(&gw.admin, "GET", "/admin/upstreams", &[], b"").expect("admin");
    let list: Vec<Value> = serde_json::from_slice(&body).expect("upstreams json");
    list.iter()
        .map(|e| {
            let n = |k: &str| e[k].as_i64().unwrap_or(-1);
            (
                e["address"].as_str().unwrap_or("").to_string(),
                n("requests_total"),
                n("active"),
            )
        })
        .collect()
}

/// Nothing leaks: every try's active count is back (the last try's once its body ended), and
/// every Redis count is.
fn nothing_leaks(bed: &Bed, gw: &Gateway) {
    let idle = ailb_testkit::wait_until(Duration::from_secs(5), || {
        upstreams(gw).iter().all(|(_, _, active)| *active == 0)
    });
    assert!(idle, "active counts left: {:?}", upstreams(gw));
    assert!(probe_until_zero(bed, &gw.url, Duration::from_secs(10)).is_zero());
}

fn requests_to(bed: &Bed, gw: &Gateway, pod: &str) -> i64 {
    let addr = bed
        .pods
        .iter()
        .find(|p| p.name == pod)
        .map(|p| p.addr.to_string());
    upstreams(gw)
        .iter()
        .find(|(a, _, _)| Some(a) == addr.as_ref())
        .map_or(0, |(_, n, _)| *n)
}

#[test]
fn a_request_overridden_to_a_failing_pod_is_retried_on_another_and_the_plugin_sees_one_answer() {
    let bed = bed(3, &[("pod-0", "status:500")]);
    let gw = gateway(
        &bed,
        Some(json!({"retry_on": "5xx", "num_retries": 1})),
        |_| {},
    );
    let sent = send(&bed, &gw, 30);
    let to_bad = chosen(&sent, "pod-0");
    assert!(
        !to_bad.is_empty(),
        "the plugin never chose pod-0 in 30 requests"
    );
    for s in &sent {
        assert_eq!(s.status, 200, "chosen {} served by {}", s.chosen, s.served);
        assert_eq!(s.debug_headers, 1, "one response phase");
        if s.chosen == "pod-0" {
            assert_ne!(s.served, "pod-0", "the retry went elsewhere");
        } else {
            assert_eq!(
                s.served, s.chosen,
                "a request that did not fail is not retried"
            );
        }
    }
    let retries = to_bad.len() as i64;
    eprintln!(
        "5xx retry: {retries} of {} requests chosen pod-0, each retried",
        sent.len()
    );
    assert_eq!(gw.stat("gateway.upstream_rq_retry"), retries);
    assert_eq!(gw.stat("gateway.upstream_rq_retry_success"), retries);
    assert_eq!(gw.stat("gateway.upstream_rq_retry_limit_exceeded"), 0);
    assert_eq!(requests_to(&bed, &gw, "pod-0"), retries, "each failed once");
    // The plugin saw only the retries' 200s, each from another pod than its pick
    // (`upstream.address`): each pick of pod-0 is learned as its failure and its lease moved
    // to the pod that answered (docs/redis-data-model.md §14 "Served elsewhere").
    assert_eq!(gw.stat("ai_lb.glr.pod_down"), retries);
    assert_eq!(gw.stat("ai_lb.eject.failures"), retries);
    nothing_leaks(&bed, &gw);
}

#[test]
fn retriable_status_codes_retry_a_503_but_not_a_500() {
    let bed = bed(3, &[("pod-0", "status:500"), ("pod-1", "status:503")]);
    let policy = json!({"retry_on": "retriable-status-codes", "retriable_status_codes": [503]});
    let gw = gateway(&bed, Some(policy), |_| {});
    let sent = send(&bed, &gw, 40);
    let (to_500, to_503) = (chosen(&sent, "pod-0"), chosen(&sent, "pod-1"));
    assert!(
        !to_500.is_empty() && !to_503.is_empty(),
        "both failing pods chosen"
    );
    for s in &to_500 {
        assert_eq!(
            (s.status, s.served.as_str()),
            (500, "pod-0"),
            "a 500 is not retried"
        );
    }
    for s in &to_503 {
        // Retried once on pod-0 or pod-2 (num_retries defaults to 1): a 500 from pod-0 is
        // the answer then.
        assert_ne!(s.served, "pod-1");
        let want = if s.served == "pod-0" { 500 } else { 200 };
        assert_eq!(s.status, want, "served by {}", s.served);
    }
    assert!(chosen(&sent, "pod-2")
        .iter()
        .all(|s| s.status == 200 && s.served == "pod-2"));
    assert_eq!(gw.stat("gateway.upstream_rq_retry"), to_503.len() as i64);
    assert_eq!(gw.stat("gateway.upstream_rq_retry_limit_exceeded"), 0);
    // The plugin saw each request's last answer, never a 503: every 500 is learned, and so
    // is each 503 the retry answered around (its pick served elsewhere).
    let failures = sent.iter().filter(|s| s.status >= 500).count() as i64;
    assert_eq!(gw.stat("ai_lb.glr.pod_down"), to_503.len() as i64);
    assert_eq!(
        gw.stat("ai_lb.eject.failures"),
        failures + to_503.len() as i64
    );
    assert!(sent.iter().all(|s| s.status != 503));
    nothing_leaks(&bed, &gw);
}

#[test]
fn a_retry_never_goes_back_to_a_pod_it_tried_while_another_is_left() {
    // Two failing pods (a reset, a 503) and one healthy, behind round robin: two retries reach
    // the healthy pod from any first choice only if no retry repeats a pod.
    let bed = bed(3, &[("pod-0", "reset"), ("pod-1", "status:503")]);
    let gw = gateway(
        &bed,
        Some(json!({"retry_on": "5xx", "num_retries": 2})),
        |_| {},
    );
    let n = 30;
    let sent = send(&bed, &gw, n);
    assert!(
        sent.iter().all(|s| s.status == 200 && s.served == "pod-2"),
        "{:?}",
        sent.iter()
            .map(|s| (&s.chosen, &s.served, s.status))
            .collect::<Vec<_>>()
    );
    let (bad0, bad1) = (
        requests_to(&bed, &gw, "pod-0"),
        requests_to(&bed, &gw, "pod-1"),
    );
    assert_eq!(
        requests_to(&bed, &gw, "pod-2"),
        n as i64,
        "one try each on pod-2"
    );
    eprintln!("previous hosts: {n} requests, {bad0} tries on pod-0 (reset), {bad1} on pod-1 (503)");
    assert!(bad0 <= n as i64 && bad1 <= n as i64);
    assert_eq!(
        gw.stat("gateway.upstream_rq_retry"),
        bad0 + bad1,
        "every failed try retried"
    );
    assert!(!chosen(&sent, "pod-0").is_empty() && !chosen(&sent, "pod-1").is_empty());
    assert_eq!(gw.stat("gateway.upstream_connect_failures"), 0);
    // Every pick of pod-0 or pod-1 was answered by pod-2: each learned once, as its pick's
    // failure.
    let around = sent.iter().filter(|s| s.chosen != "pod-2").count() as i64;
    assert_eq!(gw.stat("ai_lb.eject.failures"), around);
    assert_eq!(gw.stat("ai_lb.glr.pod_down"), around);
    nothing_leaks(&bed, &gw);
}

#[test]
fn a_try_that_hangs_past_its_per_try_timeout_is_retried_elsewhere() {
    let bed = bed(2, &[("pod-0", "hang")]);
    let policy = json!({"retry_on": "reset", "per_try_timeout_ms": 300});
    let gw = gateway(&bed, Some(policy), |s| s.upstream_timeout_ms = 5_000);
    let sent = send(&bed, &gw, 12);
    let to_hang = chosen(&sent, "pod-0");
    assert!(!to_hang.is_empty());
    assert!(sent.iter().all(|s| s.status == 200 && s.served == "pod-1"));
    assert!(to_hang.iter().all(|s| s.took >= Duration::from_millis(300)));
    assert!(
        to_hang.iter().all(|s| s.took < Duration::from_secs(3)),
        "not the route timeout"
    );
    assert_eq!(gw.stat("gateway.upstream_rq_retry"), to_hang.len() as i64);
    nothing_leaks(&bed, &gw);
}

#[test]
fn without_a_retry_policy_a_failing_pods_answer_is_the_answer() {
    let bed = bed(3, &[("pod-0", "status:500")]);
    let gw = gateway(&bed, None, |_| {});
    let sent = send(&bed, &gw, 30);
    let to_bad = chosen(&sent, "pod-0");
    assert!(!to_bad.is_empty());
    for s in &sent {
        let want = if s.chosen == "pod-0" { 500 } else { 200 };
        assert_eq!((s.status, s.served.as_str()), (want, s.chosen.as_str()));
    }
    assert_eq!(gw.stat("gateway.upstream_rq_retry"), 0);
    assert_eq!(
        gw.stat("ai_lb.eject.failures"),
        to_bad.len() as i64,
        "the plugin saw every 500"
    );
    nothing_leaks(&bed, &gw);
}
