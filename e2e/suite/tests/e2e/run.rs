//! `make run POLICY=<name>`: each policy's demo starts, shows its policy routing every request
//! of its workload in its own counters, and writes the gateway's log to the file it names.

use std::process::Command;

fn run(policy: &str) -> String {
    let out = Command::new(ailb_e2e::e2e_bin("ailb-run"))
        .args(["--policy", policy, "--once"])
        .output()
        .expect("ailb-run starts");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{policy}: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The value of counter `name` in the printed counters.
fn counter(text: &str, name: &str) -> i64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

fn log_file(text: &str) -> String {
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("gateway log: "))
        .unwrap_or_else(|| panic!("no log file named in\n{text}"));
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn every_policy_demo_routes_its_workload_and_logs_to_a_file() {
    // (policy, counter group, requests the plugin routes)
    let cases = [
        ("global_least_request", "glr", 72),
        ("prefix_cache", "prefix", 96),
        ("endpoint_metrics", "metrics", 12),
        ("cluster_metrics", "cluster_metrics", 60),
        ("cluster_hash", "cluster_hash", 60),
    ];
    for (policy, group, routed) in cases {
        let text = run(policy);
        assert_eq!(
            counter(&text, &format!("ai_lb.{group}.routed")),
            routed,
            "{text}"
        );
        assert_eq!(counter(&text, &format!("ai_lb.{group}.fallback")), 0);
        let log = log_file(&text);
        assert!(
            log.contains("config accepted") && log.contains(policy),
            "{policy}: the plugin's own lines are in the log:\n{log}"
        );
        match policy {
            "prefix_cache" => assert!(counter(&text, "ai_lb.prefix.hit") > 48, "{text}"),
            "endpoint_metrics" => assert!(
                text.lines()
                    .any(|l| l.starts_with("pod-0 ") && l.split_whitespace().nth(2) == Some("0")),
                "no request through the gateway reaches the busy pod:\n{text}"
            ),
            "cluster_hash" => {
                assert!(text.contains("more than one service: 0"), "{text}");
                assert_eq!(counter(&text, "ai_lb.cluster_hash.rejected_403"), 1);
            }
            _ => {}
        }
    }
}
