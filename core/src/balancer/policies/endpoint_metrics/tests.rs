//! endpoint_metrics against the mock host: host-provided metrics, the scraper and its shared
//! snapshot, staleness, shedding, in-flight correction, rate_limit, the plain-Envoy header.

use crate::balancer::{Balancer, Verdict};
use crate::config::{Build, PluginConfig};
use crate::host::mock::MockHost;
use crate::host::{pairs, LogLevel};
use serde_json::json;

const CLUSTER: &str = "outbound|8000||llm.static";

pub(crate) fn vllm(waiting: u32, running: u32, kv: f64) -> String {
    format!(
        "# TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\n\
         vllm:num_requests_running{{model_name=\"m\"}} {running}\n\
         vllm:gpu_cache_usage_perc{{model_name=\"m\"}} {kv}\n"
    )
}

fn hosts_with_metrics(list: &[(&str, &str, &str)]) -> Vec<u8> {
    let json: Vec<(String, String)> = list
        .iter()
        .map(|(a, h, m)| {
            (
                a.to_string(),
                json!({"health_status": h, "metrics": m}).to_string(),
            )
        })
        .collect();
    let refs: Vec<(&str, &str)> = json.iter().map(|(a, j)| (a.as_str(), j.as_str())).collect();
    pairs::encode(&refs)
}

/// Higress build; the host list is read on every request unless the test sets the cache.
fn higress(mut lb: serde_json::Value) -> (MockHost, Balancer) {
    if lb.get("hostListCacheMs").is_none() {
        lb["hostListCacheMs"] = json!(0);
    }
    let cfg = json!({"lb_policy": "endpoint_metrics", "lb_config": lb});
    let cfg = PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Higress).unwrap();
    let mut host = MockHost::new().with_route("chat", CLUSTER);
    let engine = Balancer::configure(&mut host, cfg, 42, LogLevel::Trace);
    (host, engine)
}

fn envoy(lb: serde_json::Value) -> (MockHost, Balancer) {
    let cfg = json!({"lb_policy": "endpoint_metrics", "lb_config": lb});
    envoy_cfg(cfg)
}

fn envoy_cfg(cfg: serde_json::Value) -> (MockHost, Balancer) {
    let cfg = PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Envoy).unwrap();
    let mut host = MockHost::new();
    let engine = Balancer::configure(&mut host, cfg, 42, LogLevel::Trace);
    (host, engine)
}

/// A request with a small body (Higress) or headers only (Envoy); returns the verdict.
fn request(host: &mut MockHost, engine: &mut Balancer, ctx: u32) -> Verdict {
    host.live_contexts.push(ctx);
    host.override_host = None;
    let v = engine.on_request_headers(host, ctx, false);
    if v == Verdict::Pause
        && engine
            .requests
            .get(&ctx)
            .is_some_and(|r| !r.config.decide_at_headers)
    {
        host.body = br#"{"model":"m","messages":[]}"#.to_vec();
        let n = host.body.len();
        return engine.on_request_body(host, ctx, n, true);
    }
    v
}

fn dest(host: &MockHost) -> Option<String> {
    host.request_headers
        .iter()
        .find(|(k, _)| k == "x-gateway-destination-endpoint")
        .map(|(_, v)| v.clone())
}

#[test]
fn host_metrics_pick_the_short_queue_and_parse_once_per_change() {
    let (mut host, mut engine) = higress(json!({}));
    host.hosts = hosts_with_metrics(&[
        ("10.0.0.1:80", "Healthy", &vllm(9, 4, 0.5)),
        ("10.0.0.2:80", "Healthy", &vllm(0, 4, 0.5)),
        ("10.0.0.3:80", "Unhealthy", &vllm(0, 0, 0.0)),
    ]);
    for ctx in 1..=3 {
        assert_eq!(request(&mut host, &mut engine, ctx), Verdict::Continue);
        assert_eq!(host.override_host.as_deref(), Some("10.0.0.2:80"));
        engine.on_done(&mut host, ctx);
    }
    assert_eq!(host.metric("ai_lb.metrics.routed"), 3);
    assert_eq!(
        host.metric("ai_lb.metrics.parsed"),
        2,
        "parsed once per host text"
    );
    // The text changes: parsed again, once, and the decision follows it.
    host.hosts = hosts_with_metrics(&[
        ("10.0.0.1:80", "Healthy", &vllm(0, 0, 0.1)),
        ("10.0.0.2:80", "Healthy", &vllm(30, 4, 0.9)),
    ]);
    for ctx in 4..=6 {
        request(&mut host, &mut engine, ctx);
        assert_eq!(host.override_host.as_deref(), Some("10.0.0.1:80"));
    }
    assert_eq!(host.metric("ai_lb.metrics.parsed"), 4);
    assert_eq!(engine.tracked().1, 0);
}

#[test]
fn host_list_is_reread_at_most_every_host_list_cache_ms() {
    let (mut host, mut engine) = higress(json!({"hostListCacheMs": 100}));
    host.hosts = hosts_with_metrics(&[("10.0.0.1:80", "Healthy", &vllm(0, 0, 0.1))]);
    request(&mut host, &mut engine, 1);
    assert_eq!(host.override_host.as_deref(), Some("10.0.0.1:80"));
    host.hosts = hosts_with_metrics(&[("10.0.0.2:80", "Healthy", &vllm(0, 0, 0.1))]);
    host.now_ms += 50;
    request(&mut host, &mut engine, 2);
    assert_eq!(
        host.override_host.as_deref(),
        Some("10.0.0.1:80"),
        "cached list"
    );
    host.now_ms += 50;
    request(&mut host, &mut engine, 3);
    assert_eq!(
        host.override_host.as_deref(),
        Some("10.0.0.2:80"),
        "re-read"
    );
    assert_eq!(host.metric("ai_lb.metrics.parsed"), 2);
}

#[test]
fn no_metrics_anywhere_falls_back_and_garbage_counts_as_unknown() {
    let (mut host, mut engine) = higress(json!({}));
    host.hosts = hosts_with_metrics(&[
        ("10.0.0.1:80", "Healthy", ""),
        ("10.0.0.2:80", "Healthy", "garbage {{{ \n not prometheus"),
    ]);
    assert_eq!(request(&mut host, &mut engine, 1), Verdict::Continue);
    assert_eq!(host.override_host, None);
    assert_eq!(host.metric("ai_lb.fallback.no_metrics"), 1);
    assert_eq!(host.metric("ai_lb.metrics.fallback"), 1);
    // One pod with metrics: it takes the request, the unknown one is skipped.
    host.hosts = hosts_with_metrics(&[
        ("10.0.0.1:80", "Healthy", &vllm(50, 8, 0.9)),
        ("10.0.0.2:80", "Healthy", "garbage"),
    ]);
    request(&mut host, &mut engine, 2);
    assert_eq!(host.override_host.as_deref(), Some("10.0.0.1:80"));
    // No healthy host.
    host.hosts = hosts_with_metrics(&[("10.0.0.1:80", "Unhealthy", &vllm(0, 0, 0.0))]);
    request(&mut host, &mut engine, 3);
    assert_eq!(host.metric("ai_lb.fallback.no_healthy_endpoint"), 1);
}

