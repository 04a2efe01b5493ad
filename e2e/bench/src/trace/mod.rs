//! Trace replay (docs/trace-bench.md): Mooncake-format traces and llm-d-shaped generators made
//! into chat requests whose prompts share byte-identical prefixes exactly where the trace's
//! block ids do, replayed time-compressed through gateways or in-process routers, with what
//! each request got (pod, `cached_tokens`, TTFT) recorded. The benches (`ailb-bench trace`,
//! `ailb-bench slo`) and the tests (`tests/trace.rs`, `tests/latency_ladder.rs`) use it.

pub mod client;
pub mod gen;
pub mod infinite;
pub mod latency_ladder;
pub mod mooncake;
pub mod replay;
pub mod text;
pub mod workload;
