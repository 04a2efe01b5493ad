//! Cross-module tests: the real exposition samples (shared/data/metrics, copied verbatim into
//! `testdata/`; origins in docs/model-server-metrics.md §5), robustness against junk and
//! mutations, and parse → map → select end to end.

use super::engines::{self, MapError, ModelServer};
use super::prom::{self, label_value_limit, Exposition, MAX_LABELS, MAX_LINES, MAX_NAME_LEN};
use super::scheduler::{select, Candidate, Decision, MetricPolicy, RequestInfo, SchedulerConfig};
use super::{RateLimitWindow, SplitMix64};

const AIBRIX_V0: &str = include_str!("testdata/vllm-v0-aibrix-docs-sample.txt");
const ISSUE_7918: &str = include_str!("testdata/vllm-v0-issue7918-sample.txt");
const CACHE_CONFIG_V1: &str = include_str!("testdata/vllm-v1-cache-config-info-pr29605.txt");
const LORA_V1: &str = include_str!("testdata/vllm-v1-lora-requests-info-pr13504.txt");
const SGLANG_DOCS: &str = include_str!("testdata/sglang-docs-production-metrics-sample.txt");

/// The shared directory's samples, each with its verbatim twin (SGLang's docs sample above is
/// not one of them: it comes from sgl-project/sglang's docs).
const SAMPLES: &[(&str, &str)] = &[
    ("vllm-v0-aibrix-docs-sample.txt", AIBRIX_V0),
    ("vllm-v0-issue7918-sample.txt", ISSUE_7918),
    ("vllm-v1-cache-config-info-pr29605.txt", CACHE_CONFIG_V1),
    ("vllm-v1-lora-requests-info-pr13504.txt", LORA_V1),
];

fn clean(text: &str) -> Exposition {
    let e = prom::parse(text.as_bytes());
    assert_eq!(e.stats.malformed, 0, "{:?}", e.stats.first_error);
    assert_eq!(e.stats.truncated, None);
    e
}

/// Every file in the shared sample directory parses cleanly and has a verbatim twin here, so a
/// new sample cannot be added without a test. Set AI_LB_METRICS_SAMPLES to point elsewhere.
#[test]
fn every_shared_sample_parses_and_is_embedded() {
    let dir = std::env::var("AI_LB_METRICS_SAMPLES").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/metrics").to_owned()
    });
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipping: {dir} not present; embedded copies are tested below");
        return;
    };
    let mut seen = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        let body = std::fs::read(&path).unwrap();
        let e = prom::parse(&body);
        assert_eq!(e.stats.malformed, 0, "{path:?}: {:?}", e.stats.first_error);
        assert!(!e.samples.is_empty(), "{path:?}");
        let name = path.file_name().unwrap().to_str().unwrap();
        let twin = SAMPLES.iter().find(|(n, _)| *n == name);
        assert_eq!(
            twin.map(|(_, t)| t.as_bytes()),
            Some(&body[..]),
            "{name} not embedded verbatim"
        );
        seen += 1;
    }
    assert!(seen >= SAMPLES.len());
}

#[test]
fn aibrix_v0_sample() {
    let e = clean(AIBRIX_V0);
    assert_eq!(e.samples.len(), 29);
    assert_eq!(e.types.len(), 14);
    assert_eq!(
        e.metric_type("vllm:iteration_tokens_total"),
        Some(prom::MetricType::Histogram)
    );
    let bucket = e
        .series("vllm:iteration_tokens_total_bucket")
        .nth(7)
        .unwrap();
    assert_eq!((bucket.label("le"), bucket.value), (Some("40.0"), 998.0));
    let lora = e.series("vllm:lora_requests_info").next().unwrap();
    assert_eq!(lora.value, 1.7382173358407154e9);

    let (m, stats) = engines::scrape(AIBRIX_V0.as_bytes(), None);
    let m = m.unwrap();
    assert_eq!(m.engine, ModelServer::Vllm);
    assert_eq!(
        (m.waiting, m.running, m.kv_usage),
        (0.0, 0.0, Some(0.0)),
        "V0 gpu_cache_usage_perc"
    );
    assert_eq!(m.prefix_hit_rate, None, "gpu_prefix_cache_hit_rate = -1.0");
    let l = m.lora.unwrap();
    assert_eq!((l.max_lora, l.running.len(), l.waiting.len()), (0, 0, 0));
    assert_eq!((m.block_size, m.num_gpu_blocks), (Some(16), Some(81767)));
    assert_eq!(m.dp_groups, 1);
    // Filtered parse materialises only the 6 series read (histogram buckets etc. skipped).
    assert_eq!(stats.samples, 6);
    assert_eq!(stats.filtered_out, 23);
    assert_eq!(stats.malformed, 0);
}

