//! The emulator counts every client that goes away (`gateway.client_aborts`): mid-stream,
//! before the first byte, and while the request still waits for its pick, exactly once each,
//! also under 200 concurrent streams; the plugin gives every count back all the same.

use ailb_e2e::bed::{wait_for_zero, Bed};
use ailb_e2e::gateway::{glr_config, open};
use ailb_fakepod::load::{self, AbortPhase, AbortRule, HoldSpec, LoadConfig, Workload};
use ailb_testkit::wait_until;
use serde_json::json;
use std::io::Read;
use std::sync::{Arc, Barrier};
use std::time::Duration;

fn aborting(
    bed: &Bed,
    url: &str,
    phase: AbortPhase,
    after_ms: u64,
    concurrency: usize,
) -> LoadConfig {
    let mut lc = LoadConfig::new(
        vec![url.to_string()],
        Workload::Hold(HoldSpec {
            concurrency,
            max_tokens: 200,
            prompt_tokens: 64,
            stream: true,
        }),
    );
    // Cold caches: every first byte waits for a whole prefill.
    lc.admin_urls = bed.pods.iter().map(|p| p.url()).collect();
    lc.reset_pods = true;
    lc.abort = Some(AbortRule {
        probability: 1.0,
        after: Duration::from_millis(after_ms),
        phase,
    });
    lc
}

#[test]
fn every_client_abort_is_counted_and_nothing_leaks() {
    // Prefill ~200 ms, then 5 ms per token: aborts land before and after the first byte.
    let bed = Bed::new(2, |c| {
        c.prefill_us_per_token = 3_000;
        c.decode_us_per_token = 5_000;
        c.max_running = 64;
    });
    let gw = bed.gateway(&bed.spec(
        "aborts",
        Some(glr_config(bed.redis.port, serde_json::json!({}))),
    ));
    let mut expected = 0;
    for (phase, after_ms, n) in [
        (AbortPhase::AfterFirstByte, 30, 20),
        (AbortPhase::BeforeFirstByte, 60, 15),
    ] {
        let summary = bed
            .rt
            .block_on(load::run(&aborting(&bed, &gw.url, phase, after_ms, n)))
            .unwrap();
        // Before the first byte: only those whose first byte came later than the abort.
        assert!(summary.aborted > n / 2, "{phase:?}: {}", summary.line());
        expected += summary.aborted as i64;
        assert!(
            wait_until(Duration::from_secs(5), || gw.stat("gateway.client_aborts")
                == expected),
            "{phase:?}: {} counted of {expected}",
            gw.stat("gateway.client_aborts")
        );
    }
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}

/// Reads `s` until `[DONE]` or `want` bytes of body past the head have come; returns all read.
fn read_some(s: &mut std::net::TcpStream, want: usize) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got);
        let body = text.split_once("\r\n\r\n").map_or(0, |(_, b)| b.len());
        if body >= want || text.contains("[DONE]") {
            return text.into_owned();
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return text.into_owned(),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn two_hundred_concurrent_streams_half_closed_mid_stream_count_exactly_one_hundred() {
    const STREAMS: usize = 200;
    const CLOSED: usize = 100;
    // About 3 s of answer each, a chunk every 10 ms per stream: every close lands while its
    // stream and the 199 others are still sending.
    let bed = Bed::new(2, |c| {
        c.prefill_us_per_token = 0;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.max_running = STREAMS;
    });
    let gw = bed.gateway(&bed.spec("aborts-200", Some(glr_config(bed.redis.port, json!({})))));
    let body = json!({
        "model": "fake-model",
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": 300,
        "stream": true
    })
    .to_string();
    let all_started = Arc::new(Barrier::new(STREAMS));
    let clients: Vec<_> = (0..STREAMS)
        .map(|i| {
            let (url, body, all_started) = (gw.url.clone(), body.clone(), all_started.clone());
            std::thread::spawn(move || {
                let headers = [("content-type", "application/json")];
                let mut s = open(
                    &url,
                    "POST",
                    "/v1/chat/completions",
                    &headers,
                    body.as_bytes(),
                )
                .expect("connect");
                // The head and the first chunks: the response is streaming.
                let first = read_some(&mut s, 64);
                assert!(first.starts_with("HTTP/1.1 200"), "stream {i}: {first}");
                all_started.wait();
                if i < CLOSED {
                    // Closed a little apart, each in the middle of its answer.
                    std::thread::sleep(Duration::from_millis(10 * (i % 20) as u64));
                    assert!(
                        !first.contains("[DONE]"),
                        "stream {i} ended before its close"
                    );
                    drop(s);
                } else {
                    // To the connection's close (`connection: close`): the whole response.
                    let mut rest = Vec::new();
                    let _ = s.read_to_end(&mut rest);
                    let rest = String::from_utf8_lossy(&rest);
                    assert!(rest.contains("[DONE]"), "stream {i} was cut: {rest}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("a client failed");
    }
    let counted = || gw.stat("gateway.client_aborts");
    assert!(
        wait_until(Duration::from_secs(10), || counted() >= CLOSED as i64),
        "{} of {CLOSED} closes counted",
        counted()
    );
    // Every stream has ended by now: none counted twice, no finished one counted.
    assert_eq!(counted(), CLOSED as i64, "closes counted of {CLOSED}");
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}
