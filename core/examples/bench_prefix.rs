//! Micro-benchmark: canonicalise + chain a realistic 10-turn (~8 KB) chat body.
//!
//! `cargo run --release --example bench_prefix` prints
//! `BENCH prefix_canon_chain_us_chat10 <µs per request> us` (native figure): the best of 25
//! batches of 1,000 requests (the minimum is the figure least disturbed by other load on the
//! machine; the median is printed alongside).

use ailb_core::prefix::{canonicalize, chain_keys, prefix_key, CanonConfig};
use serde_json::json;
use std::hint::black_box;
use std::time::Instant;

fn body() -> Vec<u8> {
    let system =
        "You are a senior support engineer for a cloud storage product. Answer precisely, \
        cite the relevant documentation section when you can, never invent API names, and keep \
        answers under 200 words unless the user asks for detail. If a question is about billing, \
        point to the billing portal. If it is about data loss, ask for the bucket name and the \
        approximate time of the incident before suggesting recovery steps. Format code as fenced \
        blocks. Use metric units. Today is a normal business day; escalations go to tier 2.";
    let mut messages = vec![json!({"role": "system", "content": system})];
    for turn in 0..10 {
        messages.push(json!({
            "role": "user",
            "content": format!("Turn {turn}: my upload of a 4 GB file to bucket \"media-{turn}\" stalls at 87% \
                with error SlowDown after about ten minutes. I use the CLI v2.{turn} on Ubuntu. What should I check?"),
        }));
        messages.push(json!({
            "role": "assistant",
            "content": format!("For turn {turn}: SlowDown means the bucket prefix is receiving more requests than it \
                can absorb. 1) Enable multipart upload with a part size of 64 MB (`--multipart-chunk-size 64MB`). \
                2) Spread keys over several prefixes (e.g. hash the first characters). 3) Retry with exponential \
                backoff; the CLI does this when `max_attempts` is set in the config file. 4) Check that no \
                lifecycle rule is rewriting objects in the same prefix. See docs section 4.{turn} 'Request rates'."),
        }));
    }
    json!({"model": "qwen2.5-7b-instruct", "stream": true, "temperature": 0.3, "max_tokens": 512, "messages": messages})
        .to_string()
        .into_bytes()
}

fn main() {
    let body = body();
    let cfg = CanonConfig::default();
    let ns = "ailb:{llm-route|outbound|8000||vllm.default.svc.cluster.local}";
    let run = || {
        let Ok(c) = canonicalize(black_box(&body), &cfg) else {
            return 0;
        };
        let keys = chain_keys(&c.model, c.blocks());
        keys.len()
    };
    let blocks = run();
    let time = |iters: u32, f: &dyn Fn() -> usize| {
        let start = Instant::now();
        for _ in 0..iters {
            black_box(f());
        }
        start.elapsed().as_secs_f64() * 1e6 / f64::from(iters)
    };
    let canon_only = || canonicalize(black_box(&body), &cfg).map_or(0, |c| c.len());
    let Ok(c) = canonicalize(&body, &cfg) else {
        eprintln!("bench body did not canonicalise");
        return;
    };
    let chain_only = || chain_keys(black_box(&c.model), c.blocks()).len();
    let keys = c.chain_keys();
    let format_keys = || keys.iter().map(|k| prefix_key(ns, k).len()).sum();

    for f in [&run as &dyn Fn() -> usize, &canon_only, &chain_only] {
        time(2_000, f); // warm up
    }
    // (best, median) over 25 batches of 1,000
    let measure = |f: &dyn Fn() -> usize| {
        let mut samples: Vec<f64> = (0..25).map(|_| time(1_000, f)).collect();
        samples.sort_by(f64::total_cmp);
        let at = |i: usize| samples.get(i).copied().unwrap_or(f64::NAN);
        (at(0), at(samples.len() / 2))
    };
    let (total, total_median) = measure(&run);
    println!(
        "body {} bytes, {} blocks; best / median of 25 x 1000",
        body.len(),
        blocks
    );
    for (name, f) in [
        ("canonicalize", &canon_only as &dyn Fn() -> usize),
        ("chain_keys", &chain_only),
        ("prefix_key x all", &format_keys),
    ] {
        let (best, med) = measure(f);
        println!("  {name:<18} {best:8.2} us {med:8.2} us");
    }
    println!(
        "  {:<18} {total:8.2} us {total_median:8.2} us",
        "canon+chain"
    );
    println!("BENCH prefix_canon_chain_us_chat10 {total:.2} us");
}
