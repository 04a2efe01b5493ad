//! The plain-Envoy artifact in real Envoy 1.40: shipped configs validate; traffic follows the
//! scraped metrics through `override_host`; a client-sent destination header never steers;
//! garbage metrics and failed scrapes fall back to the cluster's policy; the per-proxy
//! least request spreads long requests.

use ailb_e2e::bed::{chat, Bed};
use ailb_e2e::envoy::{validate, Envoy, SCRAPE_CLUSTER};
use ailb_e2e::metrics::{busy_bed, land, preload};
use ailb_fakepod::MetricsSource;
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::time::Duration;

fn metrics_plugin(pods: &[String], extra: Value) -> Value {
    let mut lb = json!({"endpoints": pods, "scrapeCluster": SCRAPE_CLUSTER,
        "scrapeIntervalMs": 100, "scrapeTimeoutMs": 300});
    if let (Some(lb), Some(extra)) = (lb.as_object_mut(), extra.as_object()) {
        lb.extend(extra.clone());
    }
    json!({"lb_policy": "endpoint_metrics", "lb_config": lb})
}

#[test]
fn shipped_envoy_configs_validate() {
    let dir = ailb_e2e::repo_root().join("envoy");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            validate(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 1);
}

#[test]
fn envoy_routes_by_scraped_metrics_and_ignores_client_headers() {
    let bed = busy_bed();
    let pods = bed.pod_addrs();
    let envoy = Envoy::start(&pods, &metrics_plugin(&pods, json!({})));
    preload(&bed, 0, 6, 300);
    // Two rounds of scrapes of the 3 pods after pod-0 filled up: its queue is known.
    let scrapes = envoy.stat("ai_lb.metrics.scrape_ok");
    assert!(
        wait_until(Duration::from_secs(10), || envoy
            .stat("ai_lb.metrics.scrape_ok")
            >= scrapes + 6),
        "no scrapes: {}",
        envoy.logs()
    );
    let (landed, statuses) = land(&envoy.url, 10, &[]);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(landed.get("pod-0"), None, "landed: {landed:?}");
    // A client naming the busy pod does not get it.
    let busy = pods[0].clone();
    let (landed, statuses) = land(
        &envoy.url,
        6,
        &[("x-gateway-destination-endpoint", busy.as_str())],
    );
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(
        landed.get("pod-0"),
        None,
        "client header steered: {landed:?}"
    );
    assert!(envoy.stat("ai_lb.metrics.routed") >= 16, "{}", envoy.logs());
    // The scraper runs once per proxy, not once per worker VM: each answered scrape is parsed
    // once. Every usable answer was parsed; a scrape that failed without a 2xx answer (a
    // timeout, a failed dispatch) counts as failed with nothing parsed. One `/stats` read, so
    // the three agree while scrapes go on.
    let [parsed, ok, failed] = envoy.stats([
        "ai_lb.metrics.parsed",
        "ai_lb.metrics.scrape_ok",
        "ai_lb.metrics.scrape_failed",
    ]);
    assert!(
        ok <= parsed && parsed <= ok + failed,
        "parsed {parsed}, scrape_ok {ok}, scrape_failed {failed}"
    );
}

#[test]
fn envoy_falls_back_on_garbage_metrics_and_failed_scrapes() {
    let bed = Bed::new(3, |c| c.metrics = MetricsSource::Garbage);
    let pods = bed.pod_addrs();
    let envoy = Envoy::start(&pods, &metrics_plugin(&pods, json!({})));
    assert!(wait_until(Duration::from_secs(10), || envoy
        .stat("ai_lb.metrics.scrape_failed")
        >= 3));
    let (landed, statuses) = land(
        &envoy.url,
        9,
        &[("x-gateway-destination-endpoint", "127.0.0.1:1")],
    );
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(landed.len(), 3, "fallback policy spreads: {landed:?}");
    assert!(envoy.stat("ai_lb.fallback.no_metrics") >= 9);
    drop(envoy);

    // Nothing listens on the metrics port: every scrape fails, requests still flow.
    let bed = Bed::new(2, |_| {});
    let pods = bed.pod_addrs();
    let envoy = Envoy::start(
        &pods,
        &metrics_plugin(&pods, json!({"scrapePort": ailb_testkit::free_port()})),
    );
    assert!(wait_until(Duration::from_secs(10), || envoy
        .stat("ai_lb.metrics.scrape_failed")
        >= 2));
    let (_, statuses) = land(&envoy.url, 4, &[]);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(envoy.stat("ai_lb.metrics.scrape_ok"), 0);
}

