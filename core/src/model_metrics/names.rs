//! Where each engine exposes each signal: exact series names and label selectors, with their
//! sources (docs/model-server-metrics.md §1, §2). Data only; the mapping logic is in
//! [`super::engines`].

/// Inference engine behind an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelServer {
    /// vLLM V0 and V1 (`vllm:` prefix).
    Vllm,
    /// SGLang (`sglang:` prefix).
    Sglang,
    /// Triton Inference Server with the TensorRT-LLM backend (`nv_trt_llm_*`).
    TritonTrtLlm,
    /// TensorRT-LLM's OpenAI server `trtllm-serve` (`trtllm_*`).
    TrtllmServe,
    /// Hugging Face TGI (`tgi_*`); no KV signal.
    Tgi,
    /// llama.cpp's `llama-server` with `--metrics` (`llamacpp:` prefix); no KV signal.
    LlamaCpp,
}

/// Selects series of `name` whose label `key` equals `value` (if given).
#[derive(Clone, Copy)]
pub(super) struct Sel {
    pub(super) name: &'static str,
    pub(super) label: Option<(&'static str, &'static str)>,
}

pub(super) const fn s(name: &'static str) -> Sel {
    Sel { name, label: None }
}

pub(super) const fn sl(name: &'static str, key: &'static str, value: &'static str) -> Sel {
    Sel {
        name,
        label: Some((key, value)),
    }
}

/// Where each signal lives for one engine; in every list the first selector present wins.
pub(super) struct Spec {
    pub(super) engine: ModelServer,
    pub(super) waiting: &'static [Sel],
    /// Further queues of waiting work, each added to `waiting` (SGLang's disaggregated
    /// prefill/decode queues: requests that hold no batch slot yet).
    pub(super) queues: &'static [&'static [Sel]],
    pub(super) running: &'static [Sel],
    pub(super) kv: &'static [Sel],
    /// Gauge already 0..1; negative means "no queries yet" (vLLM V0 emits -1.0).
    pub(super) hit_rate: &'static [Sel],
    /// (hits, queries) counter pairs.
    pub(super) hit_counters: &'static [(&'static str, &'static str)],
    /// (family, block-size label, block-count label) of an info-style gauge.
    pub(super) cache_info: Option<(&'static str, &'static str, &'static str)>,
    pub(super) block_size: &'static [Sel],
    pub(super) num_blocks: &'static [Sel],
}

pub(super) const TRITON_REQ: &str = "nv_trt_llm_request_metrics";
pub(super) const TRITON_KV: &str = "nv_trt_llm_kv_cache_block_metrics";
pub(super) const VLLM_LORA: &str = "vllm:lora_requests_info";
/// Labels `sleep_state` = `awake` (1 awake, 0 asleep), `weights_offloaded` (1 = sleep level 1),
/// `discard_all` (1 = level 2), one series each per engine (docs/model-server-metrics.md §1.1).
pub(super) const VLLM_SLEEP: &str = "vllm:engine_sleep_state";

/// SGLang's disaggregation queues (docs/model-server-metrics.md §1.2). The prefill bootstrap
/// queue was exported as `…_prefill_prealloc_queue_reqs` before its rename; first present wins.
const SGLANG_PD_QUEUES: &[&[Sel]] = &[
    &[
        s("sglang:num_prefill_bootstrap_queue_reqs"),
        s("sglang:num_prefill_prealloc_queue_reqs"),
    ],
    &[s("sglang:num_prefill_inflight_queue_reqs")],
    &[s("sglang:num_decode_prealloc_queue_reqs")],
    &[s("sglang:num_decode_transfer_queue_reqs")],
];

