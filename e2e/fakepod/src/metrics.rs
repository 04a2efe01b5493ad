//! `/metrics` in Prometheus text format, in the dialect of the engine being impersonated.
//!
//! Names, types and labels follow `docs/model-server-metrics.md` §1:
//! vLLM V1 labels are `{engine="0",model_name=...}` (sorted, as prometheus_client prints them),
//! counters carry `_total`; V0 has only `model_name` and hit-rate gauges (-1 with no queries);
//! SGLang exposes a hit *rate* gauge, here cumulative hits/queries since the last reset.
//! The latency histograms (TTFT, time per output token, end to end) follow the rest of the page
//! (latency_page.rs).

use crate::config::{EngineKind, PodConfig};
use crate::engine::Snapshot;
use crate::latency_page;
use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

pub use crate::promtext::parse_text;

/// Junk served by `--metrics-garbage`: not Prometheus text by any reading.
pub const GARBAGE: &str =
    "<html>\x00\x01 not metrics {{{ vllm:num_requests_running{model_name=\"x\" NaNaN\n}}}\n";

/// The page being written: families in first-use order, each with its samples (one per rank
/// when the pod has several).
#[derive(Default)]
struct Out {
    families: Vec<(String, String, String)>,
    current: usize,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        if let Some(i) = self.families.iter().position(|f| f.0 == name) {
            self.current = i;
            return;
        }
        let head = format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
        self.families.push((name.to_string(), head, String::new()));
        self.current = self.families.len() - 1;
    }

    /// A line of the current family.
    fn line(&mut self, line: std::fmt::Arguments<'_>) {
        if let Some(f) = self.families.get_mut(self.current) {
            let _ = writeln!(f.2, "{line}");
        }
    }

    fn sample(&mut self, name: &str, labels: &str, value: f64) {
        self.line(format_args!("{name}{{{labels}}} {}", fmt_value(value)));
    }

    fn gauge(&mut self, name: &str, help: &str, labels: &str, value: f64) {
        self.family(name, "gauge", help);
        self.sample(name, labels, value);
    }

    /// A counter family `name` exposed as `name_total`, as prometheus_client does.
    fn counter(&mut self, name: &str, help: &str, labels: &str, value: f64) {
        self.family(name, "counter", help);
        self.sample(&format!("{name}_total"), labels, value);
    }

    fn text(self) -> String {
        self.families
            .into_iter()
            .map(|(_, head, samples)| head + &samples)
            .collect()
    }
}

