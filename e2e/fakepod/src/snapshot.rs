//! The `/admin/state` JSON: a point-in-time copy of a pod's engine state.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Point-in-time copy of the engine state (the `/admin/state` JSON).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Snapshot {
    pub name: String,
    pub running: usize,
    pub waiting: usize,
    pub requests_total: u64,
    pub peak_running: usize,
    pub peak_waiting: usize,
    pub prefix_hit_tokens: u64,
    pub prefix_query_tokens: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub kv_tokens: u64,
    pub kv_usage: f64,
    pub cache_blocks_used: usize,
    pub cache_blocks_capacity: usize,
    /// Responses by status code, plus `reset`/`hang`/`reset-after-headers` for faults.
    pub status: BTreeMap<String, u64>,
    pub lora_running: Vec<String>,
    pub lora_waiting: Vec<String>,
    #[serde(default)]
    pub restarts: u64,
    #[serde(default)]
    pub started_unix: f64,
    /// A rank's index, in a pod with several data-parallel ranks (dp.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    /// The P/D counters of a prefill or decode pod (summed over ranks at the top level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pd: Option<crate::pd::stats::PdStats>,
    /// Each rank's own state when the pod has several; the fields above are their sums.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<Snapshot>,
    /// The engine's latency histograms (latency.rs), for `/metrics` only.
    #[serde(skip)]
    pub latency: Option<crate::latency::Latency>,
}