#[test]
fn issue_7918_sample() {
    let e = clean(ISSUE_7918);
    assert_eq!(
        e.stats.lines, 5,
        "trailing blank line counted, not an error"
    );
    let s = e.samples.first().unwrap();
    assert_eq!(
        s.label("model_name"),
        Some("/data/models/model-gemma2-a100/experiment-it1")
    );
    let m = engines::map_exposition(&e, None).unwrap();
    assert_eq!(
        (m.engine, m.waiting, m.running, m.kv_usage, m.lora),
        (ModelServer::Vllm, 0.0, 0.0, None, None)
    );
}

#[test]
fn cache_config_only_sample() {
    let e = clean(CACHE_CONFIG_V1);
    let s = e.samples.first().unwrap();
    assert_eq!(s.labels.len(), 21);
    assert_eq!(
        (
            s.label("engine"),
            s.label("block_size"),
            s.label("num_gpu_blocks"),
            s.label("sliding_window")
        ),
        (Some("0"), Some("16"), Some("33676"), Some("None"))
    );
    assert_eq!(
        engines::map_exposition(&e, None),
        Err(MapError::NoLoadMetrics(ModelServer::Vllm))
    );
}

#[test]
fn lora_sample_takes_series_with_max_value() {
    let e = clean(LORA_V1);
    assert!(e.types.is_empty(), "no HELP/TYPE in this sample");
    let l = engines::lora_info(&e).unwrap();
    assert_eq!(l.running, vec!["test-lora"]);
    assert!(
        l.waiting.is_empty(),
        "2nd line (…5723949368) is newest, not the 3rd"
    );
    assert_eq!(l.max_lora, 1);
    assert_eq!(
        engines::map_exposition(&e, None),
        Err(MapError::NoLoadMetrics(ModelServer::Vllm))
    );
}

/// Structural bounds every parse must respect, whatever the input.
fn assert_bounded(input: &[u8], e: &Exposition) {
    assert!(e.stats.lines <= MAX_LINES);
    assert_eq!(e.stats.samples, e.samples.len());
    assert!(e.samples.len() + e.stats.malformed + e.stats.filtered_out <= e.stats.lines);
    let mut stored = 0usize;
    for s in &e.samples {
        assert!(!s.name.is_empty() && s.name.len() <= MAX_NAME_LEN);
        assert!(s.labels.len() <= MAX_LABELS);
        for (k, v) in &s.labels {
            assert!(k.len() <= MAX_NAME_LEN && v.len() <= label_value_limit(&s.name));
            stored += k.len() + v.len();
        }
        stored += s.name.len();
    }
    // Escapes only shrink text, so what is kept never exceeds what came in.
    assert!(stored <= input.len());
}

fn random_bytes(r: &mut SplitMix64, len: usize) -> Vec<u8> {
    // Skewed towards exposition syntax so the parser gets deep, not just rejects byte 0.
    const ALPHA: &[u8] = b"vllm:_num{}=\",\\n \t\r\n#0123456789.eE+-InfNaTYPEHELPle\xff\xc3";
    (0..len)
        .map(|_| {
            let x = r.next_u64();
            if x.is_multiple_of(4) {
                (x >> 8) as u8
            } else {
                ALPHA[(x >> 8) as usize % ALPHA.len()]
            }
        })
        .collect()
}

