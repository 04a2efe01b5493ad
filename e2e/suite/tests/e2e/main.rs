//! The end-to-end tests, one module per area, in one test binary: the harness, the emulator's
//! client and tokio are compiled and linked once, not into one binary per area
//! (docs/test-bed.md). `cargo test --release --test e2e <module>::` runs one area.

mod agent_sessions;
mod apis;
mod cargo_build;
mod client_aborts;
mod cluster;
mod compat;
mod data_parallel;
mod envoy;
mod envoy_agent_sessions;
mod envoy_body;
mod envoy_cluster;
mod envoy_dashboard;
mod envoy_data_parallel;
mod envoy_failure_memory;
mod envoy_latency;
mod envoy_prefix;
mod envoy_prefix_verify;
mod envoy_queue;
mod envoy_real_engine;
mod envoy_session_prefix;
mod failure_memory;
mod fairness;
mod glr;
mod latency;
mod metrics;
mod prefix;
mod prefix_verify;
mod priority;
mod priority_ceiling;
mod queue;
mod real_engine;
mod redis_cluster;
mod retries;
mod root_restart;
mod run;
mod session;
mod session_metrics;
