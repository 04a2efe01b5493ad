//! The latency histograms each dialect's page carries (latency.rs, latency_page.rs): counts of
//! the requests served, sums within what the client measured, monotone buckets, and a page the
//! plugin's metrics reader still reads as before.

mod common;

use ailb_core::model_metrics::{engines, prom};
use ailb_fakepod::{EngineKind, PodHandle};
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Output lengths of the requests each pod gets, once not streamed and once streamed: one
/// token (no TPOT), a few, and more than SGLang's forced output interval (50).
const LENGTHS: [u64; 3] = [1, 6, 60];

/// What the client saw of all requests, in seconds.
#[derive(Default, Debug)]
struct Client {
    /// Upper bounds of each TTFT: the first body frame of a streamed answer, the whole
    /// exchange of one that is not.
    ttft: f64,
    total: f64,
    /// The pod's own TTFTs (`fake_ttft_us` of the usage).
    pod_ttft: f64,
}

async fn serve(p: &PodHandle) -> Client {
    let http = client();
    let url = format!("{}/v1/chat/completions", p.url());
    let mut seen = Client::default();
    for stream in [false, true] {
        for (i, n) in LENGTHS.into_iter().enumerate() {
            let body = json!({
                "model": "fake-model",
                "messages": [{"role": "user", "content": format!("question {i} {stream}")}],
                "max_tokens": n,
                "stream": stream,
                "stream_options": {"include_usage": true},
            })
            .to_string();
            let s = send(&http, "POST", &url, &body, &[]).await.unwrap();
            assert_eq!(s.status, 200, "{}", s.text());
            let usage = if stream {
                let line = s
                    .text()
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .find(|v| v["usage"].is_object())
                    .expect("usage chunk");
                line["usage"].clone()
            } else {
                serde_json::from_str::<Value>(&s.text()).unwrap()["usage"].clone()
            };
            assert_eq!(usage["completion_tokens"], n);
            seen.pod_ttft += usage["fake_ttft_us"].as_f64().unwrap() / 1e6;
            let first = if stream { s.frames[0].0 } else { s.total };
            seen.ttft += first.as_secs_f64();
            seen.total += s.total.as_secs_f64();
        }
    }
    seen
}

/// One histogram family of a page: its series (label sets without `le`) with their count and
/// sum, after checking each series' buckets rise to its `+Inf` bucket, which is its count.
fn family(page: &str, name: &str) -> BTreeMap<String, (f64, f64)> {
    let samples = ailb_fakepod::metrics::parse_text(page).unwrap();
    let mut buckets: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (n, labels, v) in samples {
        let pairs: Vec<&str> = labels.split(',').filter(|l| !l.is_empty()).collect();
        let rest: Vec<&str> = pairs
            .iter()
            .copied()
            .filter(|l| !l.starts_with("le="))
            .collect();
        let key = rest.join(",");
        if n == format!("{name}_bucket") {
            let le = pairs.iter().find_map(|l| l.strip_prefix("le=")).unwrap();
            buckets.entry(key).or_default().push((le.to_string(), v));
        } else if n == format!("{name}_count") {
            out.entry(key).or_default().0 = v;
        } else if n == format!("{name}_sum") {
            out.entry(key).or_default().1 = v;
        }
    }
    assert_eq!(
        buckets.keys().collect::<Vec<_>>(),
        out.keys().collect::<Vec<_>>(),
        "{name}"
    );
    for (key, b) in &buckets {
        let bounds: Vec<f64> = b
            .iter()
            .map(|(le, _)| le.trim_matches('"').replace("+Inf", "inf").parse().unwrap())
            .collect();
        assert!(
            bounds.windows(2).all(|w| w[0] < w[1]),
            "{name}{{{key}}} bounds"
        );
        assert!(
            b.windows(2).all(|w| w[0].1 <= w[1].1),
            "{name}{{{key}}} not monotone"
        );
        assert_eq!(b.last().unwrap().0, "\"+Inf\"", "{name}{{{key}}}");
        assert_eq!(
            b.last().unwrap().1,
            out[key].0,
            "{name}{{{key}}}: +Inf is the count"
        );
    }
    out
}

/// Count and sum of a family over all its series.
fn total(page: &str, name: &str) -> (f64, f64) {
    family(page, name)
        .values()
        .fold((0.0, 0.0), |(c, s), (n, v)| (c + n, s + v))
}

/// The page reads for the plugin as it does without its histograms: same snapshot, nothing
/// malformed.
fn plugin_reads_it(page: &str) {
    let all = prom::parse(page.as_bytes());
    assert_eq!(all.stats.malformed, 0, "{:?}", all.stats.first_error);
    let without: String = page
        .lines()
        .filter(|l| !l.contains("_seconds") || l.contains("process_start_time_seconds"))
        .map(|l| format!("{l}\n"))
        .collect();
    let (with_h, stats) = engines::scrape(page.as_bytes(), None);
    let (without_h, _) = engines::scrape(without.as_bytes(), None);
    assert_eq!(stats.malformed, 0);
    assert!(with_h.is_ok(), "{with_h:?}");
    assert_eq!(with_h, without_h);
}

