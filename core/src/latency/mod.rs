//! Latency predicted per pod (issue 50; docs/latency-model.md): each pod's TTFT and TPOT as
//! linear functions of the load the plugin already knows exactly (prompt tokens booked ahead,
//! this request's uncached tokens, running requests, prompt length), fitted by weighted least
//! squares on every answer, with exponential forgetting, and mergeable across gateways as
//! sums of sufficient statistics. Pure: no host calls.

pub mod book;
pub mod fit;
pub mod model;
pub mod stats;

#[cfg(test)]
mod tests;

pub use book::Book;
pub use model::{
    fleet_prior, Accuracy, BadSample, Features, Outcome, PodModel, Prediction, Prior, TPOT_K,
    TTFT_K,
};
pub use stats::Stats;
