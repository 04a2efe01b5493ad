//! Fake OpenAI- and Anthropic-compatible model servers (Chat, Completions, Responses, Messages) and a load generator for measuring ai-load-balancer
//! routing quality (TTFT, prefix hit rate, tail latency, queue imbalance) on one machine.
//!
//! * [`server::spawn_pod`] starts a pod in-process; `ailb-fakepod` is the CLI around it.
//! * [`load::run`] drives a seeded workload against gateway URLs; `ailb-loadgen` is its CLI.

pub mod args;
pub mod body;
pub mod cache;
pub mod config;
pub mod dp;
pub mod engine;
pub mod fault;
pub mod generate;
pub mod histogram;
pub mod kv;
pub mod lane;
pub mod latency;
pub mod latency_page;
pub mod load;
pub mod messages_api;
pub mod metrics;
pub mod openai;
pub mod pd;
pub mod pod;
pub mod probe;
pub mod promtext;
pub mod responses_api;
pub mod responses_store;
pub mod rng;
pub mod server;
pub mod snapshot;
pub mod tokenize;
pub mod wire;

pub use config::{EngineKind, MetricsSource, PodConfig};
pub use engine::Snapshot;
pub use pd::{LoadFailurePolicy, PdConfig, Role};
pub use pod::{spawn_pod, DeadPod, PodHandle};
pub use responses_store::ResponseStore;
