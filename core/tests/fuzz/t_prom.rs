//! The Prometheus parser and the engine mapping (`model_metrics::prom`, `engines`): the real
//! pages in `src/model_metrics/testdata` and generated well-formed pages of every engine (with
//! data-parallel series, NaN/±Inf/negative/huge values, noise families), mutated as bytes.
//!
//! Properties: never panics; output bounded by the input (lines, samples, label sizes); a
//! filtered parse keeps exactly the wanted samples of the full parse; a mapped snapshot holds
//! finite, non-negative loads and shares within 0..=1; a JSON body is recognised as such; the
//! scheduler copes with whatever mapped. On a well-formed page cut at any length (the scraper's
//! and Higress's limits): the pod is unknown, or reads exactly what the whole page reads —
//! never idler.

use crate::gen::{drive, mutate_bytes, Rng};
use ailb_core::model_metrics::engines::{self, looks_like_json};
use ailb_core::model_metrics::prom::{
    self, label_value_limit, MAX_LABELS, MAX_LINES, MAX_NAME_LEN,
};
use ailb_core::model_metrics::scheduler::select;
use ailb_core::model_metrics::{
    Aggregation, Candidate, Decision, EndpointMetrics, ExtraMetric, MapError, MetricPolicy,
    RateLimitWindow, RequestInfo, SchedulerConfig, SplitMix64,
};

fn seeds() -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/model_metrics/testdata");
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    out.sort();
    out
}

const DICT: &[&[u8]] = &[
    b"vllm:num_requests_waiting",
    b"vllm:num_requests_running",
    b"vllm:kv_cache_usage_perc",
    b"vllm:engine_sleep_state",
    b"sglang:num_queue_reqs",
    b"sglang:num_decode_transfer_queue_reqs",
    b"nv_trt_llm_request_metrics",
    b"{engine=\"1\",model_name=\"m\"}",
    b"{",
    b"}",
    b"=\"",
    b"\\\"",
    b"\\n",
    b"# TYPE ",
    b"# HELP ",
    b" NaN",
    b" +Inf",
    b" -Inf",
    b" -1",
    b" 1e400",
    b"\n",
    b"\r\n",
];

/// A value: usually plausible, sometimes what broken exporters emit.
fn value(rng: &mut Rng, ratio: bool) -> String {
    if rng.chance(1, 10) {
        return rng
            .pick(&[
                "NaN", "+Inf", "-Inf", "-1.0", "-0.0", "1e12", "1.7", "2e9", "1e308",
            ])
            .to_string();
    }
    if ratio {
        format!("{}", rng.below(1001) as f64 / 1000.0)
    } else {
        format!("{}.0", rng.below(50))
    }
}

struct Family {
    name: String,
    kind: &'static str,
    lines: Vec<String>,
}

/// Series of one family per data-parallel engine: `name{labels} value`, labels sorted.
fn per_engine(rng: &mut Rng, name: &str, dp: usize, dp_label: &str, ratio: bool) -> Family {
    let lines = (0..dp)
        .map(|e| {
            format!(
                "{name}{{{dp_label}=\"{e}\",model_name=\"m\"}} {}",
                value(rng, ratio)
            )
        })
        .collect();
    Family {
        name: name.to_string(),
        kind: "gauge",
        lines,
    }
}

fn noise(rng: &mut Rng, i: usize) -> Family {
    let name = format!("noise{i}:latency_seconds");
    let mut lines = Vec::new();
    for b in 0..rng.len(30) {
        lines.push(format!("{name}_bucket{{le=\"{b}.0\"}} {}", b * 2));
    }
    lines.push(format!("{name}_bucket{{le=\"+Inf\"}} 99"));
    lines.push(format!("{name}_count 99"));
    lines.push(format!("{name}_sum 12.5"));
    Family {
        name,
        kind: "histogram",
        lines,
    }
}