/// Detection order matters only for a page exposing several engines (not seen in practice).
pub(super) const SPECS: &[Spec] = &[
    Spec {
        engine: ModelServer::Vllm,
        waiting: &[s("vllm:num_requests_waiting")],
        queues: &[],
        running: &[s("vllm:num_requests_running")],
        // 0.9.2 renamed gpu_cache_usage_perc → kv_cache_usage_perc (vllm#18354); 0.9.2–0.10 emit
        // both, 0.11 hides the old one, V0 has only the old one. Prefer the new name.
        kv: &[
            s("vllm:kv_cache_usage_perc"),
            s("vllm:gpu_cache_usage_perc"),
        ],
        hit_rate: &[s("vllm:gpu_prefix_cache_hit_rate")],
        hit_counters: &[
            (
                "vllm:prefix_cache_hits_total",
                "vllm:prefix_cache_queries_total",
            ),
            (
                "vllm:gpu_prefix_cache_hits_total",
                "vllm:gpu_prefix_cache_queries_total",
            ),
        ],
        cache_info: Some(("vllm:cache_config_info", "block_size", "num_gpu_blocks")),
        block_size: &[],
        num_blocks: &[],
    },
    Spec {
        engine: ModelServer::Sglang,
        waiting: &[s("sglang:num_queue_reqs")],
        queues: SGLANG_PD_QUEUES,
        running: &[s("sglang:num_running_reqs")],
        kv: &[s("sglang:token_usage")],
        hit_rate: &[s("sglang:cache_hit_rate")],
        hit_counters: &[],
        cache_info: Some(("sglang:cache_config_info", "page_size", "num_pages")),
        // Current releases export the KV pool's shape as gauges, one series per scheduler
        // (docs/model-server-metrics.md §1.2): pages per data-parallel rank add up.
        block_size: &[s("sglang:page_size")],
        num_blocks: &[s("sglang:num_pages")],
    },
    Spec {
        engine: ModelServer::TritonTrtLlm,
        // `waiting` only since tensorrtllm_backend 15cb989 (2025-04); older pods report 0 here.
        waiting: &[sl(TRITON_REQ, "request_type", "waiting")],
        queues: &[],
        running: &[
            sl(TRITON_REQ, "request_type", "scheduled"),
            sl(TRITON_REQ, "request_type", "active"),
        ],
        // `fraction` is recent too; used/max is derived in `triton_kv_fallback`.
        kv: &[sl(TRITON_KV, "kv_cache_block_type", "fraction")],
        hit_rate: &[],
        hit_counters: &[],
        cache_info: None,
        block_size: &[sl(TRITON_KV, "kv_cache_block_type", "tokens_per")],
        num_blocks: &[sl(TRITON_KV, "kv_cache_block_type", "max")],
    },
    Spec {
        engine: ModelServer::TrtllmServe,
        waiting: &[s("trtllm_num_requests_waiting")],
        queues: &[],
        running: &[s("trtllm_num_requests_running")],
        kv: &[s("trtllm_kv_cache_utilization")],
        hit_rate: &[],
        hit_counters: &[],
        cache_info: None,
        block_size: &[s("trtllm_kv_cache_tokens_per_block")],
        num_blocks: &[s("trtllm_kv_cache_max_blocks")],
    },
    Spec {
        engine: ModelServer::Tgi,
        waiting: &[s("tgi_queue_size")],
        queues: &[],
        running: &[s("tgi_batch_current_size")],
        kv: &[],
        hit_rate: &[],
        hit_counters: &[],
        cache_info: None,
        block_size: &[],
        num_blocks: &[],
    },
    Spec {
        engine: ModelServer::LlamaCpp,
        // Tasks waiting for a free slot / slots busy (docs/model-server-metrics.md §1.5). No KV
        // gauge: the pod's KV use is `None`, as TGI's (§2, "No KV signal").
        waiting: &[s("llamacpp:requests_deferred")],
        queues: &[],
        running: &[s("llamacpp:requests_processing")],
        kv: &[],
        hit_rate: &[],
        hit_counters: &[],
        cache_info: None,
        block_size: &[],
        num_blocks: &[],
    },
];

/// Every series name some mapping reads, sorted for binary search (a test checks it against
/// [`SPECS`], so the two cannot drift).
pub(super) const WANTED: &[&str] = &[
    "llamacpp:requests_deferred",
    "llamacpp:requests_processing",
    "nv_trt_llm_kv_cache_block_metrics",
    "nv_trt_llm_request_metrics",
    "sglang:cache_config_info",
    "sglang:cache_hit_rate",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_pages",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_prefill_prealloc_queue_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_running_reqs",
    "sglang:page_size",
    "sglang:token_usage",
    "tgi_batch_current_size",
    "tgi_queue_size",
    "trtllm_kv_cache_max_blocks",
    "trtllm_kv_cache_tokens_per_block",
    "trtllm_kv_cache_utilization",
    "trtllm_num_requests_running",
    "trtllm_num_requests_waiting",
    "vllm:cache_config_info",
    "vllm:engine_sleep_state",
    "vllm:gpu_cache_usage_perc",
    "vllm:gpu_prefix_cache_hit_rate",
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:kv_cache_usage_perc",
    "vllm:lora_requests_info",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wanted_list_matches_specs() {
        let mut names: Vec<&str> = vec![VLLM_LORA, VLLM_SLEEP];
        for sp in SPECS {
            for l in [
                sp.waiting,
                sp.running,
                sp.kv,
                sp.hit_rate,
                sp.block_size,
                sp.num_blocks,
            ] {
                names.extend(l.iter().map(|x| x.name));
            }
            names.extend(sp.queues.iter().flat_map(|q| q.iter().map(|x| x.name)));
            names.extend(sp.hit_counters.iter().flat_map(|(h, q)| [*h, *q]));
            names.extend(sp.cache_info.map(|(f, _, _)| f));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names, WANTED);
    }
}
