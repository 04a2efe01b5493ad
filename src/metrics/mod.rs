//! GPU-aware `endpoint_metrics` policy, pure logic: Prometheus text parsing ([`prom`]), engine
//! detection and normalisation ([`engines`]), and endpoint selection ([`scheduler`],
//! [`rate_limit`]). No host calls; the plugin's host layer scrapes, stores snapshots and calls in.
//!
//! Typical flow: once per scrape `engines::scrape(body, extra)` → `EndpointMetrics`; per request
//! `scheduler::select(&candidates, &req, &cfg, Some(&mut window), &mut rng)`.

pub mod engines;
mod names;
pub mod prom;
pub mod rate_limit;
mod scan;
pub mod scheduler;

#[cfg(test)]
mod tests;

pub use engines::{Aggregation, EndpointMetrics, Engine, ExtraMetric, LoraInfo, MapError};
pub use rate_limit::RateLimitWindow;
pub use scheduler::{Candidate, Decision, MetricPolicy, RequestInfo, SchedulerConfig, Weights};

/// SplitMix64: a tiny seedable generator for [`scheduler::select`]'s `rng` (the plugin seeds it
/// from the host clock; tests from a constant). Not for anything security-related.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
