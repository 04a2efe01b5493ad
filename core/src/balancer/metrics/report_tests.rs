//! The defects of issue 11 item 4 and issue 39 items 1, 3 and 4 end to end through the
//! balancer on the mock host: each page is what the real server sends, and the pod it would
//! have made look idle is not picked; what the plugin counts and logs about it.

use crate::balancer::{Balancer, Verdict};
use crate::config::{Build, PluginConfig};
use crate::host::mock::MockHost;
use crate::host::{pairs, LogLevel};
use serde_json::json;

const CLUSTER: &str = "outbound|8000||llm.static";

fn vllm(waiting: &str) -> String {
    format!(
        "# TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} 4.0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} {waiting}\n\
         # TYPE vllm:engine_sleep_state gauge\n\
         vllm:engine_sleep_state{{engine=\"0\",model_name=\"m\",sleep_state=\"awake\"}} 1.0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} 0.3\n"
    )
}

/// A vLLM page of `len` bytes or more whose queue gauge comes after `len` bytes of histogram.
fn big_page_queue_last(len: usize, waiting: u32) -> String {
    let mut p = String::from(
        "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 4.0\n\
         vllm:engine_sleep_state{engine=\"0\",model_name=\"m\",sleep_state=\"awake\"} 1.0\n\
         vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.3\n",
    );
    let mut i = 0;
    while p.len() < len {
        p.push_str(&format!(
            "vllm:request_prompt_tokens_bucket{{engine=\"0\",le=\"{i}.0\",model_name=\"m\"}} {i}.0\n"
        ));
        i += 1;
    }
    p.push_str(&format!(
        "vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} {waiting}.0\n"
    ));
    p
}

fn balancer(build: Build, lb: serde_json::Value) -> (MockHost, Balancer) {
    let cfg = json!({"lb_policy": "endpoint_metrics", "lb_config": lb});
    let cfg = PluginConfig::parse_for(cfg.to_string().as_bytes(), build).unwrap();
    let mut host = MockHost::new().with_route("chat", CLUSTER);
    let engine = Balancer::configure(&mut host, cfg, 42, LogLevel::Info);
    (host, engine)
}

fn request(host: &mut MockHost, engine: &mut Balancer, ctx: u32) -> Option<String> {
    host.live_contexts.push(ctx);
    host.override_host = None;
    host.request_headers.clear();
    if engine.on_request_headers(host, ctx, false) == Verdict::Pause {
        host.body = br#"{"model":"m","messages":[]}"#.to_vec();
        let n = host.body.len();
        engine.on_request_body(host, ctx, n, true);
    }
    engine.on_done(host, ctx);
    host.override_host.clone().or_else(|| {
        host.request_headers
            .iter()
            .find(|(k, _)| k == "x-gateway-destination-endpoint")
            .map(|(_, v)| v.clone())
    })
}

/// One scrape round: every callout answered 200 with `bodies[addr]`.
fn scrape_round(host: &mut MockHost, engine: &mut Balancer, bodies: &[(&str, &str)]) {
    let before = host.http_calls.len();
    let first_token = host.next_token;
    host.now_ms += 1000;
    engine.on_tick(host);
    let calls = host.http_calls[before..].to_vec();
    for (i, (_, headers)) in calls.iter().enumerate() {
        let addr = &headers
            .iter()
            .find(|(k, _)| k == "x-envoy-original-dst-host")
            .unwrap()
            .1;
        let body = bodies.iter().find(|(a, _)| a == addr).unwrap().1;
        host.http_response = Some((Some(200), body.as_bytes().to_vec()));
        engine.on_http_response(host, first_token + 4 * i as u32, body.len());
        host.http_response = None;
    }
}

fn scraping(path: &str) -> (MockHost, Balancer) {
    balancer(
        Build::Envoy,
        json!({
            "endpoints": ["10.0.0.1:8000", "10.0.0.2:8000"],
            "scrapeCluster": "scrape",
            "scrapePath": path,
            "scrapeIntervalMs": 1000,
        }),
    )
}

