//! What `make run` prints: where everything listens, the workload's lines, a per-pod table
//! (per service for the cluster policies) and the policy's own counters.

use crate::demo::{Demo, Outcome};
use ailb_core::config::Policy;
use ailb_e2e::cluster::service_of;
use std::path::Path;

pub fn header(demo: &Demo, log: &Path) {
    let gw = &demo.gateway;
    println!("policy    {}   config {}", demo.policy.name(), demo.config);
    println!("gateway   {}   (admin {})", gw.url, gw.admin);
    println!("redis     127.0.0.1:{}", demo.bed.redis.port);
    for p in &demo.bed.pods {
        println!("{:9} {}", p.name, p.url());
    }
    crate::real::header(&demo.engines);
    println!("log       {}", log.display());
    let extra = match demo.policy {
        Policy::ClusterHash => " -H 'x-user: alice'",
        _ => "",
    };
    let model = if demo.engines.is_empty() {
        "fake-model"
    } else {
        "tiny"
    };
    println!(
        "try: curl -si {}/v1/chat/completions{extra} -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'\n",
        gw.url
    );
}

pub fn table(demo: &Demo, out: &Outcome) {
    for line in &out.lines {
        println!("{line}");
    }
    let statuses: Vec<String> = out
        .statuses
        .iter()
        .map(|(s, n)| format!("{s}×{n}"))
        .collect();
    println!("statuses: {}", statuses.join(" "));
    println!();
    match demo.policy {
        _ if !demo.engines.is_empty() => crate::real::engine_table(demo, out),
        Policy::ClusterMetrics | Policy::ClusterHash => service_table(demo, out),
        _ => pod_table(demo, out),
    }
}

fn pod_table(demo: &Demo, out: &Outcome) {
    let after = demo.bed.counts();
    println!(
        "{:<8} {:<22} {:>9} {:>8} {:>8} {:>8} {:>12} {:>11}",
        "pod", "address", "requests", "running", "waiting", "peak", "prefix hit", "redis load"
    );
    for p in &demo.bed.pods {
        let s = p.state();
        let addr = p.addr.to_string();
        let hit = if s.prefix_query_tokens > 0 {
            format!(
                "{:.2}",
                s.prefix_hit_tokens as f64 / s.prefix_query_tokens as f64
            )
        } else {
            "-".into()
        };
        // Through the gateway (endpoint_metrics' preload went around it).
        let via_gateway = out.landed.get(&p.name).copied().unwrap_or(0);
        let in_flight = out
            .in_flight
            .as_ref()
            .and_then(|c| c.load.get(&addr))
            .map_or("-".to_string(), |l| {
                format!("{l} → {}", after.load.get(&addr).copied().unwrap_or(0.0))
            });
        println!(
            "{:<8} {:<22} {:>9} {:>8} {:>8} {:>8} {:>12} {:>11}",
            p.name, addr, via_gateway, s.running, s.waiting, s.peak_running, hit, in_flight
        );
    }
    if demo.policy.metric_label() == "glr" || demo.policy.metric_label() == "prefix" {
        println!("(leases left in Redis: {})", after.leases);
    }
}

fn service_table(demo: &Demo, out: &Outcome) {
    let service = |pod: &str| service_of(&demo.services, pod).unwrap_or("-").to_string();
    println!(
        "{:<10} {:<14} {:>9} {:>6}",
        "service", "pods", "requests", "users"
    );
    for svc in &demo.services {
        let pods: Vec<String> = svc.pods.iter().map(|i| format!("pod-{i}")).collect();
        let n: usize = out
            .landed
            .iter()
            .filter(|(pod, _)| service_of(&demo.services, pod) == Some(svc.name.as_str()))
            .map(|(_, n)| n)
            .sum();
        let users = out
            .users
            .values()
            .filter(|pods| pods.iter().any(|p| service(p) == svc.name))
            .count();
        println!(
            "{:<10} {:<14} {:>9} {:>6}",
            svc.name,
            pods.join(","),
            n,
            users
        );
    }
    if !out.users.is_empty() {
        let moved = out
            .users
            .values()
            .filter(|pods| {
                pods.iter()
                    .map(|p| service(p))
                    .collect::<std::collections::BTreeSet<_>>()
                    .len()
                    > 1
            })
            .count();
        println!("users whose requests went to more than one service: {moved}");
    }
}

/// The policy's counters (`ai_lb.<label>.*`), then any fallback or Redis error.
pub fn counters(demo: &Demo) {
    let group = format!("ai_lb.{}.", demo.policy.metric_label());
    let stats = demo.gateway.stats();
    println!("\nplugin counters ({}*):", group);
    for (name, value) in &stats {
        if name.starts_with(&group) {
            println!("  {name} {value}");
        }
    }
    let trouble: Vec<String> = stats
        .iter()
        .filter(|(n, v)| {
            **v > 0
                && (n.starts_with("ai_lb.fallback.")
                    || n.as_str() == "ai_lb.redis.errors"
                    || n.as_str() == "ai_lb.redis.timeouts")
        })
        .map(|(n, v)| format!("{n} {v}"))
        .collect();
    if !trouble.is_empty() {
        println!("  and: {}", trouble.join(", "));
    }
}