#[test]
fn envoy_least_request_spreads_long_requests_per_proxy() {
    let bed = Bed::new(3, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    });
    let pods = bed.pod_addrs();
    let plugin = json!({"lb_policy": "global_least_request", "lb_config": {"endpoints": pods}});
    let envoy = Envoy::start(&pods, &plugin);
    let mut threads = Vec::new();
    for i in 0..9 {
        let url = envoy.url.clone();
        threads.push(std::thread::spawn(move || {
            chat(&url, &format!("long {i}"), 100)
        }));
        std::thread::sleep(Duration::from_millis(20));
    }
    for t in threads {
        assert_eq!(t.join().unwrap().0, 200);
    }
    let peaks = bed.peaks();
    assert_eq!(peaks, vec![3, 3, 3], "{}", envoy.logs());
    assert_eq!(envoy.stat("ai_lb.glr.routed"), 9);
}

#[test]
fn envoy_priority_classes_shed_the_lowest_class_first_with_retry_after() {
    // Per pod: sheddable up to 1 in flight, standard 2, critical 3 (docs/sessions-and-queues.md "Priority classes").
    let bed = Bed::new(2, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    });
    let pods = bed.pod_addrs();
    let plugin = json!({"lb_policy": "global_least_request", "lb_config": {"endpoints": pods,
        "maxRequestCount": 2, "priorityHeader": "x-priority", "criticalHeadroom": 1,
        "priorityReserve": 1}});
    let envoy = Envoy::start(&pods, &plugin);
    // Each request is sent once the one before it is routed or answered.
    let send = |class: &'static str| {
        let routed = envoy.stat("ai_lb.glr.routed");
        let url = envoy.url.clone();
        let t = std::thread::spawn(move || {
            let body = ailb_e2e::bed::chat_body(class, 400);
            let headers = [("content-type", "application/json"), ("x-priority", class)];
            let (status, hdrs, _) =
                ailb_e2e::gateway::http(&url, "POST", "/v1/chat/completions", &headers, &body)
                    .unwrap();
            let retry = hdrs
                .iter()
                .find(|(k, _)| k == "retry-after")
                .map(|(_, v)| v.clone());
            (status, retry)
        });
        wait_until(Duration::from_secs(5), || {
            t.is_finished() || envoy.stat("ai_lb.glr.routed") > routed
        });
        t
    };
    let order = [
        ("sheddable", 200),
        ("sheddable", 200),
        ("sheddable", 429),
        ("standard", 200),
        ("standard", 200),
        ("standard", 429),
        ("critical", 200),
        ("critical", 200),
        ("critical", 429),
    ];
    let threads: Vec<_> = order.iter().map(|(class, _)| send(class)).collect();
    for (t, (class, want)) in threads.into_iter().zip(order) {
        let (status, retry) = t.join().unwrap();
        assert_eq!(status, want, "{class}: {}", envoy.logs());
        let want_retry = (want == 429).then(|| "1".to_string());
        assert_eq!(retry, want_retry, "{class}");
    }
    assert_eq!(envoy.stat("ai_lb.priority.shed"), 3);
    assert_eq!(envoy.stat("ai_lb.priority.admitted_headroom"), 2);
    assert_eq!(envoy.stat("ai_lb.glr.routed"), 6);
}
