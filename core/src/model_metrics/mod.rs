//! GPU-aware `endpoint_metrics` policy, pure logic: Prometheus text parsing ([`prom`]), engine
//! detection and normalisation ([`engines`]), and endpoint selection ([`scheduler`],
//! [`rate_limit`]). No host calls; the plugin's host layer scrapes, stores snapshots and calls in.
//!
//! Typical flow: once per scrape `engines::scrape(body, extra)` → `EndpointMetrics`; per request
//! `scheduler::select(&candidates, &req, &cfg, Some(&mut window), &mut rng)`.

pub mod engines;
mod inputs;
mod names;
pub mod note_log;
pub mod prom;
pub mod rate_limit;
mod read;
mod scan;
pub mod scheduler;

#[cfg(test)]
mod llamacpp_tests;
#[cfg(test)]
mod tests;

pub use engines::{
    Aggregation, EndpointMetrics, ExtraMetric, LoraInfo, MapError, ModelServer, Scrape, Unknown,
    UnknownValue,
};
pub use rate_limit::RateLimitWindow;
pub use scheduler::{Candidate, Decision, MetricPolicy, RequestInfo, SchedulerConfig, Weights};

pub use crate::hash::SplitMix64;