fn mutate(r: &mut SplitMix64, base: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..(1 + r.next_u64() % 8) {
        let len = v.len().max(1);
        let at = (r.next_u64() as usize) % len;
        match r.next_u64() % 6 {
            0 => v.truncate(at),
            1 => {
                if let Some(b) = v.get_mut(at) {
                    *b ^= 1 << (r.next_u64() % 8);
                }
            }
            2 => {
                let n = (r.next_u64() % 16) as usize;
                let junk = random_bytes(r, n);
                v.splice(at.min(v.len())..at.min(v.len()), junk);
            }
            3 => {
                let end = (at + (r.next_u64() % 64) as usize).min(v.len());
                v.drain(at.min(end)..end);
            }
            4 => {
                let end = (at + (r.next_u64() % 256) as usize).min(v.len());
                let chunk = v.get(at.min(end)..end).unwrap_or_default().to_vec();
                v.extend_from_slice(&chunk);
            }
            _ => {
                let b =
                    [b'"', b'\\', b'{', b'}', b',', b'\n', b' ', b'='][(r.next_u64() % 8) as usize];
                v.insert(at.min(v.len()), b);
            }
        }
    }
    v
}

/// Property test: 6,000 random and mutated pages never panic and stay within the bounds, and the
/// whole pipeline (filtered parse → map → select) copes with whatever comes out.
#[test]
fn fuzz_random_and_mutated_inputs() {
    let mut r = SplitMix64(0x5eed);
    let cfgs = [
        SchedulerConfig::default(),
        SchedulerConfig {
            policy: MetricPolicy::Weighted,
            rate_limit: 0.3,
            ..Default::default()
        },
        SchedulerConfig {
            policy: MetricPolicy::Least,
            ..Default::default()
        },
    ];
    let extra = engines::ExtraMetric {
        name: "vllm:num_requests_running".to_owned(),
        aggregation: engines::Aggregation::Sum,
    };
    let mut window = RateLimitWindow::new();
    let mut mapped = 0;
    for case in 0..6_000u32 {
        let input = if case.is_multiple_of(3) {
            let len = (r.next_u64() % 2_000) as usize;
            random_bytes(&mut r, len)
        } else {
            let (_, base) = SAMPLES[(r.next_u64() as usize) % SAMPLES.len()];
            mutate(&mut r, base.as_bytes())
        };
        let e = prom::parse(&input);
        assert_bounded(&input, &e);
        let (m, stats) = engines::scrape(&input, Some(&extra));
        assert!(stats.samples <= e.samples.len());
        if let Ok(m) = &m {
            mapped += 1;
            assert!(m.waiting >= 0.0 && m.running >= 0.0 && m.waiting.is_finite());
            assert!(m.kv_usage.is_none_or(|k| (0.0..=1.0).contains(&k)));
        }
        let cands: Vec<Candidate> = (0..3)
            .map(|i| Candidate {
                addr: format!("p{i}"),
                metrics: m.clone().ok(),
                in_flight_since_scrape: (r.next_u64() % 5) as u32,
            })
            .collect();
        let req = RequestInfo {
            model: "m",
            lora_adapter: Some("test-lora"),
            sheddable: case.is_multiple_of(2),
        };
        let cfg = &cfgs[case as usize % cfgs.len()];
        let d = select(&cands, &req, cfg, Some(&mut window), &mut || r.next_u64());
        if let Decision::Pick { index, .. } = d {
            assert!(index < cands.len());
        }
    }
    assert!(
        mapped > 500,
        "mutations should often keep a mappable page: {mapped}"
    );
}