/// A well-formed single-engine page: every family's lines together, in random family order.
fn page(rng: &mut Rng) -> String {
    let dp = 1 + rng.below(3);
    let mut fams: Vec<Family> = Vec::new();
    match rng.below(5) {
        0 => {
            for n in ["vllm:num_requests_running", "vllm:num_requests_waiting"] {
                fams.push(per_engine(rng, n, dp, "engine", false));
            }
            for n in ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"] {
                if rng.chance(2, 3) {
                    fams.push(per_engine(rng, n, dp, "engine", true));
                }
            }
            if rng.chance(2, 3) {
                let mut lines = Vec::new();
                for e in 0..dp {
                    let asleep = rng.chance(1, 5);
                    for (state, v) in [
                        ("awake", !asleep),
                        ("weights_offloaded", asleep),
                        ("discard_all", false),
                    ] {
                        let v = if rng.chance(1, 20) {
                            "NaN".to_string()
                        } else {
                            format!("{}.0", u8::from(v))
                        };
                        lines.push(format!(
                            "vllm:engine_sleep_state{{engine=\"{e}\",model_name=\"m\",sleep_state=\"{state}\"}} {v}"
                        ));
                    }
                }
                fams.push(Family {
                    name: "vllm:engine_sleep_state".into(),
                    kind: "gauge",
                    lines,
                });
            }
            if rng.chance(1, 2) {
                let lines = (0..1 + rng.below(3))
                    .map(|i| format!(
                        "vllm:lora_requests_info{{max_lora=\"2\",running_lora_adapters=\"a{i}\",waiting_lora_adapters=\"\"}} 1.75e+09"
                    ))
                    .collect();
                fams.push(Family {
                    name: "vllm:lora_requests_info".into(),
                    kind: "gauge",
                    lines,
                });
            }
            if rng.chance(1, 2) {
                for n in ["vllm:prefix_cache_queries", "vllm:prefix_cache_hits"] {
                    let mut lines = Vec::new();
                    for e in 0..dp {
                        lines.push(format!(
                            "{n}_total{{engine=\"{e}\",model_name=\"m\"}} {}",
                            value(rng, false)
                        ));
                        lines.push(format!(
                            "{n}_created{{engine=\"{e}\",model_name=\"m\"}} 1.75e+09"
                        ));
                    }
                    fams.push(Family {
                        name: n.into(),
                        kind: "counter",
                        lines,
                    });
                }
            }
            if rng.chance(1, 2) {
                fams.push(Family {
                    name: "vllm:cache_config_info".into(),
                    kind: "gauge",
                    lines: vec!["vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"33676\"} 1.0".into()],
                });
            }
        }
        1 => {
            for n in ["sglang:num_running_reqs", "sglang:num_queue_reqs"] {
                fams.push(per_engine(rng, n, dp, "dp_rank", false));
            }
            for n in [
                "sglang:num_prefill_bootstrap_queue_reqs",
                "sglang:num_prefill_inflight_queue_reqs",
                "sglang:num_decode_prealloc_queue_reqs",
                "sglang:num_decode_transfer_queue_reqs",
            ] {
                if rng.chance(3, 4) {
                    fams.push(per_engine(rng, n, dp, "dp_rank", false));
                }
            }
            for n in ["sglang:token_usage", "sglang:cache_hit_rate"] {
                fams.push(per_engine(rng, n, dp, "dp_rank", true));
            }
        }
        2 => {
            let mut lines = Vec::new();
            for t in ["active", "scheduled", "waiting", "context", "max"] {
                if rng.chance(4, 5) {
                    lines.push(format!(
                        "nv_trt_llm_request_metrics{{model=\"tensorrt_llm\",request_type=\"{t}\",version=\"1\"}} {}",
                        value(rng, false)
                    ));
                }
            }
            fams.push(Family {
                name: "nv_trt_llm_request_metrics".into(),
                kind: "gauge",
                lines,
            });
            let mut lines = Vec::new();
            for t in ["fraction", "used", "max", "tokens_per"] {
                if rng.chance(3, 4) {
                    lines.push(format!(
                        "nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type=\"{t}\",model=\"tensorrt_llm\",version=\"1\"}} {}",
                        value(rng, t == "fraction")
                    ));
                }
            }
            fams.push(Family {
                name: "nv_trt_llm_kv_cache_block_metrics".into(),
                kind: "gauge",
                lines,
            });
        }
        3 => {
            for (n, ratio) in [
                ("trtllm_num_requests_waiting", false),
                ("trtllm_num_requests_running", false),
                ("trtllm_kv_cache_utilization", true),
                ("trtllm_kv_cache_tokens_per_block", false),
            ] {
                fams.push(Family {
                    name: n.into(),
                    kind: "gauge",
                    lines: vec![format!("{n} {}", value(rng, ratio))],
                });
            }
        }
        _ => {
            for n in ["tgi_queue_size", "tgi_batch_current_size"] {
                fams.push(Family {
                    name: n.into(),
                    kind: "gauge",
                    lines: vec![format!("{n} {}", value(rng, false))],
                });
            }
        }
    }
    for i in 0..rng.len(6) {
        fams.push(noise(rng, i));
    }
    // Shuffle the family order (Fisher-Yates).
    for i in (1..fams.len()).rev() {
        let j = rng.below(i + 1);
        fams.swap(i, j);
    }
    let mut out = String::new();
    for f in &fams {
        if rng.chance(2, 3) {
            out.push_str(&format!(
                "# HELP {} help text\n# TYPE {} {}\n",
                f.name, f.name, f.kind
            ));
        }
        for l in &f.lines {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

fn generate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    match rng.below(4) {
        0 => page(rng).into_bytes(),
        1 => {
            let p = page(rng);
            mutate_bytes(rng, p.as_bytes(), seeds, DICT, 1 << 20)
        }
        _ => {
            let s = rng.pick(seeds).clone();
            mutate_bytes(rng, &s, seeds, DICT, 1 << 20)
        }
    }
}

fn bounded(input: &[u8], e: &prom::Exposition) {
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
    assert!(stored <= input.len());
}

fn sane(m: &EndpointMetrics) {
    assert!(m.waiting.is_finite() && m.waiting >= 0.0, "{m:?}");
    assert!(m.running.is_finite() && m.running >= 0.0, "{m:?}");
    assert!(m.kv_usage.is_none_or(|k| (0.0..=1.0).contains(&k)), "{m:?}");
    assert!(
        m.prefix_hit_rate.is_none_or(|k| (0.0..=1.0).contains(&k)),
        "{m:?}"
    );
    assert!(m.extra.is_none_or(f64::is_finite), "{m:?}");
}

fn check(input: &[u8]) {
    let full = prom::parse(input);
    bounded(input, &full);
    let extra = ExtraMetric {
        name: "vllm:num_requests_running".into(),
        aggregation: Aggregation::Sum,
    };
    let wanted = |n: &str| engines::is_wanted(n, Some(&extra.name));
    let filtered = prom::parse_filtered(input, wanted);
    if full.stats.truncated.is_none() {
        let want: Vec<_> = full.samples.iter().filter(|s| wanted(&s.name)).collect();
        assert_eq!(filtered.samples.len(), want.len());
        for (a, b) in filtered.samples.iter().zip(want) {
            assert!(a.name == b.name && a.labels == b.labels);
            assert_eq!(a.value.to_bits(), b.value.to_bits());
        }
    }
    let out = engines::scrape_page(input, usize::MAX, Some(&extra));
    let json = looks_like_json(input);
    assert_eq!(json, out.result == Err(MapError::NotPrometheus));
    let first = input
        .strip_prefix(b"\xef\xbb\xbf")
        .unwrap_or(input)
        .iter()
        .find(|b| !b.is_ascii_whitespace());
    assert_eq!(json, matches!(first, Some(b'{' | b'[')));
    assert!(out.unknown.len() <= 16);
    if let Ok(m) = &out.result {
        sane(m);
    }
    // The scheduler takes whatever mapped.
    let cands: Vec<Candidate> = (0..3u32)
        .map(|i| Candidate {
            addr: format!("p{i}"),
            metrics: if i == 1 {
                None
            } else {
                out.result.clone().ok()
            },
            in_flight_since_scrape: i,
        })
        .collect();
    let mut r = SplitMix64(input.len() as u64);
    let mut window = RateLimitWindow::new();
    for policy in [
        MetricPolicy::Default,
        MetricPolicy::Weighted,
        MetricPolicy::Least,
    ] {
        let cfg = SchedulerConfig {
            policy,
            rate_limit: 0.5,
            ..Default::default()
        };
        for sheddable in [false, true] {
            let req = RequestInfo {
                model: "m",
                lora_adapter: Some("a0"),
                sheddable,
            };
            let d = select(&cands, &req, &cfg, Some(&mut window), &mut || r.next_u64());
            if let Decision::Pick { index, .. } = d {
                assert!(index < cands.len() && index != 1, "{d:?}");
            }
        }
    }
}

/// A cut well-formed page reads unknown, or exactly what the whole page reads.
fn check_cuts(page: &[u8], rng: &mut Rng) {
    let whole = engines::scrape_page(page, usize::MAX, None).result;
    for _ in 0..8 {
        let len = rng.below(page.len() + 1);
        let cut = engines::scrape_page(&page[..len], len, None).result;
        match (&cut, &whole) {
            (Ok(c), Ok(w)) => {
                assert_eq!(
                    (c.engine, c.waiting, c.running, c.kv_usage, c.dp_groups),
                    (w.engine, w.waiting, w.running, w.kv_usage, w.dp_groups),
                    "cut at {len}"
                );
                assert!(c.lora.is_none() || c.lora == w.lora, "cut at {len}");
            }
            (Ok(c), Err(e)) => panic!("cut at {len} reads {c:?}, the whole page {e:?}"),
            (Err(MapError::Asleep(_)), w) => {
                assert!(matches!(w, Err(MapError::Asleep(_))), "cut at {len}: {w:?}")
            }
            (Err(_), _) => {}
        }
    }
}

#[test]
fn fuzz_prom_parse_and_map() {
    let seeds = seeds();
    for s in &seeds {
        check(s);
    }
    drive("prom", 200, |rng| generate(rng, &seeds), check);
}

#[test]
fn fuzz_prom_cut_pages_never_look_idler() {
    drive(
        "prom_cut",
        100,
        |rng| page(rng).into_bytes(),
        |p| check_cuts(p, &mut Rng::new(p.len() as u64)),
    );
}
