//! A cluster_metrics route's statistics record: where it lives in shared data (a key per route
//! config and settings), which services it tracks, and how to read it back. Held by the request
//! through its `ServiceLease` and updated by `policies::cluster_metrics`.

use crate::cluster::stats::record::Record;
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
    /// Fresh statistics for `service_list`: what a missing or unreadable record stands for,
    /// and the shape every read shares.
    pub fresh: ServiceTable,
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
            fresh: ServiceTable::new(&config.service_list, params.ring_capacity()),
            mode,
            params,
        }
    }

    /// The record in `current`, ready to update in place (fresh when absent); `true` when a
    /// record was there but is not ours (garbage, another version, other services): it starts
    /// fresh.
    pub fn load(&self, current: Option<Vec<u8>>) -> (Record, bool) {
        match current {
            None => (self.fresh.fresh_record(), false),
            Some(bytes) if bytes.is_empty() => (self.fresh.fresh_record(), false),
            Some(bytes) => match self.fresh.open(bytes) {
                Some(record) => (record, false),
                None => (self.fresh.fresh_record(), true),
            },
        }
    }
}