#[test]
fn ten_megabytes_of_junk_is_bounded() {
    let mut r = SplitMix64(42);
    let junk = random_bytes(&mut r, 10 * 1024 * 1024);
    let e = prom::parse(&junk);
    assert_eq!(e.stats.truncated, Some(prom::Truncation::InputBytes));
    assert_bounded(&junk, &e);

    // One endless label value, one endless line of digits, nothing but newlines.
    let mut long_label = b"vllm:num_requests_waiting{model_name=\"".to_vec();
    long_label.resize(10 * 1024 * 1024, b'a');
    let e = prom::parse(&long_label);
    assert!(e.samples.is_empty());
    let digits = vec![b'1'; 10 * 1024 * 1024];
    assert!(prom::parse(&digits).samples.is_empty());
    let newlines = vec![b'\n'; 10 * 1024 * 1024];
    let e = prom::parse(&newlines);
    assert_eq!(e.stats.lines, MAX_LINES);
    let (m, _) = engines::scrape(&junk, None);
    assert!(m.is_err());
}

/// Scrape → snapshot → pick, with one DP pod, one plain pod, one pod with a broken page.
#[test]
fn end_to_end_pick() {
    let busy = "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 4\n\
                vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 4\n\
                vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 30\n\
                vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n";
    let idle = "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n\
                vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\n\
                vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.1\n";
    let cands: Vec<Candidate> = [busy, idle, "<html>502 Bad Gateway</html>"]
        .iter()
        .enumerate()
        .map(|(i, body)| Candidate {
            addr: format!("10.0.0.{i}:8000"),
            metrics: engines::scrape(body.as_bytes(), None).0.ok(),
            in_flight_since_scrape: 0,
        })
        .collect();
    assert!(cands[2].metrics.is_none());
    let mut r = SplitMix64(9);
    let req = RequestInfo {
        model: "m",
        lora_adapter: None,
        sheddable: true,
    };
    let d = select(&cands, &req, &SchedulerConfig::default(), None, &mut || {
        r.next_u64()
    });
    assert_eq!(
        d,
        Decision::Pick {
            index: 1,
            rate_limited: false
        },
        "busy pod has 8 waiting > 5"
    );
}

