//! endpoint_metrics benchmarks: plugin CPU with host-provided and scraped metrics, and the
//! queue balance against round-robin.

use crate::common::{lognormal_sizes, post_chat10, vm_us_per_request};
use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::Gateway;
use ailb_fakepod::load::{self, LoadConfig, Workload};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A vLLM V1 page of about `bytes` (the fake pod's families, the sleep state current vLLM emits
/// after the queue gauge, padding histograms). At 64 KiB Higress's host cuts the page: the sleep
/// family must be on it, or the plugin cannot tell an old vLLM from one asleep past the cut
/// (docs/model-server-metrics.md §2).
fn vllm_text(waiting: u32, bytes: usize) -> String {
    let mut s = format!(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"0\",model_name=\"fake-model\"}} 1\n\
         # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"0\",model_name=\"fake-model\"}} {waiting}\n\
         # TYPE vllm:engine_sleep_state gauge\nvllm:engine_sleep_state{{engine=\"0\",model_name=\"fake-model\",sleep_state=\"awake\"}} 1\n\
         # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"fake-model\"}} 0.2\n"
    );
    let mut i = 0;
    while s.len() < bytes {
        s.push_str(&format!(
            "vllm:e2e_request_latency_seconds_bucket{{engine=\"0\",le=\"{i}.0\",model_name=\"fake-model\"}} {}\n",
            i * 3
        ));
        i += 1;
    }
    s
}

/// Plugin CPU per request for endpoint_metrics over 64 endpoints with host-provided metrics
/// (Higress health-check bodies): 2 real pods, 62 others that always look busier. Measured at
/// ~2 KB and ~64 KB of metrics per host, to show what per-request cost the text size still has.
pub fn metrics_plugin_cpu() -> anyhow::Result<()> {
    let bed = Bed::new(2, |c| {
        c.decode_us_per_token = 0;
        c.prefill_us_per_token = 0;
        c.max_running = 64;
    });
    for (name, bytes) in [("hosts64", 2_000usize), ("hosts64_64kb", 64 * 1024)] {
        let mut spec = bed.spec(
            "bench-m",
            Some(json!({"lb_policy": "endpoint_metrics", "lb_config": {}})),
        );
        spec.pods = Vec::new();
        let mut cfg = spec.config();
        let mut endpoints: Vec<Value> = bed
            .pods
            .iter()
            .map(|p| json!({"address": p.addr.to_string(), "health": "Healthy", "metrics": vllm_text(0, bytes)}))
            .collect();
        for i in 0..62 {
            endpoints.push(
                json!({"address": format!("127.0.0.2:{}", 20000 + i), "health": "Healthy",
                "metrics": vllm_text(1_000_000, bytes)}),
            );
        }
        cfg["clusters"][0]["endpoints"] = Value::Array(endpoints);
        let gw = Gateway::start_config(&cfg, "bench-m")?;
        let us = vm_us_per_request(&gw, 100, 1000)?;
        anyhow::ensure!(
            gw.stat("ai_lb.metrics.routed") >= 1100,
            "requests were not routed by metrics"
        );
        println!("BENCH plugin_us_per_request_metrics_{name} {us:.1} us");
    }
    Ok(())
}

/// Scrape mode with 64 pods each serving a 64 KB metrics page: the page is parsed once per
/// scrape by the process's one scraper; a request only reads the shared snapshot, so its cost
/// must not grow with the page (compare with `plugin_us_per_request_metrics_hosts64`).
pub fn metrics_scrape_cpu() -> anyhow::Result<()> {
    for (name, bytes) in [
        ("scrape_hosts64", 2_000usize),
        ("scrape_hosts64_64kb", 64 * 1024),
    ] {
        let us = scrape_cpu_once(bytes)?;
        println!("BENCH plugin_us_per_request_metrics_{name} {us:.1} us");
    }
    Ok(())
}

fn scrape_cpu_once(page_bytes: usize) -> anyhow::Result<f64> {
    let page = std::env::temp_dir().join(format!(
        "ailb-bench-metrics-{}-{page_bytes}.txt",
        std::process::id()
    ));
    std::fs::write(&page, vllm_text(0, page_bytes))?;
    let bed = Bed::new(64, |c| {
        c.decode_us_per_token = 0;
        c.prefill_us_per_token = 0;
        c.max_running = 64;
        c.metrics = ailb_fakepod::MetricsSource::File(page.clone());
    });
    let plugin = json!({"lb_policy": "endpoint_metrics", "lb_config": {"metricsSource": "scrape",
        "scrapeCluster": "ailb-scrape", "scrapeIntervalMs": 500, "scrapeTimeoutMs": 400}});
    let mut spec = bed.spec("bench-scrape", Some(plugin));
    spec.extra_clusters = vec![json!({"name": "ailb-scrape", "type": "original_dst",
        "lb_policy": "round_robin", "timeout_ms": 1000, "connect_timeout_ms": 300})];
    let gw = Gateway::start(&spec)?;
    // Wait for the first snapshot, then measure.
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.stat("ai_lb.metrics.routed") == 0 {
        anyhow::ensure!(Instant::now() < deadline, "no scraped snapshot after 10 s");
        post_chat10(&gw)?;
    }
    let routed0 = gw.stat("ai_lb.metrics.routed");
    let us = vm_us_per_request(&gw, 100, 1000)?;
    anyhow::ensure!(
        gw.stat("ai_lb.metrics.routed") - routed0 >= 1090,
        "requests were not routed by scraped metrics"
    );
    let _ = std::fs::remove_file(&page);
    // VM time includes the scraper's ticks and parses (one proxy-wide scraper), amortised.
    Ok(us)
}

/// endpoint_metrics (scraping every 100 ms) vs the cluster's round-robin: 4 pods serving one
/// request at a time, heavy-tailed request sizes at ~75% of capacity, the same arrival
/// sequence. Round-robin queues short requests behind long ones; the metrics see the queues.
/// Queue imbalance = max − min waiting across pods, sampled every 20 ms and averaged.
pub fn metrics_vs_round_robin() -> anyhow::Result<()> {
    let bed = Bed::new(4, |c| {
        c.max_running = 1;
        c.decode_us_per_token = 2_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 10;
    });
    // Output tokens lognormal (median 50, sigma 1.2; mean ~100 tokens = ~0.2 s): 4 pods serve
    // ~20 rps, 600 requests in 40 s is ~75% of that.
    let workload = || lognormal_sizes(600, 40, 50.0, 1.2, 2000);
    let engines: Vec<_> = bed.pods.iter().map(|p| p.engine().clone()).collect();
    let run_with =
        |plugin: Option<Value>, tag: &str| -> anyhow::Result<(ailb_fakepod::load::Summary, f64)> {
            let mut spec = bed.spec(tag, plugin.clone());
            spec.cluster_lb = "round_robin".into();
            if plugin.is_some() {
                spec.extra_clusters = vec![json!({"name": "ailb-scrape", "type": "original_dst",
                "lb_policy": "round_robin", "timeout_ms": 1000, "connect_timeout_ms": 300})];
            }
            let gw = Gateway::start(&spec)?;
            let mut lc = LoadConfig::new(vec![gw.url.clone()], Workload::Skewed(workload()));
            lc.seed = 5;
            lc.timeout = Duration::from_secs(120);
            lc.admin_urls = bed.pods.iter().map(|p| p.url()).collect();
            lc.reset_pods = true;
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let sampler = {
                let stop = stop.clone();
                let engines = engines.clone();
                std::thread::spawn(move || {
                    let (mut sum, mut n) = (0.0, 0u64);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let w: Vec<usize> = engines.iter().map(|e| e.snapshot().waiting).collect();
                        let (max, min) = (
                            w.iter().max().copied().unwrap_or(0),
                            w.iter().min().copied().unwrap_or(0),
                        );
                        sum += (max - min) as f64;
                        n += 1;
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    sum / n.max(1) as f64
                })
            };
            let s = bed.rt.block_on(load::run(&lc));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let imbalance = sampler
                .join()
                .map_err(|_| anyhow::anyhow!("sampler panicked"))?;
            let s = s?;
            eprintln!("{tag}: {} (imbalance {imbalance:.2})", s.line());
            Ok((s, imbalance))
        };
    let plugin = json!({"lb_policy": "endpoint_metrics", "lb_config": {"metricsSource": "scrape",
        "scrapeCluster": "ailb-scrape", "scrapeIntervalMs": 100, "scrapeTimeoutMs": 200}});
    let (m, m_imb) = run_with(Some(plugin), "metrics")?;
    let (rr, rr_imb) = run_with(None, "round-robin")?;
    anyhow::ensure!(
        m.sequence == rr.sequence,
        "both runs must replay the same arrivals"
    );
    println!(
        "BENCH p99_ratio_metrics_vs_round_robin {:.2} ratio",
        m.latency_ms.p99 / rr.latency_ms.p99
    );
    println!("BENCH queue_imbalance_metrics {m_imb:.2} requests");
    println!("BENCH queue_imbalance_round_robin {rr_imb:.2} requests");
    Ok(())
}
