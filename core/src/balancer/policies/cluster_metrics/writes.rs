//! Every write of a cluster_metrics route's shared record goes through one compare-and-swap
//! ([`write`]): this worker's held samples first, then the [`Change`] (choose and count, count,
//! a stream's end, or nothing more).

use super::stats::SharedStats;
use crate::balancer::rng::VmRng;
use crate::balancer::shared;
use crate::cluster::select::{self, Decision as Pick};
use crate::cluster::stats::record::Record;
use crate::cluster::stats::Table;
use crate::host::{Host, HostError};

/// What one write of the route's record does, after this worker's held samples: one type for
/// every write, so every write goes through the one compare-and-swap in [`write`].
pub enum Change<'a> {
    /// Choose a service by the mode and count it in: the decision.
    Choose { rng: &'a mut VmRng, now_ms: i64 },
    /// Count `service` in: a global pick answered.
    Start(usize),
    /// A stream of `service` ended (`Table::on_stream_end`).
    End {
        service: usize,
        elapsed_ms: Option<i64>,
        success: bool,
        now_ms: i64,
    },
    /// Nothing but the held samples.
    Flush,
}

/// One compare-and-swap of the route's record: this worker's held samples first, then
/// `change`. Answers the service a [`Change::Choose`] chose, and whether a record was there
/// but not ours (it started fresh).
pub fn write(
    host: &mut dyn Host,
    stats: &SharedStats,
    mut change: Change,
) -> Result<(Option<usize>, bool), HostError> {
    let result = shared::update(host, &stats.key, |current| {
        let (mut record, reset) = stats.load(current);
        stats.apply_pending(&mut record);
        let chosen = apply(&mut record, stats, &mut change);
        (record.into_bytes(), (chosen, reset))
    });
    if result.is_ok() {
        stats.written();
    }
    result
}

/// `change` on `record`: the service a [`Change::Choose`] chose, None for the others.
fn apply(record: &mut Record, stats: &SharedStats, change: &mut Change) -> Option<usize> {
    match change {
        Change::Choose { rng, now_ms } => {
            let mut next = || rng.next_u64();
            match select::select(stats.mode, &stats.params, &*record, *now_ms, &mut next) {
                Pick::Pick(i) => {
                    record.on_request_start(i);
                    Some(i)
                }
                Pick::NoServices => None,
            }
        }
        Change::Start(service) => {
            record.on_request_start(*service);
            None
        }
        Change::End {
            service,
            elapsed_ms,
            success,
            now_ms,
        } => {
            record.on_stream_end(*service, *elapsed_ms, *success, *now_ms, &stats.params);
            None
        }
        Change::Flush => None,
    }
}
