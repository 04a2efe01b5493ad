//! The fault storm shared by the leak test and the leak benchmark: two gateways, three pods,
//! upstream resets, hangs (ending in 504), 503s, 429s from `maxRequestCount`, client aborts,
//! Redis stalls (picks wait; aborts land before they return) and a Redis restart; the
//! benchmark's long run (`long_run`) adds SIGSTOP stalls and gateway SIGKILLs.

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
    // The storm's faults are drawn per request on every pod, not a pod's: at 3 requests a pod,
    // failure memory's default penalty (a failed request's count held 1 s) would leave a third
    // of the pool's slots to faults no pod has. A short one keeps that path in the storm.
    let cfg = glr_config(
        bed.redis.port,
        json!({"maxRequestCount": 3, "leaseTTL": lease_ttl_s, "failurePenaltyMs": 200}),
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

/// One fault of the long run's schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chaos {
    /// `DEBUG SLEEP 0.5`: Redis answers nothing for half a second.
    RedisSleep,
    /// SIGSTOP, 700 ms, SIGCONT: the process stalls (connections stay open, nothing moves).
    RedisStop,
    /// Killed and started again, empty.
    RedisRestart,
    /// SIGKILL of the second gateway (no on_done, no release) and a new process on its port;
    /// what the dead one held heals through lease expiry (docs/redis-data-model.md §6).
    GatewayKill,
}

/// The long run's faults, in order, spread evenly over the load.
pub const LONG_RUN_CHAOS: &[Chaos] = &[
    Chaos::RedisSleep,
    Chaos::GatewayKill,
    Chaos::RedisStop,
    Chaos::RedisSleep,
    Chaos::RedisRestart,
    Chaos::RedisStop,
    Chaos::GatewayKill,
    Chaos::RedisSleep,
    Chaos::RedisStop,
];

pub struct LongRun {
    pub summary: Summary,
    /// The surviving gateway's resident memory after the warm-up and after the run (KiB).
    pub rss_start_kb: u64,
    /// Halfway through the run: a leak keeps growing after it, a warm-up plateau does not.
    pub rss_mid_kb: u64,
    pub rss_end_kb: u64,
    /// Redis counts once every lease could have expired and been reclaimed (truth: zero).
    pub left: crate::redis::Counts,
    /// Summed over both gateways (the killed one's last process only).
    pub orphaned: i64,
    pub rejected_429: i64,
}

fn signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()?
        .success();
    anyhow::ensure!(ok, "kill {sig} {pid} failed");
    Ok(())
}

/// The fault storm at length: gateway `a` runs throughout (its memory is sampled after a
/// warm-up and at the end), gateway `b` is SIGKILLed and restarted on the same port, Redis
/// sleeps, stops and restarts (`LONG_RUN_CHAOS`) while `count` requests arrive over
/// `duration`. Afterwards probes drive the reclaim until the counts are zero or
/// `lease_ttl_s` + 20 s have passed.
pub fn long_run(
    bed: &mut Bed,
    count: usize,
    duration: Duration,
    lease_ttl_s: u64,
    seed: u64,
) -> anyhow::Result<LongRun> {
    // The storm's faults are drawn per request on every pod, not a pod's: at 3 requests a pod,
    // failure memory's default penalty (a failed request's count held 1 s) would leave a third
    // of the pool's slots to faults no pod has. A short one keeps that path in the storm.
    let cfg = glr_config(
        bed.redis.port,
        json!({"maxRequestCount": 3, "leaseTTL": lease_ttl_s, "failurePenaltyMs": 200}),
    );
    let mut spec = bed.spec("long-a", Some(cfg));
    spec.upstream_timeout_ms = 1_000;
    let a = Gateway::start(&spec)?;
    spec.id = "long-b".into();
    let mut b_config = spec.config();
    let b_listen = format!("127.0.0.1:{}", ailb_testkit::free_port());
    b_config["listen"] = json!(b_listen);
    let start_b = |config: &serde_json::Value| -> anyhow::Result<Gateway> {
        let mut last = None;
        for _ in 0..20 {
            match Gateway::start_config(config, "long-b") {
                Ok(g) => return Ok(g),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("gateway long-b did not start")))
    };
    let mut b = start_b(&b_config)?;
    let targets = vec![a.url.clone(), b.url.clone()];
    // Warm-up: every code path (faults included) once, before the first memory sample.
    let warm = load(targets.clone(), 600, Duration::from_secs(4), seed ^ 0x5eed);
    bed.rt.block_on(load::run(&warm))?;
    let rss_start_kb = a.rss_kb()?;
    let lc = load(targets, count, duration, seed);
    let run = bed.rt.spawn(async move { load::run(&lc).await });
    let every = duration / (LONG_RUN_CHAOS.len() as u32 + 1);
    let mut orphaned = 0;
    let mut rejected_429 = 0;
    let mut rss_mid_kb = rss_start_kb;
    for (i, chaos) in LONG_RUN_CHAOS.iter().enumerate() {
        std::thread::sleep(every);
        if i + 1 == LONG_RUN_CHAOS.len().div_ceil(2) {
            rss_mid_kb = a.rss_kb()?;
        }
        match chaos {
            Chaos::RedisSleep => {
                let reply = bed.redis.try_cmd(&["DEBUG", "SLEEP", "0.5"]);
                anyhow::ensure!(
                    matches!(reply, Some(ailb_core::redis::resp::Value::Simple(_))),
                    "Redis refused to stall: {reply:?}"
                );
            }
            Chaos::RedisStop => {
                let pid = bed
                    .redis
                    .pid()
                    .ok_or_else(|| anyhow::anyhow!("redis-server is not running"))?;
                signal(pid, "-STOP")?;
                std::thread::sleep(Duration::from_millis(700));
                signal(pid, "-CONT")?;
            }
            Chaos::RedisRestart => bed.redis.restart(),
            Chaos::GatewayKill => {
                orphaned += b.stat("ai_lb.release.orphaned");
                rejected_429 += b.stat("ai_lb.glr.rejected_429");
                b.kill();
                std::thread::sleep(Duration::from_millis(300));
                b = start_b(&b_config)?;
            }
        }
    }
    let summary = bed.rt.block_on(run)??;
    let rss_end_kb = a.rss_kb()?;
    orphaned += a.stat("ai_lb.release.orphaned") + b.stat("ai_lb.release.orphaned");
    rejected_429 += a.stat("ai_lb.glr.rejected_429") + b.stat("ai_lb.glr.rejected_429");
    crate::bed::probe_until_zero(bed, &a.url, Duration::from_secs(lease_ttl_s + 20));
    let left = bed.counts();
    Ok(LongRun {
        summary,
        rss_start_kb,
        rss_mid_kb,
        rss_end_kb,
        left,
        orphaned,
        rejected_429,
    })
}