#[test]
fn in_flight_correction_spreads_a_burst_between_host_updates() {
    let (mut host, mut engine) = higress(json!({}));
    host.hosts = hosts_with_metrics(&[
        ("10.0.0.1:80", "Healthy", &vllm(0, 2, 0.2)),
        ("10.0.0.2:80", "Healthy", &vllm(3, 2, 0.2)),
    ]);
    let mut counts = [0; 2];
    for ctx in 1..=20 {
        request(&mut host, &mut engine, ctx);
        match host.override_host.as_deref() {
            Some("10.0.0.1:80") => counts[0] += 1,
            Some("10.0.0.2:80") => counts[1] += 1,
            other => panic!("{other:?}"),
        }
    }
    // Without the correction all 20 would go to the idle pod; with it, pod 1 gets the first
    // 3 or so and then they alternate.
    assert!(counts[0] >= 10 && counts[1] >= 7, "{counts:?}");
    let sent = host.shared.borrow().get("ailb.sent").cloned().unwrap().0;
    assert_eq!(
        String::from_utf8(sent).unwrap(),
        format!("10.0.0.1:80 {}\n10.0.0.2:80 {}\n", counts[0], counts[1])
    );
}

#[test]
fn sheddable_requests_get_429_when_every_pod_is_saturated() {
    let (mut host, mut engine) = higress(json!({"sheddableModels": ["batch"]}));
    host.hosts = hosts_with_metrics(&[
        ("10.0.0.1:80", "Healthy", &vllm(9, 8, 0.5)),
        ("10.0.0.2:80", "Healthy", &vllm(1, 8, 0.95)),
    ]);
    host.request_headers = vec![("x-ai-lb-criticality".into(), "sheddable".into())];
    assert_eq!(request(&mut host, &mut engine, 1), Verdict::Pause);
    assert_eq!(host.local_responses, vec![(429, "ai_lb_shed".to_string())]);
    assert_eq!(host.metric("ai_lb.metrics.rejected_429"), 1);
    // Critical requests are never shed.
    host.request_headers.clear();
    assert_eq!(request(&mut host, &mut engine, 2), Verdict::Continue);
    assert!(host.override_host.is_some());
    // A sheddable model (from the body) is shed too.
    host.live_contexts.push(3);
    engine.on_request_headers(&mut host, 3, false);
    host.body = br#"{"model":"batch"}"#.to_vec();
    let n = host.body.len();
    engine.on_request_body(&mut host, 3, n, true);
    assert_eq!(host.local_responses.len(), 2);
}

#[test]
fn the_lowest_priority_class_is_shed_by_engine_metrics_with_retry_after() {
    let (mut host, mut engine) =
        higress(json!({"maxRequestCount": 4, "priorityHeader": "x-priority"}));
    host.hosts = hosts_with_metrics(&[
        ("10.0.0.1:80", "Healthy", &vllm(9, 8, 0.5)),
        ("10.0.0.2:80", "Healthy", &vllm(1, 8, 0.95)),
    ]);
    host.request_headers = vec![("x-priority".into(), "Sheddable".into())];
    assert_eq!(request(&mut host, &mut engine, 1), Verdict::Pause);
    assert_eq!(
        host.local_responses,
        vec![(429, "ai_lb_shed_priority".to_string())]
    );
    assert_eq!(
        host.local_response_headers[0],
        vec![("retry-after".to_string(), "1".to_string())]
    );
    assert_eq!(host.metric("ai_lb.priority.shed"), 1);
    // Standard (the default) and critical are not shed by the metrics; an unknown value is
    // the default class, counted.
    for (ctx, value) in [(2, "standard"), (3, "critical"), (4, "nonsense")] {
        host.request_headers = vec![("x-priority".into(), value.into())];
        assert_eq!(
            request(&mut host, &mut engine, ctx),
            Verdict::Continue,
            "{value}"
        );
    }
    assert_eq!(host.local_responses.len(), 1);
    assert_eq!(host.metric("ai_lb.priority.unknown_class"), 1);
}

#[test]
fn rate_limit_is_kept_per_proxy_in_shared_data() {
    let (mut host, mut engine) = higress(
        json!({"rate_limit": 0.5, "metric_policy": "least", "target_metric": "vllm:gpu_cache_usage_perc"}),
    );
    host.hosts = hosts_with_metrics(&[
        ("10.0.0.1:80", "Healthy", &vllm(0, 0, 0.0)),
        ("10.0.0.2:80", "Healthy", &vllm(0, 0, 0.9)),
    ]);
    // A second VM of the same proxy shares the window.
    let mut host2 = MockHost::new().with_route("chat", CLUSTER);
    host2.shared = host.shared.clone();
    host2.hosts = host.hosts.clone();
    let cfg = json!({"lb_policy": "endpoint_metrics", "lb_config": {"rate_limit": 0.5, "metric_policy": "least", "target_metric": "vllm:gpu_cache_usage_perc"}});
    let cfg = PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Higress).unwrap();
    let mut engine2 = Balancer::configure(&mut host2, cfg, 7, LogLevel::Trace);
    let mut to_first = 0;
    for ctx in 1..=100 {
        let (h, e) = if ctx % 2 == 0 {
            (&mut host, &mut engine)
        } else {
            (&mut host2, &mut engine2)
        };
        request(h, e, ctx);
        to_first += usize::from(h.override_host.as_deref() == Some("10.0.0.1:80"));
    }
    assert!((45..=60).contains(&to_first), "{to_first}");
    assert!(
        host.metric("ai_lb.metrics.rate_limited") + host2.metric("ai_lb.metrics.rate_limited") > 30
    );
}

fn scrape_cfg() -> serde_json::Value {
    json!({
        "endpoints": ["10.0.0.2:8000", "10.0.0.1:8000", "10.0.0.3:8000"],
        "scrapeCluster": "scrape",
        "scrapeIntervalMs": 1000,
        "metricsMaxAgeMs": 3000,
    })
}

fn answer(host: &mut MockHost, engine: &mut Balancer, token: u32, status: Option<u16>, body: &str) {
    host.http_response = Some((status, body.as_bytes().to_vec()));
    engine.on_http_response(host, token, body.len());
    host.http_response = None;
}

/// Ticks and answers every callout with `texts[addr]`; returns the tokens by address.
pub(crate) fn scrape_round(
    host: &mut MockHost,
    engine: &mut Balancer,
    texts: &[(&str, Option<u16>, String)],
) {
    let before = host.http_calls.len();
    let first_token = host.next_token;
    engine.on_tick(host);
    let calls: Vec<_> = host.http_calls[before..].to_vec();
    for (i, (_, headers)) in calls.iter().enumerate() {
        let addr = headers
            .iter()
            .find(|(k, _)| k == "x-envoy-original-dst-host")
            .map(|(_, v)| v.clone())
            .unwrap();
        let token = first_token + 4 * i as u32;
        if let Some((_, status, body)) = texts.iter().find(|(a, _, _)| *a == addr) {
            answer(host, engine, token, *status, body);
        }
    }
}

