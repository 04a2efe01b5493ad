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

/// `make run ENGINE=llama POLICY=prefix_cache`: three real engines; every turn is answered,
/// later turns find most of their prompt cached, and each engine's own /metrics says it
/// reused prompt tokens. Output text is random: only usage and counters are read.
#[test]
fn prefix_cache_demo_on_real_engines() {
    let out = Command::new(ailb_e2e::e2e_bin("ailb-run"))
        .args(["--engine", "llama", "--policy", "prefix_cache", "--once"])
        .output()
        .expect("ailb-run starts");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("statuses: 200×64"), "{text}");
    assert_eq!(counter(&text, "ai_lb.prefix.routed"), 64, "{text}");
    assert_eq!(counter(&text, "ai_lb.prefix.fallback"), 0, "{text}");
    assert_eq!(counter(&text, "ai_lb.prefix.verify_no_usage"), 0, "{text}");
    // Every conversation fits the engines' slots, so every hit is held whole: judged in the
    // engine's own tokens, none reads as a shortfall (before the prediction was scaled to
    // them, all 48 read as mild ones).
    assert_eq!(counter(&text, "ai_lb.prefix.shortfall_mild"), 0, "{text}");
    assert_eq!(counter(&text, "ai_lb.prefix.shortfall"), 0, "{text}");
    let share: f64 = text
        .lines()
        .find_map(|l| l.split("later turns' prompt tokens cached ").nth(1))
        .and_then(|v| v.split(',').next()?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no cached share in\n{text}"));
    assert!(share > 0.6, "later turns mostly cached: {share}\n{text}");
    let engines: Vec<&str> = text.lines().filter(|l| l.starts_with("engine-")).collect();
    // Three in the header, three in the table: each table row names its engine's requests
    // and the tokens its /metrics says it reused.
    let rows: Vec<&str> = engines
        .iter()
        .copied()
        .filter(|l| l.contains("cached,"))
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    for row in rows {
        let requests: usize = row.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert!(requests > 0, "every engine serves: {row}");
        let reused: u64 = row
            .split("(+")
            .nth(1)
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no reused tokens in {row}"));
        assert!(reused > 0, "{row}");
    }
    // ailb-run has exited: no engine it started is left listening.
    for addr in text
        .lines()
        .filter(|l| l.ends_with("(llama-server)"))
        .filter_map(|l| l.split("http://").nth(1)?.split_whitespace().next())
    {
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "llama-server on {addr} outlived ailb-run"
        );
    }
    let log = log_file(&text);
    assert!(log.contains("config accepted"), "{log}");
}
