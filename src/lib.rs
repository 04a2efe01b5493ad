//! ai-load-balancer: LLM-aware endpoint picking for Higress / Envoy (Proxy-Wasm).

pub mod prefix;