#[test]
fn scraper_takes_the_lease_dispatches_and_shares_the_snapshot() {
    let (mut host, mut engine) = envoy(scrape_cfg());
    // The body deadline's tick (a tenth of maxBodyWaitMs) is shorter than the scrape
    // interval; the scraper scrapes only when due.
    assert_eq!(host.tick_ms, Some(100));
    engine.on_tick(&mut host);
    assert_eq!(host.http_calls.len(), 3);
    let (cluster, headers) = &host.http_calls[0];
    assert_eq!(cluster, "scrape");
    for (k, v) in [
        (":method", "GET"),
        (":path", "/metrics"),
        (":authority", "10.0.0.1:8000"),
        ("x-envoy-original-dst-host", "10.0.0.1:8000"),
    ] {
        assert!(
            headers.contains(&(k.to_string(), v.to_string())),
            "{k} in {headers:?}"
        );
    }
    // A pod still in flight is not scraped again on the next tick.
    host.now_ms += 1000;
    engine.on_tick(&mut host);
    assert_eq!(host.http_calls.len(), 3);
    answer(&mut host, &mut engine, 7, Some(200), &vllm(5, 8, 0.5));
    answer(&mut host, &mut engine, 11, Some(200), &vllm(0, 2, 0.1));
    answer(&mut host, &mut engine, 15, Some(200), &vllm(2, 8, 0.3));
    assert_eq!(host.metric("ai_lb.metrics.scrape_ok"), 3);
    assert_eq!(host.metric("ai_lb.metrics.parsed"), 3);

    // A second VM of the same proxy: no lease, no scraping, same snapshot.
    let mut host2 = MockHost::new();
    host2.shared = host.shared.clone();
    host2.now_ms = host.now_ms;
    let cfg = PluginConfig::parse_for(
        json!({"lb_policy": "endpoint_metrics", "lb_config": scrape_cfg()})
            .to_string()
            .as_bytes(),
        Build::Envoy,
    )
    .unwrap();
    let mut engine2 = Balancer::configure(&mut host2, cfg, 9, LogLevel::Trace);
    engine2.on_tick(&mut host2);
    assert!(host2.http_calls.is_empty(), "only the lease holder scrapes");
    // A client-sent destination header never survives.
    host2.request_headers = vec![("x-gateway-destination-endpoint".into(), "6.6.6.6:1".into())];
    assert_eq!(request(&mut host2, &mut engine2, 1), Verdict::Continue);
    assert_eq!(
        dest(&host2).as_deref(),
        Some("10.0.0.2:8000,10.0.0.3:8000,10.0.0.1:8000")
    );
    assert_eq!(
        host2.metric("ai_lb.metrics.parsed"),
        0,
        "workers never parse"
    );
    // The lease holder stops ticking: its lease expires and the other VM takes over.
    host2.now_ms += 4000;
    engine2.on_tick(&mut host2);
    assert_eq!(host2.http_calls.len(), 3);
}

#[test]
fn stale_failed_and_garbage_scrapes_make_pods_unknown() {
    let (mut host, mut engine) = envoy(scrape_cfg());
    scrape_round(
        &mut host,
        &mut engine,
        &[
            ("10.0.0.1:8000", Some(500), "oops".into()),
            ("10.0.0.2:8000", Some(200), "garbage\x00\x01 {{{".into()),
            ("10.0.0.3:8000", Some(200), vllm(40, 8, 0.9)),
        ],
    );
    assert_eq!(host.metric("ai_lb.metrics.scrape_failed"), 2);
    request(&mut host, &mut engine, 1);
    assert_eq!(
        dest(&host).as_deref(),
        Some("10.0.0.3:8000"),
        "only the pod with metrics"
    );
    // Timeout (no status): unknown too; nobody known any more → no header (fallback policy).
    host.now_ms += 1000;
    scrape_round(
        &mut host,
        &mut engine,
        &[("10.0.0.3:8000", None, String::new())],
    );
    host.request_headers.clear();
    request(&mut host, &mut engine, 2);
    assert_eq!(dest(&host), None);
    assert_eq!(host.metric("ai_lb.fallback.no_metrics"), 1);
    // Fresh metrics, then the scraper stops: after metricsMaxAgeMs they count as unknown.
    host.now_ms += 1000;
    scrape_round(
        &mut host,
        &mut engine,
        &[
            ("10.0.0.1:8000", Some(200), vllm(0, 1, 0.1)),
            ("10.0.0.2:8000", Some(200), vllm(0, 1, 0.1)),
            ("10.0.0.3:8000", Some(200), vllm(0, 1, 0.1)),
        ],
    );
    host.request_headers.clear();
    request(&mut host, &mut engine, 3);
    assert!(dest(&host).is_some());
    host.now_ms += 3001;
    host.request_headers.clear();
    request(&mut host, &mut engine, 4);
    assert_eq!(dest(&host), None);
    assert_eq!(host.metric("ai_lb.fallback.no_metrics"), 2);
    // A callout the host refuses is a failure, not a stuck pod.
    host.http_call_fails = true;
    engine.on_tick(&mut host);
    assert_eq!(host.metric("ai_lb.metrics.scrape_failed"), 6);
}

