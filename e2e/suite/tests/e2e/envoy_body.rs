//! The plain-Envoy artifact reads the request body before routing in real Envoy 1.40
//! (docs/plain-envoy.md): least request weighted by body bytes, endpoint_metrics' LoRA
//! affinity from the body's `model`, a 5 MB body refused (413) or balanced unread as the buffer
//! limit says, and a filter deployed without `allow_on_headers_stop_iteration` bounded by
//! `maxBodyWaitMs`, then no longer holding.

use ailb_e2e::bed::Bed;
use ailb_e2e::envoy::{Body, Envoy, SCRAPE_CLUSTER};
use ailb_e2e::gateway::http;
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const DEST: &str = "x-gateway-destination-endpoint";

/// What one request through Envoy gave: status, answering pod (`x-pod`), the plugin's debug
/// header, and how long it took.
struct Answer {
    status: u16,
    pod: String,
    debug: String,
    took: Duration,
    /// Why no answer was read (status 0): a reset while uploading, a timeout.
    error: String,
}

fn body(model: &str, text: &str, max_tokens: u64) -> Vec<u8> {
    json!({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens})
        .to_string()
        .into_bytes()
}

/// POSTs `body` the way a client sending a large upload does: the body is written by another
/// thread while the response is read, so an early answer (413) is read even though Envoy
/// closes the connection before the body is all sent. Returns the status and the time taken.
fn post_streaming(url: &str, body: Vec<u8>) -> (u16, Duration) {
    let start = Instant::now();
    let addr = url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = s.try_clone().unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(head.as_bytes());
        let _ = w.write_all(&body);
    });
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw); // a reset after the answer still leaves it in `raw`
    let took = start.elapsed();
    let _ = writer.join();
    let status = String::from_utf8_lossy(&raw)
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, took)
}