/// Python-style float rendering (`3.0`, `0.25`, `1.7e+09` style is not needed here).
fn fmt_value(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Renders live metrics for `snap` in the configured dialect.
pub fn render(cfg: &PodConfig, snap: &Snapshot) -> String {
    render_ranks(cfg, std::slice::from_ref(snap))
}

/// Renders the metrics of a pod's ranks (dp.rs), one series per rank labelled as the engine
/// labels them (docs/disaggregated-serving.md §5): vLLM `engine="<rank>"`, SGLang
/// `dp_rank="<rank>"` (only with more than one rank, as SGLang adds it only with DP).
/// TensorRT-LLM: no engine series at all; the fake models only its disaggregated request
/// shapes, so a router must not count on its metrics (its latency histograms are at
/// [`render_prometheus_path`], where trtllm-serve serves them).
pub fn render_ranks(cfg: &PodConfig, snaps: &[Snapshot]) -> String {
    let mut o = Out::default();
    let model = esc(&cfg.served_model_name);
    let dp = snaps.len() > 1;
    for (rank, snap) in snaps.iter().enumerate() {
        let r = Ranked { rank, dp };
        match cfg.engine {
            EngineKind::VllmV1 | EngineKind::VllmV0 => render_vllm(&mut o, cfg, snap, &model, r),
            EngineKind::Sglang => render_sglang(&mut o, cfg, snap, &model, r),
            EngineKind::TrtLlm => {}
        }
    }
    // prometheus_client's process collector, which both engines' servers expose: a restart
    // (`/admin/restart`) moves it.
    o.family(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
    );
    let started = snaps.first().map_or(0.0, |s| s.started_unix);
    o.line(format_args!("process_start_time_seconds {started}"));
    let latency: Vec<_> = snaps.iter().filter_map(|s| s.latency.clone()).collect();
    o.text() + &latency_page::render(cfg.engine, cfg.role, &model, &latency)
}

/// trtllm-serve's Prometheus text, which it serves at `/prometheus/metrics` (its `/metrics` is
/// JSON): the latency histograms of the pod's ranks (latency_page.rs); empty for other engines.
pub fn render_prometheus_path(cfg: &PodConfig, snaps: &[Snapshot]) -> String {
    if cfg.engine != EngineKind::TrtLlm {
        return String::new();
    }
    let latency: Vec<_> = snaps.iter().filter_map(|s| s.latency.clone()).collect();
    latency_page::render_trtllm(&latency)
}

/// Which rank's series are being written, and whether the pod has several.
#[derive(Clone, Copy)]
struct Ranked {
    rank: usize,
    dp: bool,
}

fn render_vllm(o: &mut Out, cfg: &PodConfig, s: &Snapshot, model: &str, r: Ranked) {
    let v1 = cfg.engine == EngineKind::VllmV1;
    // V0 had no DP server; its ranks are labelled as V1 labels them.
    let engine = r.rank;
    let l = if v1 || r.dp {
        format!("engine=\"{engine}\",model_name=\"{model}\"")
    } else {
        format!("model_name=\"{model}\"")
    };
    let running_help = if v1 {
        "Number of requests in model execution batches."
    } else {
        "Number of requests currently running on GPU."
    };
    o.gauge(
        "vllm:num_requests_running",
        running_help,
        &l,
        s.running as f64,
    );
    o.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        &l,
        s.waiting as f64,
    );
    if v1 {
        // Registered right after the queue gauge (vLLM 0.33.0 vllm/v1/metrics/loggers.py
        // `gauge_engine_sleep_state`); a fake engine never sleeps. Without it a page cut before
        // its end (many ranks' histograms) could not tell a router that the pod is awake.
        o.family(
            "vllm:engine_sleep_state",
            "gauge",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is \
             awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        );
        for (state, v) in [
            ("awake", 1.0),
            ("weights_offloaded", 0.0),
            ("discard_all", 0.0),
        ] {
            let labels = format!("{l},sleep_state=\"{state}\"");
            o.sample("vllm:engine_sleep_state", &labels, v);
        }
        o.gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            &l,
            s.kv_usage,
        );
        o.counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            &l,
            s.prefix_query_tokens as f64,
        );
        o.counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            &l,
            s.prefix_hit_tokens as f64,
        );
    } else {
        o.gauge(
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage.",
            &l,
            s.kv_usage,
        );
        let rate = if s.prefix_query_tokens == 0 {
            -1.0
        } else {
            s.prefix_hit_tokens as f64 / s.prefix_query_tokens as f64
        };
        o.gauge(
            "vllm:gpu_prefix_cache_hit_rate",
            "GPU prefix cache block hit rate.",
            &l,
            rate,
        );
    }
    o.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &l,
        s.prompt_tokens_total as f64,
    );
    o.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &l,
        s.generation_tokens_total as f64,
    );
    // cache_config_info has no model_name (an Info metric); V1 adds the engine label.
    let engine_label = if v1 || r.dp {
        format!("engine=\"{engine}\",")
    } else {
        String::new()
    };
    o.gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        &format!(
            "block_size=\"{}\",enable_prefix_caching=\"{}\",{engine_label}num_gpu_blocks=\"{}\"",
            cfg.block_tokens,
            if cfg.cache_blocks > 0 {
                "True"
            } else {
                "False"
            },
            cfg.cache_blocks
        ),
        1.0,
    );
    // One adapter series per pod (it has no engine label): the first rank's.
    if !cfg.lora_adapters.is_empty() && r.rank == 0 {
        // Value is the wall-clock time of the update, exactly like vLLM's set_to_current_time().
        o.gauge(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            &format!(
                "max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"",
                cfg.max_lora.unwrap_or(cfg.lora_adapters.len()),
                esc(&s.lora_running.join(",")),
                esc(&s.lora_waiting.join(","))
            ),
            now_secs(),
        );
    }
}

