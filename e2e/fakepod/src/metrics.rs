//! `/metrics` in Prometheus text format, in the dialect of the engine being impersonated.
//!
//! Names, types and labels follow `docs/model-server-metrics.md` §1:
//! vLLM V1 labels are `{engine="0",model_name=...}` (sorted, as prometheus_client prints them),
//! counters carry `_total`; V0 has only `model_name` and hit-rate gauges (-1 with no queries);
//! SGLang exposes a hit *rate* gauge, here cumulative hits/queries since the last reset.

use crate::config::{EngineKind, PodConfig};
use crate::engine::Snapshot;
use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Junk served by `--metrics-garbage`: not Prometheus text by any reading.
pub const GARBAGE: &str =
    "<html>\x00\x01 not metrics {{{ vllm:num_requests_running{model_name=\"x\" NaNaN\n}}}\n";

struct Out {
    text: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, value: f64) {
        let _ = writeln!(self.text, "{name}{{{labels}}} {}", fmt_value(value));
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
    let mut o = Out {
        text: String::new(),
    };
    let model = esc(&cfg.served_model_name);
    match cfg.engine {
        EngineKind::VllmV1 | EngineKind::VllmV0 => render_vllm(&mut o, cfg, snap, &model),
        EngineKind::Sglang => render_sglang(&mut o, cfg, snap, &model),
    }
    // prometheus_client's process collector, which both engines' servers expose: a restart
    // (`/admin/restart`) moves it.
    o.family(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
    );
    let _ = writeln!(o.text, "process_start_time_seconds {}", snap.started_unix);
    o.text
}

fn render_vllm(o: &mut Out, cfg: &PodConfig, s: &Snapshot, model: &str) {
    let v1 = cfg.engine == EngineKind::VllmV1;
    let l = if v1 {
        format!("engine=\"0\",model_name=\"{model}\"")
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
    let engine_label = if v1 { "engine=\"0\"," } else { "" };
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
    if !cfg.lora_adapters.is_empty() {
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

fn render_sglang(o: &mut Out, cfg: &PodConfig, s: &Snapshot, model: &str) {
    let l = format!("model_name=\"{model}\"");
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
            "num_pages=\"{}\",page_size=\"{}\"",
            cfg.cache_blocks, cfg.block_tokens
        ),
        1.0,
    );
}

/// A deliberately small Prometheus text checker used by tests: every non-comment line must be
/// `name{labels} value` or `name value` with a float value; returns `(name, labels, value)`.
pub fn parse_text(text: &str) -> Result<Vec<(String, String, f64)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim_start();
            if !(rest.starts_with("HELP ") || rest.starts_with("TYPE ")) {
                continue; // plain comment
            }
            if rest.starts_with("TYPE ") {
                let kind = rest.split_whitespace().nth(2).unwrap_or("");
                if !["gauge", "counter", "histogram", "summary", "untyped"].contains(&kind) {
                    return Err(format!("line {}: bad TYPE {kind:?}", i + 1));
                }
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("line {}: no value", i + 1))?;
        let value: f64 = value
            .parse()
            .map_err(|_| format!("line {}: bad value {value:?}", i + 1))?;
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let labels = rest
                    .strip_suffix('}')
                    .ok_or_else(|| format!("line {}: unclosed labels", i + 1))?;
                (n, labels)
            }
            None => (series, ""),
        };
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !name_ok {
            return Err(format!("line {}: bad metric name {name:?}", i + 1));
        }
        for pair in split_labels(labels) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("line {}: bad label {pair:?}", i + 1))?;
            if k.is_empty() || !(v.starts_with('"') && v.ends_with('"') && v.len() >= 2) {
                return Err(format!("line {}: bad label {pair:?}", i + 1));
            }
        }
        out.push((name.to_string(), labels.to_string(), value));
    }
    Ok(out)
}

/// Splits `a="x",b="y,z"` at commas outside quotes.
fn split_labels(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut in_q, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => in_q = !in_q,
            ',' if !in_q => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < s.len() {
        parts.push(&s[start..]);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_samples_parse_and_garbage_does_not() {
        // shared/ sits beside the repository (CI) or beside the worktrees folder (dev).
        let root = env!("CARGO_MANIFEST_DIR");
        let dirs = [
            format!("{root}/../../../shared/data/metrics"),
            format!("{root}/../../../../shared/data/metrics"),
        ];
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap();
                parse_text(&text).unwrap_or_else(|err| panic!("{:?}: {err}", e.path()));
            }
        }
        assert!(parse_text(GARBAGE).is_err());
    }

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
        for engine in [EngineKind::VllmV1, EngineKind::VllmV0, EngineKind::Sglang] {
            let cfg = PodConfig {
                engine,
                lora_adapters: vec!["a".into(), "b".into()],
                ..PodConfig::default()
            };
            let text = render(&cfg, &snap);
            let series = parse_text(&text).unwrap();
            assert!(!series.is_empty());
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