fn warnings(host: &MockHost, needle: &str) -> usize {
    host.logs
        .borrow()
        .iter()
        .filter(|(l, m)| *l >= LogLevel::Info && m.contains(needle))
        .count()
}

fn hosts(list: &[(&str, &str)]) -> Vec<u8> {
    let json: Vec<(String, String)> = list
        .iter()
        .map(|(a, m)| {
            let v = json!({"health_status": "Healthy", "metrics": m}).to_string();
            (a.to_string(), v)
        })
        .collect();
    let refs: Vec<(&str, &str)> = json.iter().map(|(a, j)| (a.as_str(), j.as_str())).collect();
    pairs::encode(&refs)
}

#[test]
fn trtllm_serve_json_metrics_are_counted_and_the_right_path_named_once() {
    let (mut host, mut engine) = scraping("/metrics");
    let json = r#"[{"gpuMemUsage":76665782272,"iter":154,"kvCacheStats":{"maxNumBlocks":101256,"usedNumBlocks":3},"numActiveRequests":0,"numQueuedRequests":0}]"#;
    let busy = vllm("30.0");
    for _ in 0..3 {
        scrape_round(
            &mut host,
            &mut engine,
            &[("10.0.0.1:8000", json), ("10.0.0.2:8000", &busy)],
        );
    }
    assert_eq!(host.metric("ai_lb.metrics.not_prometheus"), 3);
    assert_eq!(host.metric("ai_lb.metrics.scrape_failed"), 3);
    assert_eq!(
        warnings(&host, "10.0.0.1:8000/metrics: JSON, not Prometheus text; trtllm-serve serves Prometheus text at /prometheus/metrics (set scrapePath)"),
        1,
        "{:?}",
        host.logs.borrow()
    );
    assert_eq!(
        request(&mut host, &mut engine, 1).as_deref(),
        Some("10.0.0.2:8000")
    );
    // Pointed at the right path, the pod's Prometheus text is read.
    let (mut host, mut engine) = scraping("/prometheus/metrics");
    let trtllm = "trtllm_num_requests_waiting 0\ntrtllm_num_requests_running 1\ntrtllm_kv_cache_utilization 0.1\n";
    scrape_round(
        &mut host,
        &mut engine,
        &[("10.0.0.1:8000", trtllm), ("10.0.0.2:8000", &busy)],
    );
    assert_eq!(host.metric("ai_lb.metrics.not_prometheus"), 0);
    // Plain Envoy: the pick first, the other known pods after it.
    assert_eq!(
        request(&mut host, &mut engine, 1).as_deref(),
        Some("10.0.0.1:8000,10.0.0.2:8000")
    );
}

/// The scraper reads 4 MiB; the rest of a bigger page, with the queue gauge, never arrives.
/// Before, the missing gauge read as 0 waiting and the busiest pod took every request.
#[test]
fn a_scrape_cut_at_four_mib_before_the_queue_gauge_is_unknown_not_idle() {
    let (mut host, mut engine) = scraping("/metrics");
    let huge = big_page_queue_last(4 << 20, 500);
    assert!(huge.len() > 4 << 20);
    let other = vllm("7.0");
    scrape_round(
        &mut host,
        &mut engine,
        &[("10.0.0.1:8000", &huge), ("10.0.0.2:8000", &other)],
    );
    assert_eq!(host.metric("ai_lb.metrics.truncated"), 1);
    assert_eq!(host.metric("ai_lb.metrics.unknown_value"), 1);
    assert_eq!(
        warnings(&host, "scrape of 10.0.0.1:8000/metrics: unknown vllm:num_requests_waiting page cut at the size limit: endpoint not a candidate"),
        1,
        "{:?}",
        host.logs.borrow()
    );
    for ctx in 1..=5 {
        assert_eq!(
            request(&mut host, &mut engine, ctx).as_deref(),
            Some("10.0.0.2:8000")
        );
    }
}

