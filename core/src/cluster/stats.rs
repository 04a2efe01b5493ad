//! `cluster_metrics` per-service statistics and their updates, formula for formula as Higress
//! keeps them (docs/higress-cluster-policies.md §3.2, §3.3).
//!
//! The formulas are written once, as the provided methods of [`Table`], over two stores: the
//! in-memory [`table::ServiceTable`], and [`record::Record`], which decodes the binary shared-data
//! record's blocks once and leaves its samples as bytes, so that a request's update moves only
//! its own service's ring (docs/higress-cluster-policies.md §6.1 has the layout; the caller
//! does the compare-and-swap).
//!
//! Services are keyed by name: `service_list` may repeat a name, and Go's maps then share one
//! record, so a table keeps one record per distinct name (first-seen order) and maps every
//! `service_list` entry to it.

pub mod record;
mod ring;
pub mod table;

use super::MetricsParams;

pub use ring::Ring;
use ring::{mean, oldest_first_sum};

/// Go's success test: the `:status` response header is exactly `"200"`. Anything else —
/// another 2xx, a 3xx, no response headers at all (reset, timeout before headers) — is a
/// failure.
pub fn is_success(status: Option<&str>) -> bool {
    status == Some("200")
}

/// Go's EWMA: the first sample is taken as is, later ones `beta·old + (1−beta)·sample`.
pub fn ewma(old: Option<f64>, sample: f64, beta: f64) -> f64 {
    match old {
        None => sample,
        Some(old) => beta * old + (1.0 - beta) * sample,
    }
}

/// One service's record: its [`Counters`] (read through, as `s.ongoing`) and its latency
/// rings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceStats {
    pub counters: Counters,
    /// Last `queue_size` times to first byte and total latencies (ms), for the Least* modes.
    pub ttft: Ring,
    pub total: Ring,
}

impl std::ops::Deref for ServiceStats {
    type Target = Counters;

    fn deref(&self) -> &Counters {
        &self.counters
    }
}

impl std::ops::DerefMut for ServiceStats {
    fn deref_mut(&mut self) -> &mut Counters {
        &mut self.counters
    }
}

impl ServiceStats {
    fn ring(&self, which: Latency) -> &Ring {
        match which {
            Latency::Ttft => &self.ttft,
            Latency::Total => &self.total,
        }
    }

    fn ring_mut(&mut self, which: Latency) -> &mut Ring {
        match which {
            Latency::Ttft => &mut self.ttft,
            Latency::Total => &mut self.total,
        }
    }
}

/// A service's latency rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    /// Times to the first response-body chunk.
    Ttft,
    /// Times to stream end.
    Total,
}

/// One service's counters, everything but its latency rings: what selection and the updates
/// read and write, besides the ring means and pushes. Counters are Go `int`s (64-bit) that
/// only grow, except `ongoing`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// Requests sent to this service and not yet finished.
    pub ongoing: i64,
    /// Selections since the config loaded; `rate_limit` compares shares of these.
    pub count: u64,
    /// AdaptiveScore EWMAs; `None` until the first sample (Go's `HasTTFT` / `HasTotalRT`).
    pub ewma_ttft: Option<f64>,
    pub ewma_total: Option<f64>,
    pub success: u64,
    pub errors: u64,
    pub consecutive_errors: u64,
    /// Unix ms; the service is cooling down while this is later than now.
    pub cooldown_until_ms: i64,
}

impl Counters {
    pub fn in_cooldown(&self, now_ms: i64) -> bool {
        self.cooldown_until_ms > now_ms
    }
}

/// A store of one config's per-service statistics: what the Go formulas (the provided
/// methods, and `select`) read and change. An index out of range reads as no service and is
/// ignored by every change.
pub trait Table {
    /// Distinct service names; a decision's index points here.
    fn names(&self) -> &[String];
    /// `service_list` as configured, as indices into [`Table::names`].
    fn list(&self) -> &[usize];
    fn counters(&self, index: usize) -> Option<&Counters>;
    fn counters_mut(&mut self, index: usize) -> Option<&mut Counters>;
    /// Mean of one of the service's rings (0 when empty or unknown).
    fn mean(&self, index: usize, which: Latency) -> f64;
    /// Appends a sample to one of the service's rings, dropping the oldest beyond the
    /// table's ring capacity.
    fn push(&mut self, index: usize, which: Latency, sample: f64);

