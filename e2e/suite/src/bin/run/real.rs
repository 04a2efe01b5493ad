//! `make run ENGINE=llama`: three real llama.cpp engines (ailb_e2e::llama) in place of the fake
//! pods, the policy's workload against them (multi-turn chats for prefix_cache, concurrent
//! long answers for global_least_request) and a per-engine table read from the answers' usage
//! and from each engine's own /metrics.

use crate::demo::{Demo, Outcome};
use ailb_core::config::Policy;
use ailb_e2e::bed::Bed;
use ailb_e2e::conversations::{replay, Conversations, Replay};
use ailb_e2e::gateway::{Gateway, GatewaySpec};
use ailb_e2e::llama::{self, fleet, Engine, EngineConfig};
use ailb_e2e::redis::Counts;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub const DEBUG: &str = "x-ai-lb-debug";

/// Redis and three engines (2 slots each), and a gateway running `policy` over them.
pub fn start(policy: Policy) -> anyhow::Result<Demo> {
    let label = match policy {
        Policy::GlobalLeastRequest => "global_least_request",
        Policy::PrefixCache => "prefix_cache",
        other => anyhow::bail!(
            "--engine llama runs global_least_request and prefix_cache; {} needs fake pods \
             (several services, or pods made busy or failing on purpose): run it without \
             --engine llama",
            other.name()
        ),
    };
    let bed = Bed::new(0, |_| {});
    let engines = fleet(3, &EngineConfig::default())?;
    let addrs = llama::addrs(&engines);
    let config = json!({"lb_policy": label, "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": bed.redis.port, "debugHeader": DEBUG}});
    let mut spec = GatewaySpec::new("gw-1", bed.redis.port, &addrs, Some(config.clone()));
    spec.log_level = "info".into();
    // llama-server closes its connection after every streamed answer without saying so
    // (docs/real-engines.md): a request the pool sends on it at that instant is reset before
    // its headers, so the route retries a reset once, as an Envoy route in front of it would.
    spec.retry_policy = Some(json!({"retry_on": "reset,connect-failure", "num_retries": 1}));
    let gateway = Gateway::start(&spec)?;
    Ok(Demo {
        policy,
        bed,
        gateway,
        services: Vec::new(),
        config,
        engines,
    })
}

/// The workload against the engines.
pub fn workload(demo: &Demo) -> Outcome {
    let mut out = Outcome::default();
    let url = &demo.gateway.url;
    let r = match demo.policy {
        Policy::PrefixCache => {
            // More conversations than the fleet has slots (3 x 2), four at a time: later
            // turns find their prefix only on the engine whose slot still holds it.
            let cfg = chats(16, 4, 4, 24);
            let r = replay(url, &cfg, &[]);
            out.lines.push(format!(
                "chats   : 16 conversations x 4 turns, 4 at a time, streamed; later turns' prompt \
                 tokens cached {:.2}, TTFT p50 {:?}",
                r.later_turn_cached_share(),
                r.later_turn_ttft(0.5)
            ));
            r
        }
        _ => {
            // Twelve long answers at once (sampled in Redis while they run), then 24 more.
            let stop = AtomicBool::new(false);
            let (r, peak) = std::thread::scope(|s| {
                let sampler = s.spawn(|| peak_counts(&demo.bed, &stop));
                let r = replay(url, &chats(12, 1, 12, 200), &[]);
                stop.store(true, Ordering::Relaxed);
                (r, sampler.join().ok())
            });
            out.in_flight = peak;
            out.lines.push(format!(
                "hold    : 12 concurrent requests of 200 tokens, p50 {:?}",
                first_turn_p50(&r)
            ));
            let more = replay(url, &chats(24, 1, 6, 32), &[]);
            out.lines.push(format!(
                "more    : 24 requests, 6 at a time, p50 {:?}",
                first_turn_p50(&more)
            ));
            let mut all = r;
            all.turns.extend(more.turns);
            all
        }
    };
    for t in &r.turns {
        *out.statuses.entry(t.status).or_default() += 1;
    }
    out.replay = Some(r);
    out
}

fn chats(count: usize, turns: usize, concurrency: usize, answer_tokens: u64) -> Conversations {
    Conversations {
        count,
        turns,
        concurrency,
        answer_tokens,
        stream: true,
        debug_header: DEBUG.into(),
        ..Conversations::default()
    }
}

fn first_turn_p50(r: &Replay) -> Duration {
    let mut l: Vec<Duration> = r.turns.iter().map(|t| t.latency).collect();
    l.sort();
    l.get(l.len() / 2).copied().unwrap_or_default()
}

/// The Redis counts with the most leases seen until `stop`.
fn peak_counts(bed: &Bed, stop: &AtomicBool) -> Counts {
    let mut best = bed.counts();
    while !stop.load(Ordering::Relaxed) {
        let c = bed.counts();
        if c.leases > best.leases {
            best = c;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    best
}

/// Per engine: requests, prompt and cached tokens from the answers' usage, then the engine's
/// own counters (`llamacpp:prompt_tokens_total` counts only the tokens it prefilled).
pub fn engine_table(demo: &Demo, out: &Outcome) {
    let by = out
        .replay
        .as_ref()
        .map(Replay::by_endpoint)
        .unwrap_or_default();
    let after = demo.bed.counts();
    println!(
        "{:<9} {:<16} {:>8} {:>13} {:>7} {:>27} {:>11}",
        "engine",
        "address",
        "requests",
        "prompt tokens",
        "cached",
        "prefilled (metrics)",
        "redis load"
    );
    for e in &demo.engines {
        let t = by.get(&e.addr).copied().unwrap_or_default();
        let share = |c: u64, p: u64| {
            if p == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", c as f64 / p as f64)
            }
        };
        let metric = |n: &str| e.metric(n).map_or(-1.0, |v| v);
        let prefilled = metric("llamacpp:prompt_tokens_total");
        let reused = metric("llamacpp:prompt_tokens_cached_total");
        let from_metrics = if prefilled < 0.0 || reused < 0.0 {
            "-".to_string()
        } else {
            format!(
                "{prefilled:.0} (+{reused:.0} cached, {})",
                share(reused as u64, (prefilled + reused) as u64)
            )
        };
        let load = out
            .in_flight
            .as_ref()
            .and_then(|c| c.load.get(&e.addr))
            .map_or("-".to_string(), |l| {
                format!("{l} → {}", after.load.get(&e.addr).copied().unwrap_or(0.0))
            });
        println!(
            "{:<9} {:<16} {:>8} {:>13} {:>7} {:>27} {:>11}",
            e.name,
            e.addr,
            t.requests,
            t.prompt_tokens,
            share(t.cached_tokens, t.prompt_tokens),
            from_metrics,
            load
        );
    }
    if let Some(n) = by.get("-") {
        println!("(turns without the debug header: {})", n.requests);
    }
    println!("(leases left in Redis: {})", after.leases);
}

/// The engine lines of the header.
pub fn header(engines: &[Engine]) {
    for e in engines {
        println!("{:9} {} (llama-server)", e.name, e.url());
    }
}