/// Higress keeps 64 KiB of a health-check body (docs/higress-abi.md §7).
#[test]
fn a_health_check_body_cut_at_64_kib_is_unknown_not_idle() {
    let (mut host, mut engine) = balancer(Build::Higress, json!({"hostListCacheMs": 0}));
    let page = big_page_queue_last(70_000, 500);
    let cut = &page[..crate::upstream::HOST_METRICS_LIMIT];
    host.hosts = hosts(&[("10.0.0.1:80", cut), ("10.0.0.2:80", &vllm("7.0"))]);
    for ctx in 1..=3 {
        assert_eq!(
            request(&mut host, &mut engine, ctx).as_deref(),
            Some("10.0.0.2:80")
        );
    }
    assert_eq!(host.metric("ai_lb.metrics.truncated"), 1, "parsed once");
    assert_eq!(
        warnings(
            &host,
            "health-check body of 10.0.0.1:80: unknown vllm:num_requests_waiting"
        ),
        1
    );
}

#[test]
fn nan_is_logged_once_per_pod_and_metric_and_counted_every_time() {
    let (mut host, mut engine) = scraping("/metrics");
    let (nan, ok) = (vllm("NaN"), vllm("7.0"));
    for _ in 0..4 {
        scrape_round(
            &mut host,
            &mut engine,
            &[("10.0.0.1:8000", &nan), ("10.0.0.2:8000", &ok)],
        );
    }
    assert_eq!(host.metric("ai_lb.metrics.unknown_value"), 4);
    let needle = "10.0.0.1:8000/metrics: unknown vllm:num_requests_waiting NaN or Inf";
    assert_eq!(warnings(&host, needle), 1);
    assert_eq!(
        request(&mut host, &mut engine, 1).as_deref(),
        Some("10.0.0.2:8000")
    );
    // A clean page in between: a recurrence is news again.
    scrape_round(
        &mut host,
        &mut engine,
        &[("10.0.0.1:8000", &ok), ("10.0.0.2:8000", &ok)],
    );
    scrape_round(
        &mut host,
        &mut engine,
        &[("10.0.0.1:8000", &nan), ("10.0.0.2:8000", &ok)],
    );
    assert_eq!(warnings(&host, needle), 2);
}

#[test]
fn a_sleeping_vllm_pod_gets_nothing() {
    let (mut host, mut engine) = balancer(Build::Higress, json!({"hostListCacheMs": 0}));
    let asleep = vllm("0.0").replace("sleep_state=\"awake\"} 1.0", "sleep_state=\"awake\"} 0.0");
    host.hosts = hosts(&[("10.0.0.1:80", &asleep), ("10.0.0.2:80", &vllm("9.0"))]);
    for ctx in 1..=3 {
        assert_eq!(
            request(&mut host, &mut engine, ctx).as_deref(),
            Some("10.0.0.2:80")
        );
    }
    assert_eq!(
        warnings(
            &host,
            "health-check body of 10.0.0.1:80: vllm:engine_sleep_state says asleep"
        ),
        1
    );
}

