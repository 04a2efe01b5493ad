//! `ailb-bench latency`: the gateway time a user feels, added by the plugin over the same
//! gateway without it (issue 47). One streamed Chat request of 12k and of 100k prompt tokens at
//! a time, interleaved request by request through a gateway running prefix_cache (and, at 100k,
//! one running global_least_request) and one running no plugin (the emulator's round robin), so
//! every gateway sees the same machine state; then the trace under its concurrency
//! (trace/latency.rs).
//!
//! The baseline is the same emulator without the plugin, not a client sending straight to a
//! pod: the gateway's own proxying (the HTTP hops, relaying every chunk) is there in both, so
//! the difference is the plugin's alone — its body buffering and reading, canonicalisation and
//! chain, the Redis round trip, and its work on every response chunk.

use crate::common::percentile;
use crate::prefix::prefix_config;
use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::{glr_config, open, Gateway};
use serde_json::{json, Value};
use std::io::Read;
use std::time::{Duration, Instant};

/// Output tokens of each streamed answer: a short answer, so the request's own path dominates
/// while every response chunk still goes through the plugin.
const OUTPUT_TOKENS: u64 = 16;

/// `AILB_LATENCY_PARTS` (a comma list of `one`, `trace`) runs some parts only.
pub fn gateway_added() -> anyhow::Result<()> {
    let part = |name: &str| {
        std::env::var("AILB_LATENCY_PARTS").map_or(true, |v| v.split(',').any(|p| p.trim() == name))
    };
    if part("one") {
        one_at_a_time()?;
    }
    if part("trace") {
        crate::trace::latency::gateway_added_under_load()?;
    }
    Ok(())
}

/// A streamed Chat conversation of about `tokens` prompt tokens (4 bytes of text each, as the
/// fake pods count): a system prompt and 20 turns of history, the same for every request, then
/// a last question that differs per `i`, as a conversation's next turn does.
pub fn conversation(tokens: usize, i: usize) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "alpha", "beta", "gamma", "delta", "kernel", "cache", "router", "prefix", "token",
        "stream", "budget", "engine",
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut text = |bytes: usize| {
        let mut s = String::with_capacity(bytes + 16);
        while s.len() < bytes {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            s.push_str(WORDS[(state % WORDS.len() as u64) as usize]);
            s.push(' ');
        }
        s
    };
    let per_turn = tokens * 4 / 42;
    let mut messages = vec![json!({"role": "system", "content": text(per_turn * 2)})];
    for t in 0..20 {
        let role = if t % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": text(per_turn * 2)}));
    }
    messages.push(json!({"role": "user", "content": format!("question {i}: what next?")}));
    json!({"model": "fake-model", "messages": messages, "stream": true, "max_tokens": OUTPUT_TOKENS})
        .to_string()
        .into_bytes()
}

/// Sends `body` and reads the whole stream: (time to the first response bytes, total time).
fn timed(base: &str, body: &[u8]) -> anyhow::Result<(Duration, Duration)> {
    let t = Instant::now();
    let mut s = open(
        base,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body,
    )?;
    let mut buf = [0u8; 16 * 1024];
    let mut raw = Vec::new();
    let mut first = None;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if first.is_none() && raw.windows(4).any(|w| w == b"\r\n\r\n") {
            first = Some(t.elapsed());
        }
    }
    let total = t.elapsed();
    anyhow::ensure!(raw.starts_with(b"HTTP/1.1 200"), "not a 200 answer");
    anyhow::ensure!(
        raw.windows(6).any(|w| w == b"[DONE]"),
        "the stream did not end"
    );
    Ok((first.unwrap_or(total), total))
}

/// Per gateway, the sorted total and first-bytes times in ms, and the sorted differences of
/// its total over the last gateway's (the baseline) within each round.
struct Times {
    total: Vec<f64>,
    first: Vec<f64>,
    added: Vec<f64>,
}

