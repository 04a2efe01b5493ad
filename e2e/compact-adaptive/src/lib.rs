//! A bench fixture, not the plugin: the least Rust AdaptiveScore that shares its statistics
//! through shared data, for `ailb-bench cluster-p99` to run beside the plugin in the same
//! arrivals (docs/plugin-cpu.md). It makes the plugin's ten host calls per request (as
//! `empty_plugin`'s host-calls module does) and adds only the arithmetic of [`stats`]: the
//! clock, the record read and written back under its compare-and-swap token with the chosen
//! service's count taken, the cluster header and a counter; `:status`; the first chunk's
//! clock; at stream end the clock and the record again, with the count given back and the
//! samples folded in.
//!
//! What it leaves out, and the plugin does not: configuration (the bench's three services
//! and header are constants), `_rules_`, the other modes, sample windows, the missing-metrics
//! policy, rate limits and the queue, global in-flight through Redis, logs and telemetry.
//! Whatever the plugin costs over this module in the same run is the price of those and of
//! how the plugin is built, not of the host.

pub mod stats;

#[cfg(target_arch = "wasm32")]
mod exports;