/// Issue 39 item 1: engine 1's queue line is damaged (a proxy cut its closing quote). Before,
/// the line was dropped without a word and the pod read 2 queued instead of 42: it took every
/// pick. Now the pod is unknown, every bad line is counted, and it is logged once per pod.
#[test]
fn a_malformed_queue_line_is_counted_logged_once_and_never_idle() {
    let (mut host, mut engine) = scraping("/metrics");
    let damaged = format!(
        "{}vllm:num_requests_waiting{{engine=\"1\",model_name=\"m}} 40.0\n\
         vllm:num_requests_running{{engine=\"1\",model_name=\"m\"}} 4.0 x\n",
        vllm("2.0")
    );
    let other = vllm("7.0");
    for _ in 0..3 {
        scrape_round(
            &mut host,
            &mut engine,
            &[("10.0.0.1:8000", &damaged), ("10.0.0.2:8000", &other)],
        );
    }
    assert_eq!(
        host.metric("ai_lb.metrics.malformed"),
        6,
        "two lines, three scrapes"
    );
    let needle = "scrape of 10.0.0.1:8000/metrics: unknown vllm:num_requests_waiting a malformed line, vllm:num_requests_running a malformed line: endpoint not a candidate";
    assert_eq!(warnings(&host, needle), 1, "{:?}", host.logs.borrow());
    assert_eq!(
        warnings(
            &host,
            "2 malformed line(s), the first at line 9: UnterminatedLabelValue"
        ),
        1
    );
    for ctx in 1..=4 {
        assert_eq!(
            request(&mut host, &mut engine, ctx).as_deref(),
            Some("10.0.0.2:8000")
        );
    }
}

/// Issue 39 item 3: a vLLM 0.10 page (no `engine_sleep_state`) that Higress cut at 64 KiB
/// cannot prove the family absent, so the pod is unknown: that is said once per pod, with
/// the page size and the fix. Before, only the unknown family was named.
#[test]
fn a_cut_health_check_page_names_its_size_and_the_scraper() {
    let (mut host, mut engine) = balancer(Build::Higress, json!({"hostListCacheMs": 0}));
    let page = |running: u32| {
        let mut p = format!(
            "vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} {running}.0\n\
             vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} 0.0\n\
             vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} 0.1\n"
        );
        let mut i = 0;
        while p.len() < 70_000 {
            p.push_str(&format!("vllm:e2e_bucket{{le=\"{i}.0\"}} {i}.0\n"));
            i += 1;
        }
        p.truncate(crate::upstream::HOST_METRICS_LIMIT);
        p
    };
    for running in 1..=3 {
        let cut = page(running);
        host.hosts = hosts(&[("10.0.0.1:80", &cut), ("10.0.0.2:80", &vllm("9.0"))]);
        assert_eq!(
            request(&mut host, &mut engine, running).as_deref(),
            Some("10.0.0.2:80")
        );
    }
    assert_eq!(host.metric("ai_lb.metrics.truncated"), 3);
    let needle = "health-check body of 10.0.0.1:80: unknown vllm:engine_sleep_state page cut at the size limit: endpoint not a candidate until a whole, valid page; Higress keeps the first 64 KiB of a health-check body (65536 bytes here)";
    assert_eq!(warnings(&host, needle), 1, "{:?}", host.logs.borrow());
    assert_eq!(warnings(&host, "metricsSource: scrape"), 1);
}

/// Issue 39 item 4: a page cut before any family of a known engine (a proxy's own metrics
/// first) is said, not silently unknown.
#[test]
fn a_page_cut_before_any_known_family_is_logged() {
    let (mut host, mut engine) = balancer(Build::Higress, json!({"hostListCacheMs": 0}));
    let mut page = String::new();
    let mut i = 0;
    while page.len() < 70_000 {
        page.push_str(&format!("envoy_cluster_upstream_rq{{n=\"{i}\"}} {i}\n"));
        i += 1;
    }
    page.push_str(&vllm("0.0"));
    page.truncate(crate::upstream::HOST_METRICS_LIMIT);
    host.hosts = hosts(&[("10.0.0.1:80", &page), ("10.0.0.2:80", &vllm("9.0"))]);
    assert_eq!(
        request(&mut host, &mut engine, 1).as_deref(),
        Some("10.0.0.2:80")
    );
    assert_eq!(
        warnings(
            &host,
            "health-check body of 10.0.0.1:80: cut before any family of a known engine: endpoint unknown; Higress keeps the first 64 KiB"
        ),
        1,
        "{:?}",
        host.logs.borrow()
    );
}
