//! prefix_cache's prefill bookings in the plain-Envoy build (docs/redis-data-model.md §13, per
//! proxy): lines `~p<endpoint> <booked tokens>` and `~r<endpoint> <learned rate, tokens/s>` of
//! the counts record (counts.rs), changed in the same compare-and-swap updates as the loads, so
//! a booking goes with its count and is given back exactly once: at the first response bytes
//! ([`first_bytes`]) or with the count's release.

use super::lease::LocalLease;
use crate::balancer::pick::Booking;
use crate::balancer::shared;
use crate::balancer::telemetry::Telemetry;
use crate::host::Host;
use crate::stats::Counter;
use std::collections::HashMap;

const BOOKED: &str = "~p";
const RATE: &str = "~r";

/// Each endpoint's booked prefill tokens and learned rate (0: none yet), by position.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefill {
    pub booked: Vec<u64>,
    pub rates: Vec<u64>,
}

impl Prefill {
    pub(super) fn read(counts: &HashMap<String, u64>, endpoints: &[String]) -> Prefill {
        let line =
            |prefix: &str, e: &String| counts.get(&format!("{prefix}{e}")).copied().unwrap_or(0);
        Prefill {
            booked: endpoints.iter().map(|e| line(BOOKED, e)).collect(),
            rates: endpoints.iter().map(|e| line(RATE, e)).collect(),
        }
    }
}

pub(super) fn book(counts: &mut HashMap<String, u64>, endpoint: &str, tokens: u64) {
    let n = counts.entry(format!("{BOOKED}{endpoint}")).or_insert(0);
    *n = n.saturating_add(tokens);
}

/// Subtracts `tokens`, never below zero; a line at zero is dropped.
pub(super) fn give_back(counts: &mut HashMap<String, u64>, endpoint: &str, tokens: u64) {
    let line = format!("{BOOKED}{endpoint}");
    let left = counts.get(&line).map_or(0, |n| n.saturating_sub(tokens));
    if left == 0 {
        counts.remove(&line);
    } else {
        counts.insert(line, left);
    }
}

/// Moves the endpoint's rate a fifth of the way to `sample` (the first sample is taken as is),
/// as prefill_done.lua does.
fn learn(counts: &mut HashMap<String, u64>, endpoint: &str, sample: u64) {
    if sample == 0 {
        return;
    }
    let rate = counts.entry(format!("{RATE}{endpoint}")).or_insert(0);
    *rate = match *rate {
        0 => sample,
        r => (r.saturating_mul(4).saturating_add(sample)) / 5,
    };
}

/// A request's first response bytes: its booking back and its rate sample learned, in one
/// update. An update the host refuses is counted as a failed release is (the count is then
/// as lost as a release's would be).
pub fn first_bytes(host: &mut dyn Host, tel: &Telemetry, lease: &LocalLease, booking: Booking) {
    let sample = booking.rate_sample(host.now_ms());
    let result = shared::update(host, &lease.key, |cur| {
        let mut counts = cur
            .as_deref()
            .map(shared::decode_counts)
            .unwrap_or_default();
        give_back(&mut counts, &lease.endpoint, booking.booked.tokens);
        learn(&mut counts, &lease.endpoint, sample);
        (shared::encode_counts(&counts), ())
    });
    match result {
        Ok(()) => tel.inc(host, Counter::FirstBytesSent),
        Err(_) => tel.inc(host, Counter::ReleaseFailures),
    }
}
