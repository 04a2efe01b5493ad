//! The emulator counts every client that goes away (`gateway.client_aborts`): mid-stream,
//! before the first byte, and while the request still waits for its pick; the plugin gives
//! every count back all the same.

use ailb_e2e::bed::{wait_for_zero, Bed};
use ailb_e2e::gateway::glr_config;
use ailb_fakepod::load::{self, AbortPhase, AbortRule, HoldSpec, LoadConfig, Workload};
use ailb_testkit::wait_until;
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
