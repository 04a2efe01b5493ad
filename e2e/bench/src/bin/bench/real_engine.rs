//! real_engine (issue 51): how far the fake pods are from a real engine on the same workload.
//! Multi-turn streamed chats (ailb_e2e::conversations) through the emulator (Higress build,
//! Redis) to three llama.cpp engines with 2 slots each, by round robin (no plugin) and by
//! prefix_cache, side by side for each of three seeds; then the same runs against three fake
//! pods made like the engines (2 running requests each, a prefix cache of two conversations).
//! Every run starts cold: new engines (a llama-server keeps its slots' prompts), reset fake
//! pods, a new Redis. The figures are the engines' own cached tokens over the prompt tokens of
//! every later turn, and the later turns' time to first token; medians over the seeds, with
//! their spread (max - min). Output text is random: only usage and timings are read.

use crate::common::{bench, bench_over_seeds, median};
use ailb_e2e::bed::Bed;
use ailb_e2e::conversations::{replay, Conversations, Replay};
use ailb_e2e::gateway::{Gateway, GatewaySpec};
use ailb_e2e::llama::{self, fleet, EngineConfig};
use ailb_testkit::{Options, RedisServer};
use serde_json::json;
use std::time::Instant;

const DEBUG: &str = "x-ai-lb-debug";
const SEEDS: [u64; 3] = [1, 2, 3];
const ENGINES: usize = 3;
const SLOTS: usize = 2;

/// llama-server closes its connection after every streamed answer without saying so
/// (docs/real-engines.md): a request the gateway's pool sends on it at that instant is reset
/// before its headers ("upstream connect error or disconnect/reset before headers"); the route
/// retries such a request once, as an Envoy route in front of it would be told to. Retries are
/// counted on stderr.
static RETRY: std::sync::LazyLock<serde_json::Value> =
    std::sync::LazyLock::new(|| json!({"retry_on": "reset,connect-failure", "num_retries": 1}));

/// The workload: twenty times as many conversations as the fleet has slots (so a finished
/// conversation's slot is taken by a new one and placement decides the hits), as many in
/// flight as the fleet has slots. 120 conversations keep the spread of the prefix_cache share
/// over the seeds near 0.05 on real engines (24 gave 0.28, 72 gave 0.055); the section takes
/// about two minutes.
fn workload(seed: u64) -> Conversations {
    Conversations {
        count: 120,
        turns: 4,
        concurrency: ENGINES * SLOTS,
        system_words: 300,
        question_words: 40,
        answer_tokens: 24,
        seed,
        debug_header: DEBUG.into(),
        stream: true,
    }
}

/// The fake pods' prefix cache holds what the engine's slots hold: `SLOTS` conversations at
/// their longest (prompt and answer of the last turn, 4 bytes per fake token; the vocabulary's
/// words average 6.8 bytes with their space), in 16-token blocks.
fn fake_cache_blocks(w: &Conversations) -> usize {
    let bytes = 32.0
        + w.system_words as f64 * 6.8
        + w.turns as f64 * (w.question_words as f64 * 6.8 + w.answer_tokens as f64 * 4.0 + 24.0);
    SLOTS * (bytes / 4.0 / 16.0).ceil() as usize
}

/// One side of the comparison: later-turn cached share and TTFT p50 (ms) per seed.
#[derive(Default)]
struct Side {
    share: Vec<f64>,
    ttft_ms: Vec<f64>,
}

/// One cold run of `seed` against `pods`, by prefix_cache (`prefix`) or round robin.
fn run(pods: &[String], seed: u64, prefix: bool, tag: &str) -> anyhow::Result<Replay> {
    let redis = RedisServer::start_with(Options::default());
    let plugin = prefix.then(|| {
        json!({"lb_policy": "prefix_cache", "lb_config": {"serviceFQDN": "redis.static",
            "servicePort": redis.port, "timeout": 1000, "debugHeader": DEBUG}})
    });
    let mut spec = GatewaySpec::new(tag, redis.port, pods, plugin);
    spec.retry_policy = Some(RETRY.clone());
    let gw = Gateway::start(&spec)?;
    let r = replay(&gw.url, &workload(seed), &[]);
    let failed: Vec<u16> = r
        .turns
        .iter()
        .filter(|t| t.status != 200)
        .map(|t| t.status)
        .collect();
    if !failed.is_empty() {
        let logs = gw.logs();
        let lines: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("503"))
            .take(20)
            .collect();
        anyhow::bail!("{tag}: turns failed with {failed:?}\n{}", lines.join("\n"));
    }
    eprintln!(
        "{tag}: later turns cached {:.3}, TTFT p50 {:?}, latency p50 {:?}, retried {}",
        r.later_turn_cached_share(),
        r.later_turn_ttft(0.5),
        r.later_turn_latency(0.5),
        gw.stat("gateway.upstream_rq_retry")
    );
    Ok(r)
}

fn record(side: &mut Side, r: &Replay) {
    side.share.push(r.later_turn_cached_share());
    side.ttft_ms
        .push(r.later_turn_ttft(0.5).as_secs_f64() * 1e3);
}

/// The figures of one kind of pod (`real_engine` or `fake_pod`).
fn report(name: &str, px: &Side, rr: &Side) {
    bench_over_seeds(&format!("{name}_prefix_cached_share"), &px.share, "share");
    bench_over_seeds(
        &format!("{name}_prefix_cached_share_round_robin"),
        &rr.share,
        "share",
    );
    let ratios: Vec<f64> = px
        .ttft_ms
        .iter()
        .zip(&rr.ttft_ms)
        .map(|(p, r)| p / r)
        .collect();
    bench_over_seeds(
        &format!("{name}_ttft_p50_over_round_robin"),
        &ratios,
        "ratio",
    );
    bench(&format!("{name}_ttft_p50_ms"), median(&px.ttft_ms), "ms");
    bench(
        &format!("{name}_ttft_p50_ms_round_robin"),
        median(&rr.ttft_ms),
        "ms",
    );
}

pub fn real_engine() -> anyhow::Result<()> {
    let t0 = Instant::now();
    let (mut px, mut rr) = (Side::default(), Side::default());
    let engine = EngineConfig {
        slots: SLOTS,
        ..EngineConfig::default()
    };
    for seed in SEEDS {
        for prefix in [false, true] {
            let engines = fleet(ENGINES, &engine)?;
            let addrs = llama::addrs(&engines);
            let tag = format!("real-{}-{seed}", if prefix { "px" } else { "rr" });
            let r = run(&addrs, seed, prefix, &tag)?;
            record(if prefix { &mut px } else { &mut rr }, &r);
        }
    }
    report("real_engine", &px, &rr);
    // The fake pods, timed roughly as the tiny model runs here (about 50 us per prefilled
    // token, 0.6 ms per output token).
    let blocks = fake_cache_blocks(&workload(1));
    let bed = Bed::new(ENGINES, |c| {
        c.max_running = SLOTS;
        c.cache_blocks = blocks;
        c.prefill_us_per_token = 50;
        c.decode_us_per_token = 600;
    });
    let (mut fpx, mut frr) = (Side::default(), Side::default());
    for seed in SEEDS {
        for prefix in [false, true] {
            bed.reset_pods();
            let tag = format!("fake-{}-{seed}", if prefix { "px" } else { "rr" });
            let r = run(&bed.pod_addrs(), seed, prefix, &tag)?;
            record(if prefix { &mut fpx } else { &mut frr }, &r);
        }
    }
    report("fake_pod", &fpx, &frr);
    bench(
        "real_engine_section_seconds",
        t0.elapsed().as_secs_f64(),
        "s",
    );
    Ok(())
}
