//! Helpers for the endpoint_metrics tests (emulator and real Envoy): pods with one of them
//! busy, where a series of requests landed, and waiting for the gateways' health checks to
//! store the pods' pages.

use crate::bed::{chat, Bed};
use crate::gateway::http;
use ailb_fakepod::PodHandle;
use ailb_testkit::wait_until;
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
        ailb_testkit::wait_until(Duration::from_secs(5), || {
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

/// The health-check path of gateway `id` in an emulator config with `store_metrics`: `/metrics`
/// tagged with the gateway, so the fake pods count each gateway's checks apart
/// ([`wait_pages_stored`]).
pub fn metrics_check_path(id: &str) -> String {
    format!("/metrics?gw={id}")
}

/// Waits (10 s at most) until the health checks of every gateway in `gateways` (ids, their check
/// paths from [`metrics_check_path`]) have stored every one of `pods`' pages as they are now;
/// call it right after changing a page. One gateway's checks of one pod run one after another:
/// of the pages a pod serves them from now on, the first may have been read before the call,
/// the second was read after it, and when the third is served the gateway has stored the
/// second.
pub fn wait_pages_stored(pods: &[PodHandle], gateways: &[&str]) -> bool {
    let served = |pod: &PodHandle, gw: &str| pod.engine().metrics_served(&format!("gw={gw}"));
    let before: Vec<Vec<u64>> = pods
        .iter()
        .map(|p| gateways.iter().map(|g| served(p, g)).collect())
        .collect();
    wait_until(Duration::from_secs(10), || {
        pods.iter().zip(&before).all(|(p, was)| {
            gateways
                .iter()
                .zip(was)
                .all(|(g, was)| served(p, g) >= was + 3)
        })
    })
}