/// `n` rounds, each sending one request through every gateway in turn, the baseline last
/// (after `warm` unmeasured rounds): per gateway its times. A figure is the median of the
/// differences within a round, so the machine's load drifting during the run (other processes
/// on these two cores) moves both sides of each difference alike.
fn interleaved(
    gws: &[&Gateway],
    tokens: usize,
    warm: usize,
    n: usize,
) -> anyhow::Result<Vec<Times>> {
    let mut out: Vec<Times> = gws
        .iter()
        .map(|_| Times {
            total: Vec::new(),
            first: Vec::new(),
            added: Vec::new(),
        })
        .collect();
    for i in 0..warm + n {
        let body = conversation(tokens, i);
        let mut round = Vec::with_capacity(gws.len());
        for (g, t) in gws.iter().zip(out.iter_mut()) {
            let (first, total) = timed(&g.url, &body)?;
            round.push(total.as_secs_f64() * 1e3);
            if i >= warm {
                t.first.push(first.as_secs_f64() * 1e3);
                t.total.push(total.as_secs_f64() * 1e3);
            }
        }
        let base = round.last().copied().unwrap_or(0.0);
        if i >= warm {
            for (t, ms) in out.iter_mut().zip(&round) {
                t.added.push(ms - base);
            }
        }
    }
    for t in &mut out {
        t.added.sort_by(f64::total_cmp);
        t.total.sort_by(f64::total_cmp);
        t.first.sort_by(f64::total_cmp);
    }
    Ok(out)
}

fn p50(v: &[f64]) -> f64 {
    percentile(v, 0.5)
}

/// One request at a time at 12k and 100k prompt tokens.
fn one_at_a_time() -> anyhow::Result<()> {
    // Pods that answer at once: what remains is the gateway's time.
    let bed = Bed::new(2, |c| {
        c.prefill_us_per_token = 0;
        c.decode_us_per_token = 0;
        c.max_running = 64;
        c.max_output_tokens = OUTPUT_TOKENS;
    });
    let start = |id: &str, plugin: Option<Value>| Gateway::start(&bed.spec(id, plugin));
    let px = start("lat-px", Some(prefix_config(bed.redis.port)))?;
    let glr = start("lat-glr", Some(glr_config(bed.redis.port, json!({}))))?;
    let none = start("lat-none", None)?;
    let body12 = conversation(12_000, 0).len();
    let body100 = conversation(100_000, 0).len();
    let t = interleaved(&[&px, &none], 12_000, 20, 200)?;
    let (tp, tn) = (&t[0], &t[1]);
    eprintln!(
        "latency 12k ({body12} B): prefix_cache p50 {:.2} ms (first bytes {:.2}), no plugin {:.2} ms ({:.2})",
        p50(&tp.total), p50(&tp.first), p50(&tn.total), p50(&tn.first)
    );
    println!(
        "BENCH gateway_added_ms_p50_prompt_12k {:.3} ms",
        p50(&tp.added)
    );
    let t = interleaved(&[&px, &glr, &none], 100_000, 5, 60)?;
    let (tp, tg, tn) = (&t[0], &t[1], &t[2]);
    eprintln!(
        "latency 100k ({body100} B): prefix_cache p50 {:.2} ms (first bytes {:.2}), global_least_request {:.2} ms ({:.2}), no plugin {:.2} ms ({:.2})",
        p50(&tp.total), p50(&tp.first), p50(&tg.total), p50(&tg.first), p50(&tn.total), p50(&tn.first)
    );
    println!(
        "BENCH gateway_added_ms_p50_prompt_100k {:.3} ms",
        p50(&tp.added)
    );
    println!(
        "BENCH gateway_added_ms_p50_prompt_100k_global_least_request {:.3} ms",
        p50(&tg.added)
    );
    anyhow::ensure!(
        px.stat("ai_lb.prefix.hit") > 0,
        "prefix_cache did not route"
    );
    if std::env::var_os("AILB_PROF").is_some() {
        crate::cluster::prof_breakdown(&px, "prefix_cache 12k+100k");
    }
    Ok(())
}