/// A vLLM V1 page as `vllm/v1/metrics/loggers.py` renders it with two data-parallel engines and
/// `--enable-lora`: process metrics, then the scheduler gauges in registration order (running,
/// waiting, sleep state), LoRA info, KV use, prefix-cache counters with `_created`, histograms,
/// cache config (docs/model-server-metrics.md §1.1).
fn vllm_v1_page(waiting: [u32; 2], histogram_buckets: usize) -> String {
    use std::fmt::Write as _;
    let mut p = String::from(
        "# HELP python_gc_objects_collected_total Objects collected during gc\n\
         # TYPE python_gc_objects_collected_total counter\n\
         python_gc_objects_collected_total{generation=\"0\"} 12187.0\n\
         # HELP process_resident_memory_bytes Resident memory size in bytes.\n\
         # TYPE process_resident_memory_bytes gauge\n\
         process_resident_memory_bytes 1.2345e+09\n",
    );
    let l = |e: usize| format!("engine=\"{e}\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"");
    let gauge = |p: &mut String, name: &str, help: &str, vals: [String; 2]| {
        let _ = writeln!(p, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (e, v) in vals.iter().enumerate() {
            let _ = writeln!(p, "{name}{{{}}} {v}", l(e));
        }
    };
    gauge(
        &mut p,
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        ["12.0".into(), "9.0".into()],
    );
    gauge(
        &mut p,
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        waiting.map(|w| format!("{w}.0")),
    );
    let _ = writeln!(
        p,
        "# HELP vllm:engine_sleep_state Engine sleep state\n# TYPE vllm:engine_sleep_state gauge"
    );
    for e in 0..2 {
        for (s, v) in [("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)] {
            let _ = writeln!(
                p,
                "vllm:engine_sleep_state{{{},sleep_state=\"{s}\"}} {v}.0",
                l(e)
            );
        }
    }
    p.push_str(
        "# HELP vllm:lora_requests_info Running stats on lora requests.\n\
         # TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql-lora\",waiting_lora_adapters=\"\"} 1.7502e+09\n\
         vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql-lora,tweet-lora\",waiting_lora_adapters=\"tweet-lora\"} 1.7503e+09\n",
    );
    gauge(
        &mut p,
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        ["0.25".into(), "0.75".into()],
    );
    for name in ["vllm:prefix_cache_queries", "vllm:prefix_cache_hits"] {
        let _ = writeln!(p, "# HELP {name} Prefix cache.\n# TYPE {name} counter");
        for e in 0..2 {
            let _ = writeln!(p, "{name}_total{{{}}} 4096.0", l(e));
            let _ = writeln!(p, "{name}_created{{{}}} 1.7501e+09", l(e));
        }
    }
    for name in [
        "vllm:iteration_tokens_total",
        "vllm:e2e_request_latency_seconds",
    ] {
        let _ = writeln!(p, "# HELP {name} Histogram.\n# TYPE {name} histogram");
        for e in 0..2 {
            for b in 0..histogram_buckets {
                let _ = writeln!(p, "{name}_bucket{{{},le=\"{b}.0\"}} {}.0", l(e), b * 3);
            }
            let _ = writeln!(p, "{name}_bucket{{{},le=\"+Inf\"}} 999.0", l(e));
            let _ = writeln!(
                p,
                "{name}_count{{{}}} 999.0\n{name}_sum{{{}}} 1234.5",
                l(e),
                l(e)
            );
        }
    }
    p.push_str(
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"33676\"} 1.0\n",
    );
    p
}

/// Property over every cut of a real-format page (the Higress host's 64 KiB cut, the scraper's
/// 4 MiB one): a cut page either makes the pod unknown or reads exactly what the whole page
/// reads; it never makes the pod look idler. The same cuts read the old way (a page under the
/// limit taken as whole) do look idler, so this test catches the defect.
#[test]
fn every_cut_of_a_page_reads_unknown_or_the_whole_truth() {
    let page = vllm_v1_page([3, 1234], 6);
    let full = engines::scrape_page(page.as_bytes(), usize::MAX, None);
    assert!(full.unknown.is_empty(), "{:?}", full.unknown);
    let full = full.result.unwrap();
    assert_eq!(
        (full.waiting, full.running, full.kv_usage),
        (1237.0, 21.0, Some(0.5))
    );
    let (mut unknown, mut known, mut idler_the_old_way) = (0, 0, 0);
    for len in 0..page.len() {
        let cut = &page.as_bytes()[..len];
        let out = engines::scrape_page(cut, len, None);
        match out.result {
            Ok(m) => {
                known += 1;
                assert_eq!(
                    (m.waiting, m.running, m.kv_usage, m.dp_groups),
                    (full.waiting, full.running, full.kv_usage, full.dp_groups),
                    "cut at {len}"
                );
                assert!(m.lora.is_none() || m.lora == full.lora, "cut at {len}");
                assert!(
                    m.prefix_cache_counters.is_none()
                        || m.prefix_cache_counters == full.prefix_cache_counters
                );
            }
            Err(e) => {
                unknown += 1;
                assert!(
                    matches!(e, MapError::LoadUnknown(_) | MapError::UnknownEngine),
                    "cut at {len}: {e:?}"
                );
            }
        }
        if let (Ok(old), _) = engines::scrape(cut, None) {
            if old.waiting < full.waiting || old.running < full.running {
                idler_the_old_way += 1;
            }
        }
    }
    assert!(known > 1000 && unknown > 500, "{known} {unknown}");
    assert!(idler_the_old_way > 100, "{idler_the_old_way}");
}

/// The scraper reads at most 4 MiB of a page (`MAX_SCRAPE_BYTES`, `prom::MAX_INPUT_BYTES`): a
/// vLLM page with big histograms before its queue gauge arrives cut before the gauge. Before,
/// the gauge read as absent = 0 waiting: the busiest pod looked idle.
#[test]
fn a_queue_gauge_past_the_four_mib_cut_is_unknown_not_zero() {
    use std::fmt::Write as _;
    let mut page = String::from("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 7.0\n");
    let mut i = 0u64;
    while page.len() < 5 * 1024 * 1024 {
        let _ = writeln!(
            page,
            "vllm:request_prompt_tokens_bucket{{engine=\"0\",le=\"{i}.0\",model_name=\"m\"}} {i}.0"
        );
        i += 1;
    }
    page.push_str("vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 250.0\n");
    // What the scraper reads, and what it gets from the host when the body is bigger.
    let read = &page.as_bytes()[..prom::MAX_INPUT_BYTES];
    let out = engines::scrape_page(read, prom::MAX_INPUT_BYTES, None);
    assert_eq!(out.result, Err(MapError::LoadUnknown(ModelServer::Vllm)));
    assert_eq!(out.stats.truncated, Some(prom::Truncation::InputBytes));
    assert!(out
        .unknown
        .iter()
        .any(|u| u.metric == "vllm:num_requests_waiting" && u.why == engines::Unknown::Cut));
}

/// Issue 39 item 3: a cut page is read for every family its kept part proves whole. The text
/// format keeps a family's lines together, so a later family's `# HELP` / `# TYPE` line, or
/// the partial line the cut left when it begins another family, ends the one before it.
/// Before, only a later sample line did: a cut through the next family's comments left the
/// last gauge (here KV use) open, and the pod unknown.
#[test]
fn a_cut_after_the_next_familys_comments_reads_the_gauges_before_it() {
    let gauges = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
                  vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1.0\n\
                  vllm:engine_sleep_state{engine=\"0\",model_name=\"m\",sleep_state=\"awake\"} 1.0\n\
                  vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n";
    let next = "# HELP vllm:iteration_tokens_total Histogram of tokens per engine step.\n\
                # TYPE vllm:iteration_tokens_total histogram\n\
                vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"1.0\"} 3.0\n";
    let page = format!("{}{gauges}{next}", "# padding\n".repeat(6000));
    let at_gauges_end = page.find("# HELP vllm:iteration").unwrap();
    for cut in [
        at_gauges_end + "# HELP vllm:iter".len(),
        page.find("vllm:iteration_tokens_total_bucket").unwrap() + 9,
    ] {
        let out = engines::scrape_page(&page.as_bytes()[..cut], cut, None);
        let m = out
            .result
            .unwrap_or_else(|e| panic!("cut at {cut}: {e:?} {:?}", out.unknown));
        assert_eq!((m.waiting, m.running, m.kv_usage), (1.0, 3.0, Some(0.5)));
    }
    // Cut inside KV's own line, or right after it: KV may go on past the cut.
    for cut in [at_gauges_end - 3, at_gauges_end] {
        let out = engines::scrape_page(&page.as_bytes()[..cut], cut, None);
        assert_eq!(
            out.result,
            Err(MapError::LoadUnknown(ModelServer::Vllm)),
            "{cut}"
        );
    }
}

/// SGLang's own sample page (its docs, before the disaggregation queue gauges): read whole, and
/// unknown at every cut, since a cut page cannot prove those gauges absent (docs/metrics.md
/// "Cut pages"); never a reading that lacks the queue at the end of the page.
#[test]
fn sglang_docs_sample_whole_and_cut() {
    let e = clean(SGLANG_DOCS);
    assert_eq!(e.samples.len(), 91);
    let m = engines::map_exposition(&e, None).unwrap();
    assert_eq!(m.engine, ModelServer::Sglang);
    assert_eq!(
        (m.waiting, m.running, m.kv_usage),
        (2826.0, 162.0, Some(0.28))
    );
    assert_eq!(m.prefix_hit_rate, Some(0.007507552643049313));
    assert_eq!(
        (m.block_size, m.num_gpu_blocks, m.dp_groups),
        (None, None, 1)
    );
    for len in (0..SGLANG_DOCS.len()).step_by(7) {
        let out = engines::scrape_page(&SGLANG_DOCS.as_bytes()[..len], len, None);
        assert!(
            matches!(
                out.result,
                Err(MapError::LoadUnknown(_) | MapError::UnknownEngine)
            ),
            "cut at {len}: {:?}",
            out.result
        );
    }
}
