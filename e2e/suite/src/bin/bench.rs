//! End-to-end benchmarks (`make bench`): one `BENCH <name> <value> <unit>` line per figure.
//! Every ratio is measured side by side in the same run.

use ailb_e2e::bed::{wait_for_zero, Bed};
use ailb_e2e::gateway::{glr_config, http, Gateway};
use ailb_e2e::storm;
use ailb_fakepod::load::{self, Arrivals, LoadConfig, SkewedSpec, Workload};
use ailb_fakepod::rng::Dist;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// `ailb-bench [cpu] [leak] [p99] [prefix] [metrics]`: the named sections only (all by default).
fn main() -> anyhow::Result<()> {
    let only: Vec<String> = std::env::args().skip(1).collect();
    let run = |name: &str| only.is_empty() || only.iter().any(|a| a == name);
    if run("cpu") {
        plugin_cpu_and_added_latency()?;
    }
    if run("leak") {
        leak_check()?;
    }
    if run("p99") {
        p99_vs_local_least_request()?;
    }
    if run("prefix") {
        prefix_cpu()?;
        prefix_vs_round_robin()?;
    }
    if run("metrics") {
        metrics_plugin_cpu()?;
        metrics_scrape_cpu()?;
        metrics_vs_round_robin()?;
    }
    Ok(())
}

