//! The fault storm shared by the leak test and the leak benchmark: two gateways, three pods,
//! upstream resets, hangs (ending in 504), 503s, 429s from `maxRequestCount`, client aborts,
//! Redis stalls (picks wait; aborts land before they return) and a Redis restart.

use crate::bed::Bed;
use crate::gateway::{glr_config, Gateway};
use ailb_fakepod::load::{
    self, AbortPhase, AbortRule, Arrivals, HeaderRule, LoadConfig, SkewedSpec, Summary, Workload,
};
use serde_json::json;
use std::time::Duration;

pub fn bed() -> Bed {
    Bed::new(3, |c| {
        c.max_running = 16;
        c.decode_us_per_token = 2_000;
        c.prefill_us_per_token = 5;
    })
}

/// Two gateways with a small `maxRequestCount` (so 429s happen) and a 1 s upstream timeout.
pub fn gateways(bed: &Bed, lease_ttl_s: u64) -> anyhow::Result<(Gateway, Gateway)> {
    let cfg = glr_config(
        bed.redis.port,
        json!({"maxRequestCount": 3, "leaseTTL": lease_ttl_s}),
    );
    let mut spec = bed.spec("storm-a", Some(cfg));
    spec.upstream_timeout_ms = 1_000;
    let a = Gateway::start(&spec)?;
    spec.id = "storm-b".into();
    let b = Gateway::start(&spec)?;
    Ok((a, b))
}

pub fn load(targets: Vec<String>, count: usize, duration: Duration, seed: u64) -> LoadConfig {
    let mut spec = SkewedSpec {
        arrivals: Arrivals::Count { count, duration },
        ..SkewedSpec::default()
    };
    spec.prompt_tokens.max = 2000;
    spec.max_tokens.max = 64;
    let fault = |v: &str, p: f64| HeaderRule {
        name: "x-fake-fault".into(),
        value: v.into(),
        probability: p,
    };
    let mut lc = LoadConfig::new(targets, Workload::Skewed(spec));
    lc.seed = seed;
    lc.timeout = Duration::from_secs(10);
    lc.headers = vec![
        fault("reset", 0.04),
        fault("reset-after-headers", 0.04),
        fault("hang", 0.02),
        fault("status:503", 0.04),
    ];
    // 40 ms after sending: after the pick normally, before it while Redis is stalled.
    lc.abort = Some(AbortRule {
        probability: 0.15,
        after: Duration::from_millis(40),
        phase: AbortPhase::BeforeFirstByte,
    });
    lc
}

/// Runs `lc` while stalling Redis `stalls` times, `every` apart, then restarting it.
pub fn run_with_chaos(
    bed: &mut Bed,
    lc: LoadConfig,
    stalls: usize,
    every: Duration,
) -> anyhow::Result<Summary> {
    let run = bed.rt.spawn(async move { load::run(&lc).await });
    for _ in 0..stalls {
        std::thread::sleep(every);
        let reply = bed.redis.try_cmd(&["DEBUG", "SLEEP", "0.5"]);
        anyhow::ensure!(
            matches!(reply, Some(ailb_core::redis::resp::Value::Simple(_))),
            "Redis refused to stall: {reply:?}"
        );
    }
    std::thread::sleep(every);
    bed.redis.restart();
    bed.rt.block_on(run)?
}
