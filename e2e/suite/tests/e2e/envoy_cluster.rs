//! Cluster-level policies (`lb_type: cluster`) in real Envoy 1.40 with the plain-Envoy artifact:
//! three services as three clusters behind one `cluster_header` route (the shape of
//! `envoy/envoy-cluster.yaml`). cluster_hash pins a header value to its Higress slot's cluster;
//! cluster_metrics moves traffic off a service that answers 5xx.

use ailb_core::cluster::hash::slot_of;
use ailb_e2e::bed::Bed;
use ailb_e2e::cluster::TARGET_HEADER;
use ailb_e2e::envoy::Envoy;
use ailb_e2e::gateway::http;
use ailb_e2e::metrics::land;
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

const CLUSTERS: [&str; 3] = ["llm-a", "llm-b", "llm-c"];

/// The pod a request with header `x-user: value` must land on: Higress's slot table for
/// weights 30/30/40 (docs/higress-cluster-policies.md §2).
fn expected_pod(value: &str) -> &'static str {
    match slot_of(value.as_bytes()) {
        0..30 => "pod-0",
        30..60 => "pod-1",
        _ => "pod-2",
    }
}

#[test]
fn cluster_hash_sends_a_header_value_to_the_same_cluster() {
    let bed = Bed::new(3, |_| {});
    let pods = bed.pod_addrs();
    let services: Vec<(&str, String)> = CLUSTERS.into_iter().zip(pods).collect();
    let clusters: Vec<_> = CLUSTERS
        .iter()
        .zip([30, 30, 40])
        .map(|(c, w)| json!({"cluster": c, "weight": w}))
        .collect();
    let plugin = json!({"lb_type": "cluster", "lb_policy": "cluster_hash",
        "lb_config": {"hash_header": "x-user", "clusters": clusters}});
    let envoy = Envoy::start_clusters(&services, &plugin);
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..12 {
        let user = format!("consumer-{i}");
        let want = expected_pod(&user);
        seen.insert(want);
        // A client naming another cluster does not get it.
        let (landed, statuses) = land(
            &envoy.url,
            3,
            &[
                ("x-user", user.as_str()),
                ("x-higress-target-cluster", "llm-a"),
            ],
        );
        assert!(
            statuses.iter().all(|s| *s == 200),
            "{statuses:?}\n{}",
            envoy.logs()
        );
        assert_eq!(landed.len(), 1, "{user}: {landed:?}");
        assert_eq!(landed.get(want), Some(&3), "{user}: {landed:?}");
    }
    assert!(
        seen.len() >= 2,
        "the values cover several clusters: {seen:?}"
    );
    // No hash header: Higress's 403.
    let (status, _, body) = http(
        &envoy.url,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        b"{}",
    )
    .unwrap();
    assert_eq!(
        (status, body.as_slice()),
        (403, &b"hash header required"[..])
    );
    assert_eq!(envoy.stat("ai_lb.cluster_hash.routed"), 36);
    assert_eq!(envoy.stat("ai_lb.cluster_hash.rejected_403"), 1);
}

/// A service that answers every request 500 (with `x-pod: failing`).
fn failing_service() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let _ = reader.get_mut().write_all(
                    b"HTTP/1.1 500 Internal Server Error\r\nx-pod: failing\r\ncontent-length: 5\r\nconnection: close\r\n\r\nerror",
                );
            });
        }
    });
    addr
}

#[test]
fn cluster_metrics_moves_traffic_off_a_failing_service() {
    let bed = Bed::new(2, |_| {});
    let pods = bed.pod_addrs();
    let services = vec![
        ("llm-a", pods[0].clone()),
        ("llm-b", pods[1].clone()),
        ("llm-c", failing_service()),
    ];
    let plugin = json!({"lb_type": "cluster", "lb_policy": "cluster_metrics",
        "lb_config": {"mode": "AdaptiveScore", "p2c_choices": 3,
                      "service_list": ["llm-a", "llm-b", "llm-c"]}});
    let envoy = Envoy::start_clusters(&services, &plugin);
    // Every client names the failing service in the route's cluster header: the plugin's
    // published value replaces it (Envoy's replace drops the client's copies; the plugin no
    // longer removes them first), so it never steers.
    let (landed, statuses) = land(&envoy.url, 40, &[(TARGET_HEADER, "llm-c")]);
    let failed = landed.get("failing").copied().unwrap_or(0);
    // Before its first error is recorded (at stream end, which may trail the client's
    // response) the failing service is a candidate like the others; once recorded, its
    // cooldown (shared by both workers) keeps it out. A uniform pick would send it ~13.
    assert!(failed <= 3, "landed: {landed:?}\n{}", envoy.logs());
    assert_eq!(statuses.iter().filter(|s| **s == 500).count(), failed);
    assert!(
        landed.contains_key("pod-0") && landed.contains_key("pod-1"),
        "{landed:?}"
    );
    assert_eq!(envoy.stat("ai_lb.cluster_metrics.routed"), 40);
    assert_eq!(envoy.stat("ai_lb.cluster_metrics.stats_failed"), 0);
}
