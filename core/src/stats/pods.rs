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

/// Per-pod prediction error gauges of latency-aware placement (docs/metrics.md):
/// `ai_lb.latency.<ip:port>.ttft_mape_pct` and `.tpot_mape_pct`, the mean absolute percentage
/// error of this VM's predictions for the pod. The host ABI only increments metrics, so a gauge
/// is moved by the difference from the value it holds.
#[derive(Debug, Default)]
pub struct PodGauges {
    held: Vec<(String, [Gauge; 2])>,
}

/// A gauge's metric id (None: the host refused to define it) and the value it holds.
type Gauge = (Option<u32>, i64);

impl PodGauges {
    pub fn names(endpoint: &str) -> [String; 2] {
        [
            format!("ai_lb.latency.{endpoint}.ttft_mape_pct"),
            format!("ai_lb.latency.{endpoint}.tpot_mape_pct"),
        ]
    }

    /// Sets `endpoint`'s two gauges (None: leaves that one as it is).
    pub fn set(&mut self, host: &mut dyn Host, endpoint: &str, values: [Option<i64>; 2]) {
        let i = match self.held.iter().position(|(e, _)| e == endpoint) {
            Some(i) => i,
            None if self.held.len() >= MAX_POD_COUNTERS => return,
            None => {
                let ids = Self::names(endpoint)
                    .map(|name| (host.define_metric(MetricType::Gauge, &name).ok(), 0));
                self.held.push((endpoint.to_string(), ids));
                self.held.len() - 1
            }
        };
        let Some((_, held)) = self.held.get_mut(i) else {
            return;
        };
        for ((id, cur), v) in held.iter_mut().zip(values) {
            if let (Some(id), Some(v)) = (*id, v) {
                if host.increment_metric(id, v - *cur).is_ok() {
                    *cur = v;
                }
            }
        }
    }
}