#[tokio::test]
async fn every_dialect_fills_its_histograms_from_what_it_served() {
    let tokens_after_first: f64 = LENGTHS.iter().map(|n| (n - 1) as f64).sum::<f64>() * 2.0;
    let multi = LENGTHS.iter().filter(|n| **n > 1).count() as f64 * 2.0;
    let requests = LENGTHS.len() as f64 * 2.0;
    for kind in [
        EngineKind::VllmV1,
        EngineKind::VllmV0,
        EngineKind::Sglang,
        EngineKind::TrtLlm,
    ] {
        let p = pod("lat", |c| c.engine = kind).await;
        let seen = serve(&p).await;
        let http = client();
        let path = if kind == EngineKind::TrtLlm {
            "/prometheus/metrics"
        } else {
            "/metrics"
        };
        let page = get(&http, &format!("{}{path}", p.url())).await;
        let (ttft, itl, tpot, e2e) = match kind {
            EngineKind::VllmV1 => (
                "vllm:time_to_first_token_seconds",
                Some("vllm:inter_token_latency_seconds"),
                Some("vllm:request_time_per_output_token_seconds"),
                "vllm:e2e_request_latency_seconds",
            ),
            EngineKind::VllmV0 => (
                "vllm:time_to_first_token_seconds",
                Some("vllm:time_per_output_token_seconds"),
                None,
                "vllm:e2e_request_latency_seconds",
            ),
            EngineKind::Sglang => (
                "sglang:time_to_first_token_seconds",
                Some("sglang:inter_token_latency_seconds"),
                Some("sglang:request_time_per_output_token_seconds"),
                "sglang:e2e_request_latency_seconds",
            ),
            EngineKind::TrtLlm => (
                "trtllm_time_to_first_token_seconds",
                None,
                Some("trtllm_time_per_output_token_seconds"),
                "trtllm_e2e_request_latency_seconds",
            ),
        };
        let slack = 0.005 * requests;
        let (n, ttft_sum) = total(&page, ttft);
        assert_eq!(n, requests, "{kind:?} {ttft}");
        assert!(
            ttft_sum <= seen.ttft + slack && (ttft_sum - seen.pod_ttft).abs() < 1e-5 * requests,
            "{kind:?}: TTFT sum {ttft_sum} vs client {} and usage {}",
            seen.ttft,
            seen.pod_ttft
        );
        let (n, e2e_sum) = total(&page, e2e);
        assert_eq!(n, requests, "{kind:?} {e2e}");
        assert!(
            e2e_sum <= seen.total + slack,
            "{kind:?} e2e {e2e_sum} vs {}",
            seen.total
        );
        // 2 ms decode steps (common::pod) on deadlines: no answer ends before all its steps
        // (a late first token shortens the steps after it, so the decode part alone has no
        // such floor).
        let steps = 0.002 * (tokens_after_first + requests);
        assert!(
            e2e_sum >= steps && e2e_sum >= ttft_sum,
            "{kind:?} e2e {e2e_sum}"
        );
        let decode = e2e_sum - ttft_sum;
        if let Some(itl) = itl {
            let (n, sum) = total(&page, itl);
            let want = match kind {
                // Streamed: every token after the first; not streamed: the outputs at 50
                // tokens and at the end of the long answer only.
                EngineKind::Sglang => tokens_after_first / 2.0 + 10.0,
                _ => tokens_after_first,
            };
            assert_eq!(n, want, "{kind:?} {itl}");
            assert!(sum > 0.0 && sum <= decode + slack, "{kind:?} {itl} {sum}");
        }
        if let Some(tpot) = tpot {
            let (n, sum) = total(&page, tpot);
            // vLLM observes every finished request (0 for one token); the others only those
            // with more than one token.
            let want = if kind == EngineKind::VllmV1 {
                requests
            } else {
                multi
            };
            assert_eq!(n, want, "{kind:?} {tpot}");
            assert!(sum > 0.0 && sum <= decode + slack, "{kind:?} {sum}");
        }
        if kind == EngineKind::TrtLlm {
            let m = get(&http, &format!("{}/metrics", p.url())).await;
            assert!(!m.contains("trtllm_"), "trtllm-serve's /metrics has none");
            assert_eq!(prom::parse(page.as_bytes()).stats.malformed, 0);
        } else {
            plugin_reads_it(&page);
            let none = get(&http, &format!("{}/prometheus/metrics", p.url())).await;
            assert!(
                !none.contains("_seconds"),
                "only trtllm-serve serves that path"
            );
        }
        // `/admin/reset` zeroes them with the other counters.
        send(&http, "POST", &format!("{}/admin/reset", p.url()), "", &[])
            .await
            .unwrap();
        let page = get(&http, &format!("{}{path}", p.url())).await;
        assert!(family(&page, e2e).values().all(|(n, _)| *n == 0.0));
        p.shutdown().await;
    }
}

