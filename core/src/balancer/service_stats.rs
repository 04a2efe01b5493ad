//! A cluster_metrics route's statistics record: where it lives in shared data (a key per route
//! config and settings), which services it tracks, and how to read it back. Held by the request
//! through its `ServiceLease` and updated by `policies::cluster_metrics`.

use crate::cluster::stats::ServiceTable;
use crate::cluster::{MetricsParams, Mode};
use crate::config::{ClusterMetricsConfig, ClusterMode};
use crate::hash;

/// One route config's statistics: where they live and how to read them.
#[derive(Debug)]
pub struct SharedStats {
    /// Shared-data key: `ailb.cm.<hash of the route's position and settings>`, so a changed
    /// config starts fresh rather than reading numbers kept under other settings.
    pub key: String,
    pub services: Vec<String>,
    pub mode: Mode,
    pub params: MetricsParams,
}

impl SharedStats {
    /// `position`: the config's place among the plugin's route configs (global first).
    pub fn new(position: usize, config: &ClusterMetricsConfig) -> SharedStats {
        let mode = match config.mode {
            ClusterMode::LeastBusy => Mode::LeastBusy,
            ClusterMode::LeastTotalLatency => Mode::LeastTotalLatency,
            ClusterMode::LeastFirstTokenLatency => Mode::LeastFirstTokenLatency,
            ClusterMode::AdaptiveScore => Mode::AdaptiveScore,
            ClusterMode::Random => Mode::Random,
        };
        let params = MetricsParams {
            rate_limit: config.rate_limit,
            ewma_beta: config.ewma_beta,
            p2c_choices: config.p2c_choices,
            ttft_weight: config.ttft_weight,
            total_latency_weight: config.total_latency_weight,
            error_penalty: config.error_penalty,
            failure_cooldown_ms: config.failure_cooldown_ms,
            queue_size: config.queue_size,
            inflight_capacity: config.inflight_capacity,
        };
        let identity = format!(
            "{position}\n{:?}\n{mode:?}\n{params:?}",
            config.service_list
        );
        SharedStats {
            key: format!(
                "ailb.cm.{:016x}",
                hash::fnv1a(hash::FNV_OFFSET, identity.as_bytes())
            ),
            services: config.service_list.clone(),
            mode,
            params,
        }
    }

    /// The table in `current` (fresh when absent); `true` when a record was there but did not
    /// decode as written (garbage, or another writer's format): it starts fresh.
    pub fn load(&self, current: Option<&[u8]>) -> (ServiceTable, bool) {
        let capacity = self.params.ring_capacity();
        let Some(bytes) = current else {
            return (ServiceTable::new(&self.services, capacity), false);
        };
        let text = String::from_utf8_lossy(bytes);
        // Our own records are one good line per service; anything else lost some of its lines.
        let (table, clean) = ServiceTable::decode_checked(&text, &self.services, capacity);
        (table, !text.is_empty() && !clean)
    }
}
