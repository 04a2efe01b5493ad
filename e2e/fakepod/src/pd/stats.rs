//! What a P/D rank counts, for `/admin/state` (`pd` of each rank's snapshot): e2e tests assert
//! on these to see which path a request took.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters of one rank's P/D side. Reset by `/admin/reset`, except the pinned gauge.
#[derive(Debug, Default)]
pub struct PdCounters {
    pub transfers_received: AtomicU64,
    pub tokens_transferred: AtomicU64,
    pub self_prefill_missing: AtomicU64,
    pub self_prefill_invalid: AtomicU64,
    pub load_failures: AtomicU64,
    pub failed_requests: AtomicU64,
    pub room_timeouts: AtomicU64,
    pub pins_made: AtomicU64,
    pub pins_read: AtomicU64,
    pub pins_expired: AtomicU64,
    /// Blocks this rank holds for a decode pod that has not read them yet (a gauge).
    pub pinned_blocks: AtomicU64,
}

/// The serialised counters (`/admin/state` → `pd`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PdStats {
    /// `colocated`, `prefill` or `decode`.
    pub role: String,
    /// Decode: KV pulls that succeeded, and the prompt tokens they carried.
    pub transfers_received: u64,
    pub tokens_transferred: u64,
    /// Decode: requests prefilled here because they carried no prefill parameters...
    pub self_prefill_missing: u64,
    /// ...or parameters vLLM would call invalid ("will not utilize KVTransfer").
    pub self_prefill_invalid: u64,
    /// Decode: pulls that failed (unknown engine, expired blocks, `transfer_fails`).
    pub load_failures: u64,
    /// Decode: requests answered with an error (policy `fail`, or an SGLang room timeout).
    pub failed_requests: u64,
    pub room_timeouts: u64,
    /// Prefill: transfers offered, read by a decode pod, and dropped unread after the timeout.
    pub pins_made: u64,
    pub pins_read: u64,
    pub pins_expired: u64,
    pub pinned_blocks: u64,
}

impl PdStats {
    /// Adds another rank's counters (the pod's total).
    pub fn add(&mut self, o: &PdStats) {
        self.transfers_received += o.transfers_received;
        self.tokens_transferred += o.tokens_transferred;
        self.self_prefill_missing += o.self_prefill_missing;
        self.self_prefill_invalid += o.self_prefill_invalid;
        self.load_failures += o.load_failures;
        self.failed_requests += o.failed_requests;
        self.room_timeouts += o.room_timeouts;
        self.pins_made += o.pins_made;
        self.pins_read += o.pins_read;
        self.pins_expired += o.pins_expired;
        self.pinned_blocks += o.pinned_blocks;
    }
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

impl PdCounters {
    pub fn bump(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }

    pub fn stats(&self, role: &str) -> PdStats {
        PdStats {
            role: role.to_string(),
            transfers_received: get(&self.transfers_received),
            tokens_transferred: get(&self.tokens_transferred),
            self_prefill_missing: get(&self.self_prefill_missing),
            self_prefill_invalid: get(&self.self_prefill_invalid),
            load_failures: get(&self.load_failures),
            failed_requests: get(&self.failed_requests),
            room_timeouts: get(&self.room_timeouts),
            pins_made: get(&self.pins_made),
            pins_read: get(&self.pins_read),
            pins_expired: get(&self.pins_expired),
            pinned_blocks: get(&self.pinned_blocks),
        }
    }

    /// Zeroes the counters; pinned blocks are state, not a count, and stay.
    pub fn reset(&self) {
        for a in [
            &self.transfers_received,
            &self.tokens_transferred,
            &self.self_prefill_missing,
            &self.self_prefill_invalid,
            &self.load_failures,
            &self.failed_requests,
            &self.room_timeouts,
            &self.pins_made,
            &self.pins_read,
            &self.pins_expired,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}