fn render_sglang(o: &mut Out, cfg: &PodConfig, s: &Snapshot, model: &str, r: Ranked) {
    let dp = if r.dp {
        format!(",dp_rank=\"{}\"", r.rank)
    } else {
        String::new()
    };
    let l = format!("model_name=\"{model}\"{dp}");
    o.gauge(
        "sglang:num_running_reqs",
        "The number of running requests.",
        &l,
        s.running as f64,
    );
    o.gauge(
        "sglang:num_queue_reqs",
        "The number of requests in the waiting queue.",
        &l,
        s.waiting as f64,
    );
    o.gauge(
        "sglang:num_used_tokens",
        "The number of used tokens.",
        &l,
        s.kv_tokens as f64,
    );
    o.gauge(
        "sglang:max_total_num_tokens",
        "Maximum total number of tokens in the KV cache pool.",
        &l,
        cfg.kv_capacity_tokens as f64,
    );
    o.gauge("sglang:token_usage", "The token usage.", &l, s.kv_usage);
    let rate = if s.prefix_query_tokens == 0 {
        0.0
    } else {
        s.prefix_hit_tokens as f64 / s.prefix_query_tokens as f64
    };
    o.gauge(
        "sglang:cache_hit_rate",
        "The prefix cache hit rate.",
        &l,
        rate,
    );
    o.counter(
        "sglang:prompt_tokens",
        "Number of prefill tokens processed.",
        &l,
        s.prompt_tokens_total as f64,
    );
    o.counter(
        "sglang:generation_tokens",
        "Number of generation tokens processed.",
        &l,
        s.generation_tokens_total as f64,
    );
    o.gauge(
        "sglang:cache_config_info",
        "Cache configuration information.",
        &format!(
            "num_pages=\"{}\",page_size=\"{}\"{dp}",
            cfg.cache_blocks, cfg.block_tokens
        ),
        1.0,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dialect_renders_parseable_text() {
        let snap = Snapshot {
            running: 2,
            waiting: 1,
            prefix_hit_tokens: 16,
            prefix_query_tokens: 64,
            lora_running: vec!["a".into(), "b".into()],
            kv_usage: 0.25,
            ..Snapshot::default()
        };
        for engine in [
            EngineKind::VllmV1,
            EngineKind::VllmV0,
            EngineKind::Sglang,
            EngineKind::TrtLlm,
        ] {
            let cfg = PodConfig {
                engine,
                lora_adapters: vec!["a".into(), "b".into()],
                ..PodConfig::default()
            };
            let text = render(&cfg, &snap);
            let series = parse_text(&text).unwrap();
            assert!(!series.is_empty());
            let two = render_ranks(&cfg, &[snap.clone(), snap.clone()]);
            assert!(parse_text(&two).unwrap().len() >= series.len());
        }
        let cfg = PodConfig {
            lora_adapters: vec!["a".into(), "b".into()],
            ..PodConfig::default()
        };
        let text = render(&cfg, &snap);
        assert!(
            text.contains("vllm:num_requests_waiting{engine=\"0\",model_name=\"fake-model\"} 1.0")
        );
        assert!(text
            .contains("vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"fake-model\"} 16.0"));
        assert!(text.contains("running_lora_adapters=\"a,b\",waiting_lora_adapters=\"\""));
    }
}