/// A vLLM V1 page of about `bytes` (the fake pod's families plus padding histograms).
fn vllm_text(waiting: u32, bytes: usize) -> String {
    let mut s = format!(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"0\",model_name=\"fake-model\"}} 1\n\
         # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"0\",model_name=\"fake-model\"}} {waiting}\n\
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
fn metrics_plugin_cpu() -> anyhow::Result<()> {
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
fn metrics_scrape_cpu() -> anyhow::Result<()> {
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
fn metrics_vs_round_robin() -> anyhow::Result<()> {
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

/// A 10-turn chat of about 8 KB.
fn chat10() -> Vec<u8> {
    let mut messages =
        vec![json!({"role": "system", "content": "You are a helpful assistant. ".repeat(12)})];
    for i in 0..10 {
        messages.push(json!({"role": "user", "content": format!("question {i}: {}", "lorem ipsum dolor sit amet ".repeat(10))}));
        messages.push(json!({"role": "assistant", "content": format!("answer {i}: {}", "consectetur adipiscing elit ".repeat(12))}));
    }
    json!({"model": "fake-model", "messages": messages, "max_tokens": 1})
        .to_string()
        .into_bytes()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Plugin CPU per request from the emulator's VM-time counters, and the latency the gateway
/// (emulator + plugin + Redis) adds over going straight to the pod, interleaved request by
/// request so both see the same machine state.
fn plugin_cpu_and_added_latency() -> anyhow::Result<()> {
    let bed = Bed::new(2, |c| {
        c.decode_us_per_token = 0;
        c.prefill_us_per_token = 0;
        c.max_running = 64;
    });
    let gw = Gateway::start(&bed.spec("bench", Some(glr_config(bed.redis.port, json!({})))))?;
    let body = chat10();
    assert!(body.len() > 7000, "chat10 body is {} bytes", body.len());
    let post = |base: &str| -> anyhow::Result<Duration> {
        let t = Instant::now();
        let (status, _, _) = http(
            base,
            "POST",
            "/v1/chat/completions",
            &[("content-type", "application/json")],
            &body,
        )?;
        anyhow::ensure!(status == 200, "status {status}");
        Ok(t.elapsed())
    };
    for _ in 0..200 {
        post(&gw.url)?; // warm-up: connections, JIT'd code paths, Redis script cache
    }
    let (ns0, n0) = (
        gw.stat("gateway.vm_call_ns"),
        gw.stat("gateway.streams_destroyed"),
    );
    let direct_url = bed.pods[0].url();
    let (mut via, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..2000 {
        via.push(post(&gw.url)?.as_secs_f64() * 1e3);
        direct.push(post(&direct_url)?.as_secs_f64() * 1e3);
    }
    let (ns1, n1) = (
        gw.stat("gateway.vm_call_ns"),
        gw.stat("gateway.streams_destroyed"),
    );
    anyhow::ensure!(
        n1 > n0,
        "the emulator reports no VM time (gateway.vm_call_ns)"
    );
    println!(
        "BENCH plugin_us_per_request_chat10 {:.1} us",
        (ns1 - ns0) as f64 / (n1 - n0) as f64 / 1e3
    );
    via.sort_by(f64::total_cmp);
    direct.sort_by(f64::total_cmp);
    println!(
        "BENCH gateway_added_ms_p50 {:.3} ms",
        percentile(&via, 0.5) - percentile(&direct, 0.5)
    );
    println!(
        "BENCH gateway_added_ms_p99 {:.3} ms",
        percentile(&via, 0.99) - percentile(&direct, 0.99)
    );
    Ok(())
}

/// The fault storm of the e2e suite, sized for the benchmark: every count must come back to 0.
fn leak_check() -> anyhow::Result<()> {
    let mut bed = storm::bed();
    let (a, b) = storm::gateways(&bed, 15)?;
    let lc = storm::load(
        vec![a.url.clone(), b.url.clone()],
        2000,
        Duration::from_secs(15),
        11,
    );
    let summary = storm::run_with_chaos(&mut bed, lc, 3, Duration::from_millis(2500))?;
    let left = wait_for_zero(&bed, Duration::from_secs(20));
    eprintln!("leak check: {}", summary.line());
    println!("BENCH leak_check_requests {} requests", summary.count);
    println!(
        "BENCH leaked_counts {} counts",
        left.total() as i64 + left.leases.max(0)
    );
    Ok(())
}

/// Photoroom's "local view" setting: 4 gateway processes, 8 pods, ~1 s requests (scaled) with
/// skewed sizes; the same arrival sequence once with the plugin and once with each gateway
/// worker's own least-request.
fn p99_vs_local_least_request() -> anyhow::Result<()> {
    // Pods take 2 requests at a time and the pool runs at about 90% of its capacity, so the
    // tail is made of queueing, which is what a local view causes.
    let bed = Bed::new(8, |c| {
        c.max_running = 2;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 10;
    });
    // ~1 s median (100 tokens x 10 ms); 16 slots x 0.9 / ~1.05 s = ~13.7 rps.
    let workload = || lognormal_sizes(600, 44, 100.0, 0.3, 500);
    let least_request =
        |spec: &mut ailb_e2e::gateway::GatewaySpec| spec.cluster_lb = "least_request".into();
    let run_with = |plugin: Option<Value>, tag: &str| {
        bed.replay(
            tag,
            4,
            plugin,
            least_request,
            Workload::Skewed(workload()),
            3,
        )
    };
    let glr = run_with(Some(glr_config(bed.redis.port, json!({}))), "glr")?;
    let local = run_with(None, "local")?;
    anyhow::ensure!(
        glr.sequence == local.sequence,
        "both runs must replay the same arrivals"
    );
    println!(
        "BENCH p99_ratio_glr_vs_local_least_request {:.2} ratio",
        glr.latency_ms.p99 / local.latency_ms.p99
    );
    Ok(())
}

fn prefix_config(port: u16) -> Value {
    json!({"lb_policy": "prefix_cache", "lb_config": {"serviceFQDN": "redis.static", "servicePort": port, "timeout": 1000}})
}

/// Plugin CPU per request for prefix_cache on the 10-turn ~8 KB chat: canonicalisation, SHA-1
/// chain and key formatting happen in the plugin on every request.
fn prefix_cpu() -> anyhow::Result<()> {
    let bed = Bed::new(2, |c| {
        c.decode_us_per_token = 0;
        c.prefill_us_per_token = 0;
        c.max_running = 64;
    });
    let gw = Gateway::start(&bed.spec("bench-px", Some(prefix_config(bed.redis.port))))?;
    let us = vm_us_per_request(&gw, 200, 2000)?;
    anyhow::ensure!(
        gw.stat("ai_lb.prefix.hit") > 0,
        "prefix_cache did not route"
    );
    println!("BENCH plugin_us_per_request_prefix_chat10 {us:.1} us");
    Ok(())
}

/// The Higress blog's GenAI-Perf setting, timings scaled down: 60 sessions x 5 rounds, ~200 new
/// prompt tokens per round, concurrency 20, shared system prompts, 2 gateways, 4 pods. The same
/// plan once through prefix_cache and once through per-gateway round-robin.
fn prefix_vs_round_robin() -> anyhow::Result<()> {
    let bed = Bed::new(4, |c| {
        c.max_running = 8;
        c.prefill_us_per_token = 200;
        c.decode_us_per_token = 5_000;
        c.decode_batch_penalty = 0.0;
    });
    let run_with = |plugin: Option<Value>, tag: &str| {
        bed.replay(
            tag,
            2,
            plugin,
            |_| {},
            Workload::Sessions(Default::default()),
            5,
        )
    };
    let px = run_with(Some(prefix_config(bed.redis.port)), "prefix")?;
    let rr = run_with(None, "rr")?;
    anyhow::ensure!(
        px.sequence == rr.sequence,
        "both runs must replay the same plan"
    );
    let hit =
        |s: &ailb_fakepod::load::Summary| s.pods.as_ref().map_or(f64::NAN, |p| p.prefix_hit_rate);
    println!("BENCH prefix_hit_rate {:.3} ratio", hit(&px));
    println!("BENCH prefix_hit_rate_round_robin {:.3} ratio", hit(&rr));
    println!(
        "BENCH ttft_p50_ratio_vs_round_robin {:.2} ratio",
        px.ttft_ms.p50 / rr.ttft_ms.p50
    );
    println!(
        "BENCH ttft_p99_ratio_vs_round_robin {:.2} ratio",
        px.ttft_ms.p99 / rr.ttft_ms.p99
    );
    Ok(())
}

/// `count` open-loop arrivals over `seconds`, output lengths lognormal(`median`, `sigma`)
/// capped at `max_tokens`, prompts up to 1000 tokens.
fn lognormal_sizes(
    count: usize,
    seconds: u64,
    median: f64,
    sigma: f64,
    max_tokens: u64,
) -> SkewedSpec {
    let mut s = SkewedSpec {
        arrivals: Arrivals::Count {
            count,
            duration: Duration::from_secs(seconds),
        },
        ..SkewedSpec::default()
    };
    s.max_tokens.dist = Dist::LogNormal { median, sigma };
    s.max_tokens.max = max_tokens;
    s.prompt_tokens.max = 1000;
    s
}

/// POSTs the 10-turn chat through `gw`; anything but 200 is an error.
fn post_chat10(gw: &Gateway) -> anyhow::Result<()> {
    let (status, _, _) = http(
        &gw.url,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        &chat10(),
    )?;
    anyhow::ensure!(status == 200, "status {status}");
    Ok(())
}

/// Plugin CPU per request: the emulator's VM time (plugin code and the host calls it makes)
/// over `n` requests, after `warm` unmeasured ones.
fn vm_us_per_request(gw: &Gateway, warm: usize, n: usize) -> anyhow::Result<f64> {
    for _ in 0..warm {
        post_chat10(gw)?;
    }
    let (ns0, n0) = (
        gw.stat("gateway.vm_call_ns"),
        gw.stat("gateway.streams_destroyed"),
    );
    for _ in 0..n {
        post_chat10(gw)?;
    }
    let (ns1, n1) = (
        gw.stat("gateway.vm_call_ns"),
        gw.stat("gateway.streams_destroyed"),
    );
    anyhow::ensure!(
        n1 > n0 && ns1 > ns0,
        "the emulator reports no VM time (gateway.vm_call_ns)"
    );
    Ok((ns1 - ns0) as f64 / (n1 - n0) as f64 / 1e3)
}
