//! ai-load-balancer's decision logic, with no proxy-wasm dependency: everything here is tested
//! natively (and compiled for wasm32 by `make wasm-unit-test`). The wasm crate at the repo root
//! is the thin glue that owns every host call (docs/architecture.md).
//!
//! Layout: `config` (parse + validate into typed settings), `host` (the [`host::Host`] trait the
//! glue implements, and its domain errors), `redis` (RESP, scripts), `upstream` (Higress's host
//! list), `prefix` (prompt canonicalisation and chain keys), `model_metrics` (Prometheus parsing,
//! model-server metrics, the GPU-aware scheduler), `balancer` (per-VM dispatcher, the request
//! state machine, one module per policy), `stats` (counters).

pub mod agents;
pub mod balancer;
pub mod bytes;
pub mod cluster;
pub mod config;
pub mod hash;
pub mod host;
pub mod id_map;
pub mod latency;
pub mod model_metrics;
pub mod prefix;
pub mod ranks;
pub mod reason;
pub mod redis;
pub mod stats;
pub mod upstream;
pub mod verify;
