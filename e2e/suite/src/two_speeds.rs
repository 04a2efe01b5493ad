//! The latency-aware placement tests' bed, shared by both builds' tests (tests/e2e/latency.rs
//! in the emulator, tests/e2e/envoy_latency.rs in real Envoy): three fake pods with one FIFO
//! prefill lane each, pod-0 fast and the others slow, and how the tests talk to them.

use crate::bed::Bed;
use crate::gateway::http;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The debug header the tests' configs name.
pub const DEBUG: &str = "x-ai-lb-debug";
/// pod-0 prefills at FAST tokens/s, the others at SLOW (one FIFO lane each, fakepod lane.rs).
/// Slow enough that the bed's own per-token costs (the gateway reading and hashing the body,
/// the pod tokenising it: some 17 µs per token on this machine, measured) stay small beside
/// the prefill they are learnt with.
pub const FAST: f64 = 16_000.0;
pub const SLOW: f64 = 4_000.0;

pub fn bed() -> Bed {
    let next = AtomicUsize::new(0);
    Bed::new(3, |c| {
        let i = next.fetch_add(1, Ordering::Relaxed);
        c.prefill_tokens_per_s = if i == 0 { FAST } else { SLOW };
        c.max_running = 64;
        c.decode_us_per_token = 300;
        c.cache_blocks = 4096;
    })
}

/// A new conversation's first turn of about `tokens` prompt tokens (4 bytes each), streamed.
pub fn prompt(n: usize, tokens: usize, max_tokens: u64) -> Value {
    let text: String = format!("conversation {n}: ")
        + &(0..tokens / 2)
            .map(|i| format!("w{} ", (i * 7 + n) % 97))
            .collect::<String>();
    json!({"model": "fake-model", "stream": true, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": text}]})
}

/// (status, debug header fields).
pub fn send(url: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, BTreeMap<String, String>) {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    let path = "/v1/chat/completions";
    let (status, headers, _) = http(url, "POST", path, &h, body.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("{url}{path}: {e}"));
    let debug = headers
        .iter()
        .find(|(k, _)| k == DEBUG)
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let fields = debug
        .split("; ")
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (status, fields)
}

/// Sends `bodies` through `urls` in turn, `parallel` at a time; the debug fields of each (all
/// answered 200).
pub fn burst(urls: &[&str], bodies: Vec<Value>, parallel: usize) -> Vec<BTreeMap<String, String>> {
    let mut out = Vec::new();
    for chunk in bodies.chunks(parallel) {
        let got: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let url = urls[i % urls.len()];
                    s.spawn(move || send(url, b, &[]))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (status, fields) in got {
            assert_eq!(status, 200, "{fields:?}");
            out.push(fields);
        }
    }
    out
}