#[test]
fn envoy_least_request_counts_per_proxy_and_releases_at_stream_end() {
    let cfg = json!({"lb_policy": "global_least_request", "lb_config": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"], "maxRequestCount": 2, "fallbackCount": 1}});
    let (mut host, mut engine) = envoy_cfg(cfg);
    let mut seen = Vec::new();
    for ctx in 1..=4 {
        host.request_headers = vec![("x-gateway-destination-endpoint".into(), "1.2.3.4:5".into())];
        assert_eq!(request(&mut host, &mut engine, ctx), Verdict::Continue);
        seen.push(dest(&host).unwrap());
    }
    let firsts: Vec<&str> = seen.iter().map(|s| s.split(',').next().unwrap()).collect();
    assert_eq!(
        firsts.iter().filter(|a| **a == "10.0.0.1:80").count(),
        2,
        "{seen:?}"
    );
    assert!(seen
        .iter()
        .all(|s| s.split(',').count() == 2 && !s.contains("1.2.3.4")));
    // Both at the cap: 429.
    host.request_headers.clear();
    assert_eq!(request(&mut host, &mut engine, 5), Verdict::Pause);
    assert_eq!(
        host.local_responses,
        vec![(429, "ai_lb_max_request_count".to_string())]
    );
    for ctx in 1..=5 {
        engine.on_done(&mut host, ctx);
    }
    let counts = host.shared.borrow().values().next().cloned().unwrap().0;
    assert_eq!(
        String::from_utf8(counts).unwrap(),
        "10.0.0.1:80 0\n10.0.0.2:80 0\n"
    );
    assert_eq!(engine.tracked(), (0, 0));
}

#[test]
fn config_keys_defaults_and_errors() {
    let g = |lb: serde_json::Value, build: Build| {
        PluginConfig::parse_for(
            json!({"lb_policy": "endpoint_metrics", "lb_config": lb})
                .to_string()
                .as_bytes(),
            build,
        )
    };
    let c = g(json!({}), Build::Higress).unwrap();
    let r = c.global.unwrap();
    let m = r.policy.metrics().unwrap();
    assert_eq!(m.source, crate::config::MetricsSource::Host);
    assert_eq!(
        m.scheduler,
        crate::model_metrics::SchedulerConfig::default()
    );
    assert_eq!(m.criticality_header, "x-ai-lb-criticality");
    assert!(r.redis.is_none());
    let c = g(
        json!({"endpoints": ["10.0.0.1:1"], "scrapeCluster": "c"}),
        Build::Envoy,
    )
    .unwrap();
    let r = c.global.unwrap();
    let s = r.policy.metrics().unwrap().scrape.clone().unwrap();
    assert_eq!(
        (s.path.as_str(), s.interval_ms, s.timeout_ms, s.max_age_ms),
        ("/metrics", 500, 400, 5000)
    );
    assert_eq!(s.host_header, "x-envoy-original-dst-host");
    assert!(
        !r.decide_at_headers,
        "the model (LoRA affinity) is in the body"
    );
    assert_eq!(
        r.publish,
        crate::config::Publish::Header {
            name: "x-gateway-destination-endpoint".into(),
            fallbacks: 2
        }
    );
    let alias =
        PluginConfig::parse_for(br#"{"lb_policy":"metrics_based"}"#, Build::Higress).unwrap();
    assert_eq!(
        alias.global.unwrap().policy.kind(),
        crate::config::Policy::EndpointMetrics
    );
    let e = crate::config::Build::Envoy;
    let h = crate::config::Build::Higress;
    for (lb, build, field) in [
        (json!({"kvCacheThreshold": 2}), h, "kvCacheThreshold"),
        (
            json!({"queueThresholdCritical": -1}),
            h,
            "queueThresholdCritical",
        ),
        (
            json!({"loraAffinityThreshold": "x"}),
            h,
            "loraAffinityThreshold",
        ),
        (
            json!({"queueingThresholdLora": -3}),
            h,
            "queueingThresholdLora",
        ),
        (json!({"weights": {"queue": 1, "gpu": 2}}), h, "weights.gpu"),
        (
            json!({"weights": {"queue": 0, "kv": 0}}),
            h,
            "weights.queue",
        ),
        (json!({"weights": 3}), h, "weights"),
        (json!({"maxRunningHint": 0}), h, "maxRunningHint"),
        (json!({"metricsSource": "redis"}), h, "metricsSource"),
        (json!({"metricsSource": "scrape"}), h, "scrapeCluster"),
        (
            json!({"metricsSource": "scrape", "scrapeCluster": "c", "scrapePath": "metrics"}),
            h,
            "scrapePath",
        ),
        (
            json!({"metricsSource": "scrape", "scrapeCluster": "c", "scrapePort": 0}),
            h,
            "scrapePort",
        ),
        (
            json!({"metricsSource": "scrape", "scrapeCluster": "c", "scrapeHostHeader": "a b"}),
            h,
            "scrapeHostHeader",
        ),
        (
            json!({"metricsSource": "scrape", "scrapeCluster": "c", "scrapeIntervalMs": 10}),
            h,
            "scrapeIntervalMs",
        ),
        (
            json!({"metricsSource": "scrape", "scrapeCluster": "c", "scrapeTimeoutMs": 1}),
            h,
            "scrapeTimeoutMs",
        ),
        (
            json!({"metricsSource": "scrape", "scrapeCluster": "c", "metricsMaxAgeMs": 100}),
            h,
            "metricsMaxAgeMs",
        ),
        (json!({"criticalityHeader": ""}), h, "criticalityHeader"),
        (json!({"sheddableModels": "m"}), h, "sheddableModels"),
        (json!({"endpoints": ["10.0.0.1:80"]}), h, "endpoints"),
        (json!({"destinationHeader": "x"}), h, "destinationHeader"),
        (json!({"scrapeCluster": "c"}), e, "endpoints"),
        (
            json!({"endpoints": ["localhost:80"], "scrapeCluster": "c"}),
            e,
            "endpoints[0]",
        ),
        (
            json!({"endpoints": ["10.0.0.1:0"], "scrapeCluster": "c"}),
            e,
            "endpoints[0]",
        ),
        (
            json!({"endpoints": ["10.0.0.1:80"], "metricsSource": "host"}),
            e,
            "metricsSource",
        ),
        (
            json!({"endpoints": ["10.0.0.1:80"], "scrapeCluster": "c", "destinationHeader": "a:b"}),
            e,
            "destinationHeader",
        ),
        (
            json!({"endpoints": ["10.0.0.1:80"], "scrapeCluster": "c", "fallbackCount": 17}),
            e,
            "fallbackCount",
        ),
    ] {
        let err = g(lb.clone(), build).expect_err(&lb.to_string()).to_string();
        assert!(err.contains(&format!("lb_config.{field}")), "{lb}: {err}");
    }
    // What Higress's Go plugin accepts is accepted with one warning naming the field
    // (issue 9; docs/compatibility.md).
    for (lb, field) in [
        (json!({"metric_policy": "fastest"}), "metric_policy"),
        (json!({"metric_policy": "least"}), "metric_policy"),
        (
            json!({"metric_policy": "most", "target_metric": "not a name"}),
            "metric_policy",
        ),
        (json!({"rate_limit": 0}), "rate_limit"),
        (json!({"rate_limit": 1.5}), "rate_limit"),
        (json!({"serviceFQDN": "redis.static"}), "serviceFQDN"),
        (json!({"unknownKey": 1}), "unknownKey"),
    ] {
        let json = json!({"lb_policy": "endpoint_metrics", "lb_config": lb}).to_string();
        let parsed = crate::config::parse(json.as_bytes(), h).expect(&json);
        assert!(
            parsed
                .warnings
                .iter()
                .any(|w| w.path == format!("lb_config.{field}")),
            "{json}: {:?}",
            parsed.warnings
        );
    }
    // Redis is refused by the plain-Envoy least request.
    let err = PluginConfig::parse_for(
        br#"{"lb_policy":"global_least_request","lb_config":{"endpoints":["10.0.0.1:80"],"serviceFQDN":"r","servicePort":1}}"#,
        Build::Envoy,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("serviceFQDN"), "{err}");
}

#[test]
fn a_round_of_answers_is_published_once_and_a_failure_at_once() {
    let (mut host, mut engine) = envoy(scrape_cfg());
    let snapshot_version = |host: &MockHost| {
        let shared = host.shared.borrow();
        shared
            .iter()
            .find(|(k, _)| k.starts_with("ailb.snap."))
            .map_or(0, |(_, v)| v.1)
    };
    let ok = |a: &str| (a.to_string(), Some(200), vllm(0, 1, 0.1));
    let round = |host: &mut MockHost,
                 engine: &mut Balancer,
                 answers: Vec<(String, Option<u16>, String)>| {
        let refs: Vec<(&str, Option<u16>, String)> = answers
            .iter()
            .map(|(a, s, b)| (a.as_str(), *s, b.clone()))
            .collect();
        scrape_round(host, engine, &refs);
    };
    round(
        &mut host,
        &mut engine,
        vec![
            ok("10.0.0.1:8000"),
            ok("10.0.0.2:8000"),
            ok("10.0.0.3:8000"),
        ],
    );
    let v1 = snapshot_version(&host);
    host.now_ms += 1000;
    round(
        &mut host,
        &mut engine,
        vec![
            ok("10.0.0.1:8000"),
            ok("10.0.0.2:8000"),
            ok("10.0.0.3:8000"),
        ],
    );
    assert_eq!(
        snapshot_version(&host),
        v1 + 1,
        "three answers, one publish: workers re-read once per round"
    );
    // A failing pod is published immediately, before the rest of its round answers.
    host.now_ms += 1000;
    let before = host.http_calls.len();
    engine.on_tick(&mut host);
    let first = host.next_token - 4 * (host.http_calls.len() - before) as u32;
    answer(&mut host, &mut engine, first, Some(500), "down");
    assert_eq!(snapshot_version(&host), v1 + 2);
}

#[test]
fn plain_envoy_reads_the_model_from_the_held_body_for_lora_affinity() {
    let (mut host, mut engine) = envoy(scrape_cfg());
    let lora = |running: &str| {
        format!(
            "{}vllm:lora_requests_info{{max_lora=\"2\",running_lora_adapters=\"{running}\",waiting_lora_adapters=\"\"}} 1\n",
            vllm(0, 1, 0.1)
        )
    };
    scrape_round(
        &mut host,
        &mut engine,
        &[
            ("10.0.0.1:8000", Some(200), lora("a")),
            ("10.0.0.2:8000", Some(200), lora("b")),
            ("10.0.0.3:8000", Some(200), lora("c")),
        ],
    );
    for (ctx, model, pod) in [
        (1, "b", "10.0.0.2:8000"),
        (2, "a", "10.0.0.1:8000"),
        (3, "c", "10.0.0.3:8000"),
        (4, "b", "10.0.0.2:8000"),
    ] {
        host.live_contexts.push(ctx);
        assert_eq!(
            engine.on_request_headers(&mut host, ctx, false),
            Verdict::Pause,
            "held for the model"
        );
        host.body = format!(r#"{{"model":"{model}","messages":[]}}"#).into_bytes();
        let n = host.body.len();
        assert_eq!(
            engine.on_request_body(&mut host, ctx, n, true),
            Verdict::Continue
        );
        let d = dest(&host).unwrap();
        assert!(d.starts_with(pod), "model {model}: {d}");
        engine.on_done(&mut host, ctx);
    }
}

/// A request naming session `sid` (no header when empty), finished; returns where it went
/// (the chosen pod: Higress's override host, or the first of Envoy's destination list) and
/// its debug reason.
fn session_request(
    host: &mut MockHost,
    engine: &mut Balancer,
    ctx: u32,
    sid: &[u8],
) -> (String, String) {
    host.request_headers = vec![(
        "x-session-id".into(),
        String::from_utf8(sid.to_vec()).unwrap(),
    )];
    if sid.is_empty() {
        host.request_headers.clear();
    }
    host.response_headers = vec![(":status".into(), "200".into())];
    assert_eq!(request(host, engine, ctx), Verdict::Continue);
    engine.on_response_headers(host, ctx);
    let reason = host
        .response_headers
        .iter()
        .find(|(k, _)| k == "x-dbg")
        .map(|(_, v)| v.rsplit("reason=").next().unwrap_or("").to_string())
        .unwrap_or_default();
    let to = match dest(host) {
        Some(d) => d.split(',').next().unwrap_or("").to_string(),
        None => host.override_host.clone().unwrap_or_default(),
    };
    engine.on_done(host, ctx);
    (to, reason)
}

const PODS: [&str; 3] = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];

/// The three pods' host list; `pod` gets `special` (health, metrics), the others are idle.
/// Each call is a new health-check round: the idle pods' text changes (`gen`), so the requests
/// sent before it no longer count as queued on them (the in-flight correction).
fn pool(pod: Option<&str>, special: (&str, &str)) -> Vec<u8> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static GEN: AtomicU32 = AtomicU32::new(0);
    let gen = GEN.fetch_add(1, Ordering::Relaxed) % 100;
    let idle = vllm(0, 1, 0.1 + f64::from(gen) / 1000.0);
    let list: Vec<(&str, &str, &str)> = PODS
        .iter()
        .map(|&p| {
            if Some(p) == pod {
                (p, special.0, special.1)
            } else {
                (p, "Healthy", idle.as_str())
            }
        })
        .collect();
    hosts_with_metrics(&list)
}

fn sticky_higress() -> (MockHost, Balancer) {
    higress(json!({"sessionHeader": "X-Session-Id", "debugHeader": "x-dbg"}))
}

#[test]
fn a_session_stays_on_its_pod_while_it_is_not_saturated_on_every_gateway() {
    let (mut host, mut engine) = sticky_higress();
    let (mut host2, mut engine2) = sticky_higress();
    let busy = vllm(4, 4, 0.7); // under both thresholds (5 waiting, 0.8 KV)
    host.hosts = pool(None, ("", ""));
    let (home, reason) = session_request(&mut host, &mut engine, 1, b"conv-1");
    assert_eq!(reason, "session");
    // Its pod gets busier than the others, yet not saturated: the session stays, on both
    // gateways (nothing shared but the host list), while a request without one moves on.
    host.hosts = pool(Some(&home), ("Healthy", &busy));
    host2.hosts = host.hosts.clone();
    for ctx in 2..=6 {
        assert_eq!(
            session_request(&mut host, &mut engine, ctx, b"conv-1"),
            (home.clone(), "session".to_string())
        );
        assert_eq!(
            session_request(&mut host2, &mut engine2, ctx, b"conv-1"),
            (home.clone(), "session".to_string())
        );
    }
    let (free, reason) = session_request(&mut host, &mut engine, 7, b"");
    assert_ne!(free, home, "the scheduler prefers an idle pod");
    assert_eq!(reason, "metrics");
    assert_eq!(host.metric("ai_lb.session.hit"), 6);
    assert_eq!(host.metric("ai_lb.session.rebound"), 0);
    // Sessions spread over the pods, and both gateways place every one alike.
    host.hosts = pool(None, ("", ""));
    host2.hosts = host.hosts.clone();
    let mut homes = std::collections::BTreeSet::new();
    for s in 0..24u32 {
        let sid = format!("user-{s}");
        let a = session_request(&mut host, &mut engine, 100 + s, sid.as_bytes());
        let b = session_request(&mut host2, &mut engine2, 100 + s, sid.as_bytes());
        assert_eq!(a, b, "{sid}");
        homes.insert(a.0);
    }
    assert_eq!(homes.len(), 3, "sessions spread: {homes:?}");
}

#[test]
fn a_session_is_rebound_when_its_pod_saturates_or_goes_and_comes_back_after() {
    let (mut host, mut engine) = sticky_higress();
    host.hosts = pool(None, ("", ""));
    let sessions: Vec<String> = (0..30).map(|s| format!("s-{s}")).collect();
    let mut homes = Vec::new();
    for (i, sid) in sessions.iter().enumerate() {
        homes.push(session_request(&mut host, &mut engine, i as u32, sid.as_bytes()).0);
    }
    let home = homes[0].clone();
    let mut ctx = 100;
    // Saturated by the scheduler's rule: a queue over queueThresholdCritical (6 > 5), then KV
    // over kvCacheThreshold (0.9 > 0.8). Rebound to the scheduler's pick, counted.
    for metrics in [vllm(6, 4, 0.5), vllm(0, 4, 0.9)] {
        host.hosts = pool(Some(&home), ("Healthy", &metrics));
        ctx += 1;
        let (to, reason) = session_request(&mut host, &mut engine, ctx, sessions[0].as_bytes());
        assert_ne!(to, home);
        assert_eq!(reason, "session_rebound");
    }
    assert_eq!(host.metric("ai_lb.session.rebound"), 2);
    // Recovered: back on its pod.
    host.hosts = pool(None, ("", ""));
    ctx += 1;
    let back = session_request(&mut host, &mut engine, ctx, sessions[0].as_bytes());
    assert_eq!(back, (home.clone(), "session".to_string()));
    // Unhealthy, then gone from the host list: its sessions move, counted as rebound, to the
    // same pod a gateway that never knew it sends them to; every other one stays put.
    let before = host.metric("ai_lb.session.rebound");
    let mut moved = 0i64;
    let others: Vec<&str> = PODS.iter().copied().filter(|p| *p != home).collect();
    let gone = hosts_with_metrics(&[
        (others[0], "Healthy", &vllm(0, 1, 0.1)),
        (others[1], "Healthy", &vllm(0, 1, 0.1)),
    ]);
    let (mut fresh, mut engine2) = sticky_higress();
    fresh.hosts = gone.clone();
    for list in [
        pool(Some(&home), ("Unhealthy", &vllm(0, 0, 0.0))),
        gone.clone(),
    ] {
        host.hosts = list;
        for (sid, was) in sessions.iter().zip(&homes) {
            ctx += 1;
            let (to, reason) = session_request(&mut host, &mut engine, ctx, sid.as_bytes());
            assert_ne!(to, home, "{sid}");
            if *was == home {
                moved += 1;
                assert_eq!(reason, "session_rebound", "{sid}");
                let (to2, r2) = session_request(&mut fresh, &mut engine2, ctx, sid.as_bytes());
                assert_eq!(
                    (to2, r2.as_str()),
                    (to, "session"),
                    "{sid}: same pod elsewhere"
                );
            } else {
                assert_eq!((&to, reason.as_str()), (was, "session"), "{sid} stays");
            }
        }
    }
    assert!(moved >= 2, "some session lived on the pod that went");
    assert_eq!(host.metric("ai_lb.session.rebound") - before, moved);
    // Remembered for a bounded time only: then its sessions are the next pod's own.
    host.now_ms += crate::balancer::metrics::host_list::DEPARTED_KEEP_MS;
    let mut kept = 0;
    for (sid, was) in sessions.iter().zip(&homes) {
        ctx += 1;
        let (to, reason) = session_request(&mut host, &mut engine, ctx, sid.as_bytes());
        assert_eq!(reason, "session", "{sid} on {to}");
        kept += i64::from(*was == home);
    }
    assert!(kept >= 1);
    host.hosts = pool(None, ("", ""));
    // Unknown metrics (a page without the load gauges) do not keep a session either.
    host.hosts = pool(Some(&home), ("Healthy", "no metrics here\n"));
    ctx += 1;
    let (to, reason) = session_request(&mut host, &mut engine, ctx, sessions[0].as_bytes());
    assert_ne!(to, home);
    assert_eq!(reason, "session_rebound");
    assert_eq!(engine.tracked().1, 0);
}

#[test]
fn long_unicode_and_empty_session_ids() {
    let (mut host, mut engine) = sticky_higress();
    let (mut host2, mut engine2) = sticky_higress();
    host.hosts = pool(None, ("", ""));
    host2.hosts = host.hosts.clone();
    let long = vec![b'x'; 10 * 1024];
    let unicode = "\u{7528}\u{6237}-\u{1F600}".as_bytes().to_vec();
    for (i, sid) in [long, unicode].iter().enumerate() {
        let ctx = 10 * i as u32;
        let first = session_request(&mut host, &mut engine, ctx, sid);
        assert_eq!(first.1, "session");
        assert!(PODS.contains(&first.0.as_str()));
        for c in 1..=3 {
            assert_eq!(session_request(&mut host, &mut engine, ctx + c, sid), first);
        }
        assert_eq!(session_request(&mut host2, &mut engine2, ctx, sid), first);
    }
    // An empty header names no session: the scheduler decides, nothing counted.
    host.request_headers = vec![("x-session-id".into(), String::new())];
    assert_eq!(request(&mut host, &mut engine, 50), Verdict::Continue);
    engine.on_done(&mut host, 50);
    assert_eq!(host.metric("ai_lb.session.hit"), 8);
    assert_eq!(host.metric("ai_lb.metrics.routed"), 9);
}

#[test]
fn plain_envoy_scraped_sessions_stay_and_leave_a_pod_whose_scrape_fails() {
    let mut lb = scrape_cfg();
    lb["sessionCookie"] = json!("sid");
    lb["debugHeader"] = json!("x-dbg");
    let (mut host, mut engine) = envoy(lb);
    let pods = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];
    let round = |host: &mut MockHost, engine: &mut Balancer, bad: Option<&str>| {
        host.now_ms += 1000;
        let texts: Vec<(&str, Option<u16>, String)> = pods
            .iter()
            .map(|&p| match bad {
                Some(b) if b == p => (p, Some(500), "oops".to_string()),
                _ => (p, Some(200), vllm(0, 2, 0.2)),
            })
            .collect();
        scrape_round(host, engine, &texts);
    };
    let send = |host: &mut MockHost, engine: &mut Balancer, ctx: u32| {
        host.request_headers = vec![("cookie".into(), "a=1; sid=chat-7".into())];
        host.response_headers = vec![(":status".into(), "200".into())];
        assert_eq!(request(host, engine, ctx), Verdict::Continue);
        engine.on_response_headers(host, ctx);
        engine.on_done(host, ctx);
        let to = dest(host).unwrap_or_default();
        let reason = host
            .response_headers
            .iter()
            .find(|(k, _)| k == "x-dbg")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        (to.split(',').next().unwrap_or("").to_string(), reason)
    };
    round(&mut host, &mut engine, None);
    let (home, reason) = send(&mut host, &mut engine, 1);
    assert!(reason.ends_with("reason=session"), "{reason}");
    // Many quick turns between two scrapes: still kept (the scraped queue is what counts).
    for ctx in 2..=20 {
        assert_eq!(send(&mut host, &mut engine, ctx).0, home);
    }
    // Its scrape fails: no metrics, no session there until it answers again.
    round(&mut host, &mut engine, Some(&home));
    let (to, reason) = send(&mut host, &mut engine, 30);
    assert_ne!(to, home);
    assert!(reason.ends_with("reason=session_rebound"), "{reason}");
    round(&mut host, &mut engine, None);
    assert_eq!(send(&mut host, &mut engine, 31).0, home);
    assert_eq!(host.metric("ai_lb.session.hit"), 21);
    assert_eq!(host.metric("ai_lb.session.rebound"), 1);
}

/// Higress build, a sticky endpoint_metrics route naming a Redis service: bindings in Redis.
fn bound_higress() -> (MockHost, Balancer) {
    let (mut host, mut engine) = higress(json!({"serviceFQDN": "redis.static",
        "servicePort": 6379, "sessionHeader": "x-session-id", "sessionTTL": 90,
        "debugHeader": "x-dbg"}));
    assert_eq!(
        host.redis_calls.len(),
        1,
        "only the binding script is loaded"
    );
    let sha = b"$40\r\n0123456789012345678901234567890123456789\r\n";
    redis_reply(&mut host, &mut engine, 7, sha);
    host.redis_calls.clear();
    (host, engine)
}

fn redis_reply(host: &mut MockHost, engine: &mut Balancer, token: u32, reply: &[u8]) {
    use crate::balancer::redis_client::CallStatus;
    host.reply = Some(reply.to_vec());
    engine.on_redis_reply(host, token, CallStatus::Ok, reply.len());
    host.reply = None;
}

/// A sticky request up to its binding call: (the call's args, its token).
fn bind_call(host: &mut MockHost, engine: &mut Balancer, ctx: u32) -> (Vec<String>, u32) {
    host.request_headers = vec![("x-session-id".into(), "conv".into())];
    host.response_headers = vec![(":status".into(), "200".into())];
    let before = host.redis_calls.len();
    assert_eq!(request(host, engine, ctx), Verdict::Pause);
    assert_eq!(host.redis_calls.len(), before + 1, "one call per request");
    (host.last_query_args(), host.next_token - 4)
}

/// After the reply: (override host, debug reason); the stream ends.
fn finish(host: &mut MockHost, engine: &mut Balancer, ctx: u32) -> (String, String) {
    engine.on_response_headers(host, ctx);
    let reason = host
        .response_headers
        .iter()
        .find(|(k, _)| k == "x-dbg")
        .map(|(_, v)| v.rsplit("reason=").next().unwrap_or("").to_string())
        .unwrap_or_default();
    engine.on_done(host, ctx);
    (host.override_host.clone().unwrap_or_default(), reason)
}

fn picked(endpoint: &str, state: &str) -> Vec<u8> {
    crate::redis::resp::encode_command(&["OK", endpoint, "0", "0", state])
}

#[test]
fn with_redis_a_session_is_kept_or_bound_in_one_call_and_redis_trouble_is_the_schedulers_pick() {
    use crate::redis::scripts::{session_key, Keys};
    let (mut host, mut engine) = bound_higress();
    host.hosts = pool(None, ("", ""));
    let (args, token) = bind_call(&mut host, &mut engine, 1);
    let ns = Keys::new("ailb", "chat", CLUSTER).namespace;
    // EVALSHA sha 1 <session key> <ttl> <scheduler's pick> <pods that may keep it>...
    assert_eq!(args[0], "EVALSHA");
    assert_eq!(args[2..5], ["1", &session_key(&ns, b"conv"), "90"]);
    let choice = args[5].clone();
    assert!(PODS.contains(&choice.as_str()));
    assert_eq!(args[6..], PODS, "every idle pod may keep a session");
    redis_reply(&mut host, &mut engine, token, &picked(&choice, "2"));
    assert_eq!(
        finish(&mut host, &mut engine, 1),
        (choice.clone(), "metrics".into())
    );
    assert_eq!(host.metric("ai_lb.session.bound"), 1);
    // Kept on its bound pod, whatever the scheduler chose this time.
    let (args, token) = bind_call(&mut host, &mut engine, 2);
    let other = PODS.iter().find(|p| **p != args[5]).unwrap();
    redis_reply(&mut host, &mut engine, token, &picked(other, "1"));
    assert_eq!(
        finish(&mut host, &mut engine, 2),
        (other.to_string(), "session".into())
    );
    assert_eq!(host.metric("ai_lb.session.hit"), 1);
    // A saturated pod is not offered to keep a session; a rebound reads as such.
    host.hosts = pool(Some(PODS[1]), ("Healthy", &vllm(9, 4, 0.5)));
    let (args, token) = bind_call(&mut host, &mut engine, 3);
    assert_eq!(args[6..], [PODS[0], PODS[2]]);
    redis_reply(&mut host, &mut engine, token, &picked(&args[5], "3"));
    assert_eq!(finish(&mut host, &mut engine, 3).1, "session_rebound");
    assert_eq!(host.metric("ai_lb.session.rebound"), 1);
    // A reply naming a pod not offered, a failed call, an error reply: the scheduler's pick,
    // counted as a session fallback.
    let (args, token) = bind_call(&mut host, &mut engine, 4);
    redis_reply(&mut host, &mut engine, token, &picked("9.9.9.9:1", "1"));
    assert_eq!(
        finish(&mut host, &mut engine, 4),
        (args[5].clone(), "metrics".into())
    );
    let (args, token) = bind_call(&mut host, &mut engine, 5);
    engine.on_redis_reply(
        &mut host,
        token,
        crate::balancer::redis_client::CallStatus::Failed,
        0,
    );
    assert_eq!(
        finish(&mut host, &mut engine, 5),
        (args[5].clone(), "metrics".into())
    );
    let (args, token) = bind_call(&mut host, &mut engine, 6);
    redis_reply(&mut host, &mut engine, token, b"-ERR boom\r\n");
    assert_eq!(finish(&mut host, &mut engine, 6).0, args[5]);
    assert_eq!(host.metric("ai_lb.session.fallback"), 3);
    // NOSCRIPT: sent again once as EVAL.
    let (_, token) = bind_call(&mut host, &mut engine, 7);
    redis_reply(
        &mut host,
        &mut engine,
        token,
        b"-NOSCRIPT No matching script\r\n",
    );
    assert_eq!(host.last_query_args()[0], "EVAL");
    let resent = host.next_token - 4;
    redis_reply(&mut host, &mut engine, resent, &picked(PODS[0], "1"));
    assert_eq!(
        finish(&mut host, &mut engine, 7),
        (PODS[0].into(), "session".into())
    );
    // A request that ends while its call is in flight leaves nothing behind.
    let (_, token) = bind_call(&mut host, &mut engine, 8);
    host.live_contexts.retain(|&c| c != 8);
    engine.on_done(&mut host, 8);
    redis_reply(&mut host, &mut engine, token, &picked(PODS[0], "1"));
    assert_eq!(engine.tracked(), (0, 0));
    // Without a session header: the scheduler alone, no call.
    host.request_headers.clear();
    let before = host.redis_calls.len();
    assert_eq!(request(&mut host, &mut engine, 9), Verdict::Continue);
    assert_eq!(host.redis_calls.len(), before);
}

// ---- agent sessions and Responses continuations (docs/sessions-and-queues.md) ----

/// A Responses request continuing `previous` (if any) whose answer names itself `answer`,
/// finished: (where it went, its debug reason).
fn responses_request(
    host: &mut MockHost,
    engine: &mut Balancer,
    ctx: u32,
    previous: Option<&str>,
    answer: &str,
) -> (String, String) {
    let mut body = json!({"model": "m", "input": "hi"});
    if let Some(p) = previous {
        body["previous_response_id"] = json!(p);
    }
    host.live_contexts.push(ctx);
    host.override_host = None;
    host.request_headers = vec![(":path".into(), "/v1/responses".into())];
    host.body = body.to_string().into_bytes();
    assert_eq!(engine.on_request_headers(host, ctx, false), Verdict::Pause);
    let n = host.body.len();
    if engine.on_request_body(host, ctx, n, true) == Verdict::Pause {
        // With Redis: the binding call's reply, the pod the scheduler offered.
        let args = host.last_query_args();
        let state = if previous.is_some() { "1" } else { "2" };
        let reply = picked(&args[5], state);
        redis_reply(host, engine, host.next_token - 4, &reply);
    }
    host.response_headers = vec![(":status".into(), "200".into())];
    let wants = engine.on_response_headers(host, ctx);
    let reason = host
        .response_headers
        .iter()
        .find(|(k, _)| k == "x-dbg")
        .map(|(_, v)| v.rsplit("reason=").next().unwrap_or("").to_string())
        .unwrap_or_default();
    let to = host.override_host.clone().unwrap_or_default();
    host.response_body = json!({"id": answer, "object": "response"})
        .to_string()
        .into_bytes();
    if wants {
        let n = host.response_body.len();
        engine.on_response_body(host, ctx, n, true);
    }
    host.live_contexts.retain(|&c| c != ctx);
    engine.on_done(host, ctx);
    (to, reason)
}

#[test]
fn with_redis_a_continuation_is_bound_by_its_response_key_and_its_answer_written_alone() {
    use crate::redis::bind::response_key;
    use crate::redis::scripts::Keys;
    let (mut host, mut engine) = bound_higress();
    host.hosts = pool(None, ("", ""));
    let ns = Keys::new("ailb", "chat", CLUSTER).namespace;
    let (to, reason) = responses_request(&mut host, &mut engine, 1, Some("resp_1"), "resp_2");
    assert_eq!(reason, "continuation");
    // Nothing is released under endpoint_metrics: the answer's pod is written by itself.
    let set = host.last_query_args();
    assert_eq!(
        set[..3],
        ["SET".to_string(), response_key(&ns, b"resp_2"), to]
    );
    // agentSessionTTL: the route's sessionTTL when it sets one.
    assert_eq!(set[3..], ["EX", "90"]);
    assert_eq!(host.metric("ai_lb.session.response_recorded"), 1);
    assert_eq!(host.metric("ai_lb.session.agent"), 1);
    // The binding call names the previous response's key, with agentSessionTTL.
    let (args, token) = {
        host.request_headers = vec![(":path".into(), "/v1/responses".into())];
        host.live_contexts.push(2);
        host.body = br#"{"input":"x","previous_response_id":"resp_2"}"#.to_vec();
        engine.on_request_headers(&mut host, 2, false);
        let n = host.body.len();
        engine.on_request_body(&mut host, 2, n, true);
        (host.last_query_args(), host.next_token - 4)
    };
    assert_eq!(args[2..5], ["1", &response_key(&ns, b"resp_2"), "90"]);
    // An unknown one is bound to the scheduler's pick, counted.
    redis_reply(&mut host, &mut engine, token, &picked(&args[5], "2"));
    host.response_headers = vec![(":status".into(), "200".into())];
    assert_eq!(finish(&mut host, &mut engine, 2).1, "metrics");
    assert_eq!(host.metric("ai_lb.session.continuation_unknown"), 1);
}

#[test]
fn without_redis_a_continuation_goes_to_the_pod_this_proxy_recorded() {
    let (mut host, mut engine) = higress(json!({"debugHeader": "x-dbg"}));
    host.hosts = pool(None, ("", ""));
    let (first, reason) = responses_request(&mut host, &mut engine, 1, None, "resp_a");
    assert_eq!(reason, "metrics");
    assert_eq!(host.metric("ai_lb.session.response_recorded"), 1);
    // Its pod busier than the others (not saturated): the continuation still goes there.
    host.hosts = pool(Some(&first), ("Healthy", &vllm(3, 4, 0.6)));
    let (to, reason) = responses_request(&mut host, &mut engine, 2, Some("resp_a"), "resp_b");
    assert_eq!(
        (to.as_str(), reason.as_str()),
        (first.as_str(), "continuation")
    );
    assert_eq!(host.metric("ai_lb.session.hit"), 1);
    // Unknown here: the scheduler's pick, counted.
    let (_, reason) = responses_request(&mut host, &mut engine, 3, Some("resp_zz"), "resp_c");
    assert_eq!(reason, "metrics");
    assert_eq!(host.metric("ai_lb.session.continuation_unknown"), 1);
    // Its pod saturated: rebound, and the answer recorded on the new pod.
    host.hosts = pool(Some(&first), ("Healthy", &vllm(9, 4, 0.5)));
    let (moved, reason) = responses_request(&mut host, &mut engine, 4, Some("resp_b"), "resp_d");
    assert_ne!(moved, first);
    assert_eq!(reason, "session_rebound");
    host.hosts = pool(None, ("", ""));
    let (to, reason) = responses_request(&mut host, &mut engine, 5, Some("resp_d"), "resp_e");
    assert_eq!((to, reason), (moved, "continuation".to_string()));
    // Turned off: nothing read, nothing recorded.
    let (mut host, mut engine) = higress(json!({"debugHeader": "x-dbg", "agentSessions": false}));
    host.hosts = pool(None, ("", ""));
    responses_request(&mut host, &mut engine, 1, Some("resp_a"), "resp_b");
    assert_eq!(host.metric("ai_lb.session.response_recorded"), 0);
    assert_eq!(host.metric("ai_lb.session.agent"), 0);
}
