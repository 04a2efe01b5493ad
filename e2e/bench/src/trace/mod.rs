//! Trace replay (docs/trace-bench.md): Mooncake-format traces and llm-d-shaped generators made
//! into chat requests whose prompts share byte-identical prefixes exactly where the trace's
//! block ids do, replayed time-compressed through gateways or in-process routers, with what
//! each request got (pod, `cached_tokens`, TTFT) recorded. The bench (`ailb-bench trace`) and
//! the e2e test (`tests/trace.rs`) both use it.

pub mod client;
pub mod gen;
pub mod infinite;
pub mod mooncake;
pub mod replay;
pub mod text;
pub mod workload;
