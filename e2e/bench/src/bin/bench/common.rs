//! Helpers shared by the benchmark sections: the 10-turn chat, its VM-time measurement,
//! percentiles, medians over seeds and workload shapes.

use ailb_e2e::gateway::{http, Gateway};
use ailb_fakepod::load::{Arrivals, SkewedSpec};
use ailb_fakepod::rng::Dist;
use serde_json::json;
use std::time::Duration;

/// A 10-turn chat of about 8 KB.
pub fn chat10() -> Vec<u8> {
    let mut messages =
        vec![json!({"role": "system", "content": "You are a helpful assistant. ".repeat(12)})];
    for i in 0..10 {
        messages.push(json!({"role": "user", "content": format!("question {i}: {}", "lorem ipsum dolor sit amet ".repeat(10))}));
        messages.push(json!({"role": "assistant", "content": format!("answer {i}: {}", "consectetur adipiscing elit ".repeat(12))}));
    }
    json!({"model": "fake-model", "messages": messages, "max_tokens": 1})
        .to_string()
        .into_bytes()
}

/// The median of several seeds' figures (the upper one of an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Their spread: max − min.
pub fn spread(v: &[f64]) -> f64 {
    let max = v.iter().copied().fold(f64::NAN, f64::max);
    let min = v.iter().copied().fold(f64::NAN, f64::min);
    max - min
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `count` open-loop arrivals over `seconds`, output lengths lognormal(`median`, `sigma`)
/// capped at `max_tokens`, prompts up to 1000 tokens.
pub fn lognormal_sizes(
    count: usize,
    seconds: u64,
    median: f64,
    sigma: f64,
    max_tokens: u64,
) -> SkewedSpec {
    let mut s = SkewedSpec {
        arrivals: Arrivals::Count {
            count,
            duration: Duration::from_secs(seconds),
        },
        ..SkewedSpec::default()
    };
    s.max_tokens.dist = Dist::LogNormal { median, sigma };
    s.max_tokens.max = max_tokens;
    s.prompt_tokens.max = 1000;
    s
}

/// POSTs the 10-turn chat through `gw`; anything but 200 is an error.
pub fn post_chat10(gw: &Gateway) -> anyhow::Result<()> {
    let (status, _, _) = http(
        &gw.url,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        &chat10(),
    )?;
    anyhow::ensure!(status == 200, "status {status}");
    Ok(())
}

/// Plugin CPU per request: the emulator's VM time (plugin code and the host calls it makes)
/// over `n` requests, after `warm` unmeasured ones, sent one at a time.
pub fn vm_us_per_request(gw: &Gateway, warm: usize, n: usize) -> anyhow::Result<f64> {
    vm_us_per_request_by(gw, warm, n, || post_chat10(gw))
}

/// [`vm_us_per_request`] with each request sent by `send`.
pub fn vm_us_per_request_by(
    gw: &Gateway,
    warm: usize,
    n: usize,
    send: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    for _ in 0..warm {
        send()?;
    }
    vm_us_over(gw, || (0..n).try_for_each(|_| send()))
}

/// [`vm_us_per_request`] with `clients` threads sending `n` requests in all, so the gateway's
/// workers are busy instead of waking up for each request: the figure of a loaded gateway,
/// whose caches stay warm (an idle worker's first VM entry finds code and data evicted).
pub fn vm_us_per_request_loaded(gw: &Gateway, clients: usize, n: usize) -> anyhow::Result<f64> {
    vm_us_over(gw, || {
        from_clients(clients, |_| {
            (0..n / clients).try_for_each(|_| post_chat10(gw))
        })
    })
}

/// Runs `client(c)` for `c` in `0..clients`, each on its own thread, all at once; the first
/// error (or a panicked client) is the result.
pub fn from_clients(
    clients: usize,
    client: impl Fn(usize) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<()> {
    std::thread::scope(|s| {
        let client = &client;
        let senders: Vec<_> = (0..clients).map(|c| s.spawn(move || client(c))).collect();
        senders.into_iter().try_for_each(|t| {
            t.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))?
        })
    })
}

/// VM ns per destroyed stream over what `send` sends.
fn vm_us_over(gw: &Gateway, send: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let (ns0, n0) = (
        gw.stat("gateway.vm_call_ns"),
        gw.stat("gateway.streams_destroyed"),
    );
    send()?;
    let (ns1, n1) = (
        gw.stat("gateway.vm_call_ns"),
        gw.stat("gateway.streams_destroyed"),
    );
    anyhow::ensure!(
        n1 > n0 && ns1 > ns0,
        "the emulator reports no VM time (gateway.vm_call_ns)"
    );
    Ok((ns1 - ns0) as f64 / (n1 - n0) as f64 / 1e3)
}

/// Poisson arrival times at `rate` per second for `seconds`, each with a uniform draw in
/// [0, 1) that labels it (a class, a tenant), from `seed` (SplitMix64): every run of a section
/// replays the same sequence.
pub fn poisson_arrivals(seed: u64, rate: f64, seconds: f64) -> Vec<(Duration, f64)> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut t = 0.0;
    let mut out = Vec::new();
    loop {
        t += -(1.0 - next()).ln() / rate;
        if t >= seconds {
            return out;
        }
        out.push((Duration::from_secs_f64(t), next()));
    }
}

/// One `BENCH <name> <value> <unit>` line.
pub fn bench(name: &str, v: f64, unit: &str) {
    println!("BENCH {name} {v:.3} {unit}");
}

/// A figure over seeds: its median as `name` and its spread as `<name>_spread`; nothing when
/// no seed has it.
pub fn bench_over_seeds(name: &str, v: &[f64], unit: &str) {
    if v.is_empty() {
        return;
    }
    bench(name, median(v), unit);
    bench(&format!("{name}_spread"), spread(v), unit);
}