    /// Every service's selections so far: the denominator of [`Table::request_rate`]. A
    /// decision sums it once and asks each service's share of it, not the sum again per
    /// service (n² block reads per decision for a `service_list` of n).
    fn selections(&self) -> u64 {
        (0..self.names().len())
            .filter_map(|i| self.counters(i))
            .fold(0u64, |t, c| t.saturating_add(c.count))
    }

    /// This service's share of `selections` ([`Table::selections`]), 0 before the first one.
    fn request_rate(&self, index: usize, selections: u64) -> f64 {
        match self.counters(index) {
            Some(c) if selections != 0 => c.count as f64 / selections as f64,
            _ => 0.0,
        }
    }

    /// Request headers, after the pick: one more in flight and one more selection.
    fn on_request_start(&mut self, index: usize) {
        if let Some(c) = self.counters_mut(index) {
            c.ongoing = c.ongoing.saturating_add(1);
            c.count = c.count.saturating_add(1);
        }
    }

    /// First response-body chunk, `elapsed_ms` after request headers: a TTFT sample. A failed
    /// request counts double the worse of its own time and the slowest service's mean TTFT.
    fn on_first_byte(&mut self, index: usize, elapsed_ms: i64, success: bool, beta: f64) {
        if self.counters(index).is_none() {
            return;
        }
        let sample = self.penalised(elapsed_ms, success, Latency::Ttft);
        self.push(index, Latency::Ttft, sample);
        if let Some(c) = self.counters_mut(index) {
            c.ewma_ttft = Some(ewma(c.ewma_ttft, sample, beta));
        }
    }

    /// Stream done (every request that was started, whatever its outcome). `elapsed_ms` is
    /// `None` when the start time is unknown: Go then only releases the in-flight count.
    /// A failure counts an error, extends the consecutive run and starts the cooldown; a
    /// success resets the run but leaves a running cooldown alone.
    fn on_stream_end(
        &mut self,
        index: usize,
        elapsed_ms: Option<i64>,
        success: bool,
        now_ms: i64,
        params: &MetricsParams,
    ) {
        // The sample first: it reads every service's mean, and pushing moves the ring.
        let sample = match elapsed_ms {
            Some(ms) if self.counters(index).is_some() => {
                let sample = self.penalised(ms, success, Latency::Total);
                self.push(index, Latency::Total, sample);
                Some(sample)
            }
            _ => None,
        };
        let Some(c) = self.counters_mut(index) else {
            return;
        };
        // Go never goes below 0 (every release follows its acquire on the same config
        // instance); a shared record reset under running requests could, so stop at 0.
        c.ongoing = c.ongoing.saturating_sub(1).max(0);
        if let Some(sample) = sample {
            c.ewma_total = Some(ewma(c.ewma_total, sample, params.ewma_beta));
            if success {
                c.success = c.success.saturating_add(1);
                c.consecutive_errors = 0;
            } else {
                c.errors = c.errors.saturating_add(1);
                c.consecutive_errors = c.consecutive_errors.saturating_add(1);
                // Go's int64 addition wraps; so does this.
                c.cooldown_until_ms = now_ms.wrapping_add(params.failure_cooldown_ms);
            }
        }
    }

    /// The sample to record: the elapsed time, or for a failure double the worse of it and
    /// the slowest service's mean.
    fn penalised(&self, elapsed_ms: i64, success: bool, which: Latency) -> f64 {
        let mut sample = elapsed_ms as f64;
        if !success {
            for i in 0..self.names().len() {
                let mean = self.mean(i, which);
                if sample < mean {
                    sample = mean;
                }
            }
            sample *= 2.0;
        }
        sample
    }
}

#[cfg(test)]
mod tests;