fn post(url: &str, body: &[u8], extra: &[(&str, &str)]) -> Answer {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend_from_slice(extra);
    let start = Instant::now();
    let (status, hs, error) = match http(url, "POST", "/v1/chat/completions", &headers, body) {
        Ok((status, hs, _)) => (status, hs, String::new()),
        Err(e) => (0, Vec::new(), format!("{e:#}")),
    };
    let header = |name: &str| {
        hs.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    Answer {
        status,
        pod: header("x-pod"),
        debug: header("x-ai-lb-debug"),
        took: start.elapsed(),
        error,
    }
}

/// Envoy's own account of the listener's answers, for a failure message: which codes it
/// sent downstream and what the upstream did.
fn envoy_answers(envoy: &Envoy) -> String {
    envoy
        .stats_text()
        .lines()
        .filter(|l| {
            l.contains("downstream_rq_")
                || l.contains("upstream_rq_")
                || l.contains("upstream_cx_destroy")
                || l.contains("ai_lb.")
        })
        .filter(|l| !l.ends_with(": 0"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// 2 pods decoding 10 ms per token, no batch slowdown: a request's length is its max_tokens.
fn long_bed() -> Bed {
    Bed::new(2, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    })
}

fn glr(pods: &[String], extra: Value) -> Value {
    let mut lb = json!({"endpoints": pods, "debugHeader": "x-ai-lb-debug"});
    if let (Some(lb), Some(extra)) = (lb.as_object_mut(), extra.as_object()) {
        lb.extend(extra.clone());
    }
    json!({"lb_policy": "global_least_request", "lb_config": lb})
}

/// One long request with a `big`-byte prompt in flight, then 4 short ones in flight together
/// (each naming the big one's pod in the destination header, as a client trying to steer):
/// returns the big one's pod and where the short ones landed.
fn big_then_small(bed: &Bed, envoy: &Envoy, big: usize) -> (String, Vec<String>) {
    let url = envoy.url.clone();
    let long = std::thread::spawn(move || post(&url, &body("m", &"x".repeat(big), 300), &[]));
    assert!(wait_until(Duration::from_secs(5), || bed
        .pods
        .iter()
        .any(|p| p.state().running == 1)));
    let busy = bed
        .pods
        .iter()
        .position(|p| p.state().running == 1)
        .unwrap();
    let busy_addr = bed.pods[busy].addr.to_string();
    let mut shorts = Vec::new();
    for i in 0..4 {
        let (url, steer) = (envoy.url.clone(), busy_addr.clone());
        shorts.push(std::thread::spawn(move || {
            post(
                &url,
                &body("m", &format!("short {i}"), 100),
                &[(DEST, &steer)],
            )
        }));
        std::thread::sleep(Duration::from_millis(30));
    }
    let landed: Vec<String> = shorts
        .into_iter()
        .map(|t| {
            let a = t.join().unwrap();
            assert_eq!(a.status, 200);
            assert!(
                a.debug.contains(&a.pod_addr(bed)),
                "landed where the plugin chose: {} vs {}",
                a.pod,
                a.debug
            );
            a.pod
        })
        .collect();
    let a = long.join().unwrap();
    assert_eq!(a.status, 200);
    (format!("pod-{busy}"), landed)
}

impl Answer {
    fn pod_addr(&self, bed: &Bed) -> String {
        let i: usize = self
            .pod
            .trim_start_matches("pod-")
            .parse()
            .unwrap_or(usize::MAX);
        bed.pods
            .get(i)
            .map(|p| p.addr.to_string())
            .unwrap_or_default()
    }
}

#[test]
fn envoy_weighs_least_request_by_the_body_bytes_and_ignores_client_headers() {
    let bed = long_bed();
    let pods = bed.pod_addrs();
    let envoy = Envoy::start(&pods, &glr(&pods, json!({"costMode": "bytes"})));
    let (busy, landed) = big_then_small(&bed, &envoy, 200_000);
    // 200 KB in flight outweigh four short prompts: none joins it, whatever the client asks.
    assert!(landed.iter().all(|p| *p != busy), "{busy}: {landed:?}");
    assert_eq!(envoy.stat("ai_lb.glr.routed"), 5, "{}", envoy.logs());
    assert_eq!(envoy.stat("ai_lb.fallback.body_timeout"), 0);
    drop(envoy);

    // Counted by requests, the fourth short request ties and the fifth joins the big one: the
    // split above came from the body.
    let envoy = Envoy::start(&pods, &glr(&pods, json!({"costMode": "requests"})));
    let (busy, landed) = big_then_small(&bed, &envoy, 200_000);
    assert!(landed.contains(&busy), "{busy}: {landed:?}");
}

#[test]
fn envoy_endpoint_metrics_reads_the_model_for_lora_affinity() {
    let bed = Bed::new(3, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
        c.lora_adapters = vec!["a".into(), "b".into()];
        c.max_lora = Some(1);
    });
    let pods = bed.pod_addrs();
    let plugin = json!({"lb_policy": "endpoint_metrics", "lb_config": {
        "endpoints": pods, "scrapeCluster": SCRAPE_CLUSTER, "scrapeIntervalMs": 100,
        "scrapeTimeoutMs": 300, "loraAffinityThreshold": 1.0, "debugHeader": "x-ai-lb-debug"}});
    let envoy = Envoy::start(&pods, &plugin);
    // pod-1 runs adapter `a` (its one LoRA slot): sent to it directly, 10 s long.
    let direct = format!("http://{}", bed.pods[1].addr);
    std::thread::spawn(move || post(&direct, &body("a", "warm", 1000), &[]));
    assert!(wait_until(Duration::from_secs(5), || bed.pods[1]
        .state()
        .lora_running
        .contains(&"a".to_string())));
    let scrapes = envoy.stat("ai_lb.metrics.scrape_ok");
    assert!(
        wait_until(Duration::from_secs(10), || envoy
            .stat("ai_lb.metrics.scrape_ok")
            >= scrapes + 6),
        "{}",
        envoy.logs()
    );
    for i in 0..6 {
        let a = post(&envoy.url, &body("a", &format!("a {i}"), 2), &[]);
        assert_eq!((a.status, a.pod.as_str()), (200, "pod-1"), "{}", a.debug);
        // `b` cannot load on pod-1 (no free slot): it goes where it can.
        let b = post(&envoy.url, &body("b", &format!("b {i}"), 2), &[]);
        assert_eq!(b.status, 200);
        assert_ne!(b.pod, "pod-1", "{}", b.debug);
    }
    assert_eq!(envoy.stat("ai_lb.metrics.routed"), 12, "{}", envoy.logs());
}

#[test]
fn envoy_refuses_a_5mb_body_over_the_buffer_limit_or_balances_it_unread() {
    let bed = long_bed();
    let pods = bed.pod_addrs();
    let five_mb = body("m", &"x".repeat(5_000_000), 2);
    // Envoy's default 1 MiB buffer limit, maxBodyBytes 10 MiB: Envoy answers 413 at once.
    let envoy = Envoy::start(&pods, &glr(&pods, json!({"costMode": "bytes"})));
    let (status, took) = post_streaming(&envoy.url, five_mb.clone());
    assert_eq!(status, 413, "{}", envoy.logs());
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(post(&envoy.url, &body("m", "small", 2), &[]).status, 200);
    drop(envoy);

    // The route's body buffer two whole reads above maxBodyBytes: the plugin balances the body
    // without reading it and it streams on to the pod. A held body grows by whole reads, each
    // up to the listener's 1 MiB, before the plugin sees them (docs/higress-abi.md §10), so the
    // margin is counted in reads: with the listener's limit 1 MiB above maxBodyBytes instead,
    // one read of more than 1 MiB on a busy machine drew a 413 (2 runs in 8).
    let envoy = Envoy::start_body(
        &pods,
        &glr(
            &pods,
            json!({"costMode": "bytes", "maxBodyBytes": 1_048_576}),
        ),
        Body {
            route_body_limit: Some(3 << 20),
            ..Body::default()
        },
    );
    let a = post(&envoy.url, &five_mb, &[]);
    assert_eq!(
        a.status,
        200,
        "{}\n{}\n{}",
        a.error,
        envoy_answers(&envoy),
        envoy.logs()
    );
    assert!(a.took < Duration::from_secs(5), "{:?}", a.took);
    assert!(a.debug.contains("reason=least_request"), "{}", a.debug);
    assert_eq!(envoy.stat("ai_lb.fallback.body_too_large"), 1);
    assert_eq!(envoy.stat("ai_lb.fallback.body_timeout"), 0);
    let served: u64 = bed.pods.iter().map(|p| p.state().requests_total).sum();
    assert_eq!(served, 2, "the small request and the 5 MB one");
}

#[test]
fn envoy_without_the_flag_bounds_the_hold_then_stops_holding() {
    let bed = long_bed();
    let pods = bed.pod_addrs();
    let envoy = Envoy::start_body(
        &pods,
        &glr(&pods, json!({"costMode": "bytes", "maxBodyWaitMs": 300})),
        Body {
            stop_iteration: false,
            ..Body::default()
        },
    );
    let answers: Vec<Answer> = (0..10)
        .map(|i| post(&envoy.url, &body("m", &format!("hello {i}"), 2), &[]))
        .collect();
    for a in &answers {
        assert_eq!(a.status, 200, "{}", envoy.logs());
        assert!(a.took < Duration::from_secs(2), "{:?}", a.took);
        assert!(a.debug.contains("reason=least_request"), "{}", a.debug);
    }
    // Each worker that got a request held its first one for maxBodyWaitMs, saw its body
    // arrive at the release, and decided every later one at the headers.
    let detected = envoy.stat("ai_lb.body.withheld_detected");
    let timeouts = envoy.stat("ai_lb.fallback.body_timeout");
    let withheld = envoy.stat("ai_lb.fallback.body_withheld");
    assert!((1..=2).contains(&detected), "{detected}\n{}", envoy.logs());
    assert_eq!(timeouts, detected);
    assert_eq!(timeouts + withheld, 10);
    let slow = answers
        .iter()
        .filter(|a| a.took >= Duration::from_millis(250))
        .count() as i64;
    assert_eq!(slow, timeouts, "only the held ones waited");
    assert_eq!(envoy.stat("ai_lb.glr.routed"), 10);
    assert!(
        envoy
            .logs()
            .contains("lacks `allow_on_headers_stop_iteration: true`"),
        "{}",
        envoy.logs()
    );
}
