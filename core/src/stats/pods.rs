//! Per-pod verified counters (`ai_lb.prefix.verified.<ip:port>.*`, docs/metrics.md), defined
//! at a pod's first verified response and bounded per VM.

use crate::host::{Host, MetricType};

/// The most pods given their own verified counters per VM: the names are made from the
/// endpoint's address at its first verified response, and a pod fleet churning for weeks must
/// not grow the host's stats without bound. Pods past it are in the totals only.
pub const MAX_POD_COUNTERS: usize = 256;

/// Per-pod verified counters, defined at a pod's first verified response:
/// `ai_lb.prefix.verified.<ip:port>.cached_tokens` and `.prompt_tokens` (their ratio is the
/// pod's verified hit rate).
#[derive(Debug, Default)]
pub struct PodStats {
    ids: std::collections::HashMap<String, [Option<u32>; 2]>,
}

impl PodStats {
    /// The two counter names of `endpoint`.
    pub fn names(endpoint: &str) -> [String; 2] {
        [
            format!("ai_lb.prefix.verified.{endpoint}.cached_tokens"),
            format!("ai_lb.prefix.verified.{endpoint}.prompt_tokens"),
        ]
    }

    /// Adds one verified response of `endpoint`.
    pub fn add(&mut self, host: &mut dyn Host, endpoint: &str, cached: u64, prompt: u64) {
        if !self.ids.contains_key(endpoint) {
            if self.ids.len() >= MAX_POD_COUNTERS {
                return;
            }
            let ids = Self::names(endpoint)
                .map(|name| host.define_metric(MetricType::Counter, &name).ok());
            self.ids.insert(endpoint.to_string(), ids);
        }
        let Some(ids) = self.ids.get(endpoint) else {
            return;
        };
        for (id, n) in ids.iter().zip([cached, prompt]) {
            if let Some(id) = id {
                let _ = host.increment_metric(*id, i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }
}
