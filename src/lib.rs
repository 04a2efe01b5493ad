//! ai-load-balancer: LLM-aware endpoint picking for Higress / Envoy (Proxy-Wasm).
//!
//! Layout: `config` (parse + validate), `host` (all host calls), `redis` (RESP, scripts),
//! `upstream` (Higress host list), `request` (per-request state machine), `engine` (policy
//! decisions per VM), `filter` (the proxy-wasm context shells, wasm only).

pub mod config;
pub mod host;
pub mod redis;
pub mod upstream;
pub mod engine;
pub mod request;
pub mod stats;