#[tokio::test]
async fn labels_follow_each_engine() {
    let http = client();
    let body = chat("s", "q", 3, true);
    // vLLM: one series per engine (rank) from the start, labelled as the engine's gauges.
    let v = pod("v", |c| c.dp_ranks = 2).await;
    let page = get(&http, &format!("{}/metrics", v.url())).await;
    let ttft = family(&page, "vllm:time_to_first_token_seconds");
    assert_eq!(
        ttft.keys().collect::<Vec<_>>(),
        [
            "engine=\"0\",model_name=\"fake-model\"",
            "engine=\"1\",model_name=\"fake-model\""
        ]
    );
    assert!(page.contains(
        "vllm:time_to_first_token_seconds_bucket{engine=\"1\",le=\"0.001\",model_name=\"fake-model\"} 0.0\n"
    ));
    assert!(page.contains(
        "vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"7680.0\",model_name=\"fake-model\"} 0.0\n"
    ));
    // SGLang: one tokenizer for all ranks, `is_streaming` beside model and engine type, and
    // nothing before the first request.
    let s = pod("s", |c| {
        c.engine = EngineKind::Sglang;
        c.dp_ranks = 2;
    })
    .await;
    let url = format!("{}/v1/chat/completions", s.url());
    let page = get(&http, &format!("{}/metrics", s.url())).await;
    assert!(!page.contains("sglang:time_to_first_token_seconds"));
    for _ in 0..2 {
        assert_eq!(
            send(&http, "POST", &url, &body, &[]).await.unwrap().status,
            200
        );
    }
    let page = get(&http, &format!("{}/metrics", s.url())).await;
    let ttft = family(&page, "sglang:time_to_first_token_seconds");
    let key = "engine_type=\"unified\",is_streaming=\"true\",model_name=\"fake-model\"";
    assert_eq!(ttft.keys().collect::<Vec<_>>(), [key]);
    assert_eq!(ttft[key].0, 2.0);
    assert!(page.contains(
        "sglang:inter_token_latency_seconds_bucket{engine_type=\"unified\",le=\"0.002\",model_name=\"fake-model\"}"
    ));
    assert!(
        page.contains("dp_rank=\"1\""),
        "the gauges keep their ranks"
    );
    // The histograms come after every other family, so a cut page loses them first.
    let first_hist = page
        .find("# TYPE sglang:time_to_first_token_seconds")
        .unwrap();
    assert!(page.find("process_start_time_seconds").unwrap() < first_hist);
    let t = pod("t", |c| c.engine = EngineKind::TrtLlm).await;
    let url = format!("{}/v1/chat/completions", t.url());
    assert!(get(&http, &format!("{}/prometheus/metrics", t.url()))
        .await
        .is_empty());
    send(&http, "POST", &url, &body, &[]).await.unwrap();
    let page = get(&http, &format!("{}/prometheus/metrics", t.url())).await;
    assert!(page.contains(
        "trtllm_time_to_first_token_seconds_count{engine_type=\"undefined\",model_name=\"undefined\"} 1.0\n"
    ));
    for p in [v, s, t] {
        p.shutdown().await;
    }
}

/// Eight vLLM ranks' histograms take a page past Envoy's 64 KiB health-check body limit; the
/// cut falls in them, after everything the plugin reads (the sleep state included, which an
/// awake engine's page shows as vLLM's does), so it reads the same.
#[tokio::test]
async fn a_page_cut_in_its_histograms_reads_the_same() {
    let p = pod("cut", |c| c.dp_ranks = 8).await;
    let page = get(&client(), &format!("{}/metrics", p.url())).await;
    let cap = 64 * 1024;
    assert!(page.len() > cap, "{} bytes", page.len());
    assert!(
        page.find("# TYPE vllm:time_to_first_token_seconds")
            .unwrap()
            < cap
    );
    let cut = engines::scrape_page(&page.as_bytes()[..cap], cap, None);
    let (whole, _) = engines::scrape(page.as_bytes(), None);
    assert!(whole.is_ok() && cut.unknown.is_empty(), "{:?}", cut.unknown);
    assert_eq!(cut.result, whole);
    let no_sleep: String = page
        .lines()
        .filter(|l| !l.contains("engine_sleep_state"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        engines::scrape(no_sleep.as_bytes(), None).0,
        whole,
        "awake reads as absent"
    );
    p.shutdown().await;
}
