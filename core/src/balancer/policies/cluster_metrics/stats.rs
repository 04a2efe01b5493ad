//! A cluster_metrics route's statistics record: where it lives in shared data (a key per route
//! config and settings), which services it tracks, and how to read it back. Held by the request
//! through its `ServiceLease` and updated by the cluster_metrics policy (`super`).

use crate::cluster::stats::record::Record;
use crate::cluster::stats::table::ServiceTable;
use crate::cluster::stats::Table;
use crate::cluster::{MetricsParams, Mode};
use crate::config::{ClusterMetricsConfig, ClusterMode};
use crate::hash;
use std::cell::RefCell;

/// Time-to-first-byte samples a worker holds before it writes them (see [`SharedStats::pending`]).
const MAX_PENDING: usize = 32;

/// A time-to-first-byte sample not yet written to the shared record.
#[derive(Debug, Clone, Copy, PartialEq)]
struct FirstByte {
    /// Index into the record's distinct names (every record of these stats has the same names).
    service: usize,
    elapsed_ms: i64,
    success: bool,
}

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
    /// This worker's time-to-first-byte samples not yet in the shared record. A sample is
    /// written with the worker's next compare-and-swap of the record — its next decision or
    /// stream end, at the latest the stream end of the request it came from — instead of a
    /// round trip of its own at the first body chunk: that round trip was a third of the
    /// plugin's CPU per request (docs/higress-cluster-policies.md §5). This worker's own
    /// decisions see the samples at once; other workers at the next write.
    pending: RefCell<Vec<FirstByte>>,
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
            fresh: ServiceTable::new(&config.service_list, mode.ring_capacity(&params)),
            mode,
            params,
            pending: RefCell::new(Vec::new()),
        }
    }

    /// Holds a time-to-first-byte sample for the next write; `true` when the worker holds so
    /// many that they should be written now.
    /// `service`: an index into the distinct names; one out of range is ignored.
    pub fn defer_first_byte(&self, service: usize, elapsed_ms: i64, success: bool) -> bool {
        if service >= self.fresh.names().len() {
            return false;
        }
        let mut pending = self.pending.borrow_mut();
        // Writes keep failing (shared data refused, endless conflicts): keep the newest.
        if pending.len() >= 4 * MAX_PENDING {
            pending.remove(0);
        }
        pending.push(FirstByte {
            service,
            elapsed_ms,
            success,
        });
        pending.len() >= MAX_PENDING
    }

    /// Applies the held samples to `table`, oldest first (each write attempt starts from the
    /// record as read, so a retried compare-and-swap applies them again).
    pub fn apply_pending(&self, table: &mut impl Table) {
        for s in self.pending.borrow().iter() {
            table.on_first_byte(s.service, s.elapsed_ms, s.success, self.params.ewma_beta);
        }
    }

    /// The held samples are in the shared record now.
    pub fn written(&self) {
        self.pending.borrow_mut().clear();
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
