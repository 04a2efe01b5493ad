//! Helpers for the endpoint_metrics tests (emulator and real Envoy): pods with one of them
//! busy, and where a series of requests landed.

use crate::bed::{chat, Bed};
use crate::gateway::http;
use std::collections::BTreeMap;
use std::time::Duration;

/// 3 pods; pod-0 admits one request at a time, so requests sent to it directly queue there.
pub fn busy_bed() -> Bed {
    Bed::new(3, |c| {
        c.max_running = if c.name == "pod-0" { 1 } else { 16 };
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    })
}

/// Sends `n` long requests straight to `pod` (bypassing the gateway) in the background: with
/// `max_running = 1` all but one wait in its queue for about `n × tokens × 10 ms`.
pub fn preload(bed: &Bed, pod: usize, n: usize, tokens: u64) {
    let url = format!("http://{}", bed.pods[pod].addr);
    for i in 0..n {
        let url = url.clone();
        std::thread::spawn(move || {
            let _ = http(
                &url,
                "POST",
                "/v1/chat/completions",
                &[("content-type", "application/json")],
                &crate::bed::chat_body(&format!("preload {i}"), tokens),
            );
        });
    }
    let engine = bed.pods[pod].engine().clone();
    assert!(
        crate::gateway::wait_until(Duration::from_secs(5), || {
            engine.snapshot().waiting + 1 >= n
        }),
        "pod {pod} did not fill with {n} requests"
    );
}

/// Sends `n` short requests one after another with `headers`; counts the answering pods
/// (`x-pod`) and statuses.
pub fn land(url: &str, n: usize, headers: &[(&str, &str)]) -> (BTreeMap<String, usize>, Vec<u16>) {
    let mut pods = BTreeMap::new();
    let mut statuses = Vec::new();
    for i in 0..n {
        let (status, pod) = if headers.is_empty() {
            chat(url, &format!("short {i}"), 2)
        } else {
            let mut h = vec![("content-type", "application/json")];
            h.extend_from_slice(headers);
            match http(
                url,
                "POST",
                "/v1/chat/completions",
                &h,
                &crate::bed::chat_body(&format!("short {i}"), 2),
            ) {
                Ok((s, hs, _)) => (
                    s,
                    hs.iter()
                        .find(|(k, _)| k == "x-pod")
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default(),
                ),
                Err(_) => (0, String::new()),
            }
        };
        statuses.push(status);
        *pods.entry(pod).or_insert(0) += 1;
    }
    (pods, statuses)
}
