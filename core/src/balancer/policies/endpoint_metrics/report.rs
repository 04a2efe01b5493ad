//! What a metrics text said besides its numbers, counted and logged: a cut page, values read
//! as unknown (cut off, NaN/±Inf, out of range), a JSON answer where Prometheus text was
//! expected (trtllm-serve's `/metrics`), a sleeping vLLM engine. Each problem is logged at warn
//! once per pod, at most a few lines per interval ([`NoteLog`]); the counters count every text.

use crate::balancer::telemetry::Telemetry;
use crate::host::{Host, LogLevel};
use crate::model_metrics::engines::Scrape;
use crate::model_metrics::note_log::NoteLog;
use crate::model_metrics::MapError;
use crate::stats::Counter;

/// Where the text came from, for a log line that says what to change.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// The plugin's scraper, at this path.
    Scrape { path: &'a str },
    /// Higress's host list: the body of the host's active health check.
    HealthCheck,
}

/// The Prometheus path of trtllm-serve (its `/metrics` answers JSON iteration statistics).
const TRTLLM_PROMETHEUS_PATH: &str = "/prometheus/metrics";

#[derive(Debug, Default)]
pub struct Report {
    log: NoteLog,
}

impl Report {
    pub fn text(
        &mut self,
        host: &mut dyn Host,
        tel: &Telemetry,
        pod: &str,
        source: Source<'_>,
        out: &Scrape,
    ) {
        if out.stats.truncated.is_some() {
            tel.inc(host, Counter::MetricsTruncated);
        }
        if !out.unknown.is_empty() {
            tel.inc(host, Counter::MetricsUnknownValue);
        }
        let mut keys: Vec<String> = out
            .unknown
            .iter()
            .map(|u| format!("{} {}", u.metric, u.why.as_str()))
            .collect();
        match out.result {
            Err(MapError::NotPrometheus) => {
                tel.inc(host, Counter::MetricsNotPrometheus);
                keys.push("json".into());
            }
            Err(MapError::Asleep(_)) => keys.push("asleep".into()),
            _ => {}
        }
        if keys.is_empty() {
            self.log.clear(pod);
            return;
        }
        // A sleeping engine is a state an operator chose, not a fault.
        let level = match out.result {
            Err(MapError::Asleep(_)) => LogLevel::Info,
            _ => LogLevel::Warn,
        };
        if !tel.enabled(level) {
            return;
        }
        let fresh = self.log.admit(pod, &keys, host.now_ms());
        if fresh.is_empty() {
            return;
        }
        let from = match source {
            Source::Scrape { path } => format!("scrape of {pod}{path}"),
            Source::HealthCheck => format!("health-check body of {pod}"),
        };
        let line = match out.result {
            Err(MapError::NotPrometheus) => match source {
                Source::Scrape { .. } => format!(
                    "{from}: JSON, not Prometheus text; trtllm-serve serves Prometheus text at \
                     {TRTLLM_PROMETHEUS_PATH} (set scrapePath): endpoint unknown"
                ),
                Source::HealthCheck => format!(
                    "{from}: JSON, not Prometheus text; trtllm-serve serves Prometheus text at \
                     {TRTLLM_PROMETHEUS_PATH}: point the health check there: endpoint unknown"
                ),
            },
            Err(MapError::Asleep(_)) => {
                format!("{from}: vllm:engine_sleep_state says asleep: not a candidate")
            }
            Err(MapError::LoadUnknown(_)) => format!(
                "{from}: unknown {}: endpoint not a candidate until a whole, valid page",
                fresh.join(", ")
            ),
            _ => format!("{from}: unknown {} (ignored)", fresh.join(", ")),
        };
        tel.log(host, level, 0, format_args!("{line}"));
    }
}

/// The defects of issue 11 item 4 end to end through the balancer on the mock host: each page
/// is what the real server sends, and the pod it would have made look idle is not picked.
#[cfg(test)]
mod tests {
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
        let asleep =
            vllm("0.0").replace("sleep_state=\"awake\"} 1.0", "sleep_state=\"awake\"} 0.0");
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
}
