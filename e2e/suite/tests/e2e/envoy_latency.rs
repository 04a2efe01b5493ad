//! Latency-aware placement in real Envoy 1.40, plain-Envoy build (docs/latency-model.md §5,
//! docs/plain-envoy.md "Latency-aware placement"): one Envoy with two workers in front of fake
//! pods with one FIFO prefill lane each at two speeds. From the streamed answers alone the
//! workers learn each pod's rate (merged across them in shared data) and send new prompts
//! where they will be prefilled soonest; a sheddable request whose objective no pod can meet
//! is shed, a critical one never; bad objective headers are counted; nothing is left held.

use ailb_e2e::bed::Bed;
use ailb_e2e::envoy::Envoy;
use ailb_e2e::two_speeds::{bed, burst, prompt, send, DEBUG};
use serde_json::{json, Value};
use std::time::Duration;

/// `maxPoolRequests`: far above the tests' bursts; filled at the end, it admits every request
/// only if every count came back.
const POOL: usize = 12;

/// Envoy with prefix_cache and `latencyModel` = `latency` over the bed's pods, `extra` added to
/// its `lb_config`.
fn envoy(bed: &Bed, latency: Value, extra: Value) -> Envoy {
    let pods = bed.pod_addrs();
    let mut lb = json!({"endpoints": pods, "debugHeader": DEBUG, "latencyModel": latency,
        "maxPoolRequests": POOL});
    if let (Some(lb), Some(extra)) = (lb.as_object_mut(), extra.as_object()) {
        lb.extend(extra.clone());
    }
    Envoy::start(
        &pods,
        &json!({"lb_policy": "prefix_cache", "lb_config": lb}),
    )
}

/// [`POOL`] requests of about a second at once: each is admitted only if the proxy's counts
/// (and bookings) all came back.
fn assert_nothing_held(envoy: &Envoy) {
    let bodies = (0..POOL).map(|n| prompt(9_000 + n, 200, 3_000)).collect();
    let placed = burst(&[&envoy.url], bodies, POOL);
    assert_eq!(placed.len(), POOL);
    assert_eq!(envoy.stat("ai_lb.pool.full"), 0);
}

#[test]
fn envoy_each_pods_rate_is_learnt_across_workers_and_new_prompts_go_to_the_fast_one() {
    let bed = bed();
    // Tens of ms per TTFT, where the machine's scheduling is a large share: the error bound
    // is loosened so that the models place throughout (its own test is the emulator's).
    let envoy = envoy(
        &bed,
        json!({"mergeIntervalMs": 200, "maxMAPE": 3}),
        json!({}),
    );
    // Learning: 90 new prompts of 500-2,000 tokens, three at a time.
    let bodies = (0..90)
        .map(|n| prompt(n, 500 + (n * 337) % 1_500, 8))
        .collect();
    burst(&[&envoy.url], bodies, 3);
    // A few more after two merge intervals, so both workers have merged what they learnt.
    std::thread::sleep(Duration::from_millis(500));
    burst(
        &[&envoy.url],
        (100..106).map(|n| prompt(n, 1_000, 8)).collect(),
        2,
    );
    std::thread::sleep(Duration::from_millis(500));
    let [samples, bad, merges, fallback, failures] = envoy.stats([
        "ai_lb.latency.samples",
        "ai_lb.latency.bad_samples",
        "ai_lb.latency.merges",
        "ai_lb.latency.fallback",
        "ai_lb.latency.merge_failures",
    ]);
    assert!(
        samples >= 90,
        "{samples} answers learnt ({fallback} placed by the gate): {}",
        envoy.logs()
    );
    assert_eq!((bad, failures), (0, 0));
    assert!(merges >= 4, "{merges} merges");
    // Placing: bursts of six 2,000-token prompts. By request count each pod would get a third;
    // by predicted TTFT the fast pod takes most (it clears 2,000 tokens in 125 ms, a slow one
    // in 500 ms).
    let fast = bed.pod_addrs()[0].clone();
    let bodies = (200..236).map(|n| prompt(n, 2_000, 8)).collect();
    let placed = burst(&[&envoy.url], bodies, 6);
    let on_fast = placed.iter().filter(|f| f["endpoint"] == fast).count();
    assert!(
        on_fast * 2 > placed.len(),
        "{on_fast} of {} on the fast pod: {placed:?}",
        placed.len()
    );
    for f in &placed {
        let ttft = f["predicted_ttft_ms"].parse::<f64>().unwrap() as u64;
        assert!(ttft < 5_000, "{f:?}");
        assert!(f.contains_key("predicted_tpot_ms"), "{f:?}");
    }
    assert_nothing_held(&envoy);
}

#[test]
fn envoy_a_sheddable_request_is_shed_for_a_predicted_miss_and_a_critical_one_never() {
    let bed = bed();
    let envoy = envoy(
        &bed,
        json!({"mergeIntervalMs": 200}),
        json!({"priorityHeader": "x-priority", "maxRequestCount": 1000}),
    );
    // No pod prefills 2,000 tokens within 1 ms: the miss is over 50 times the objective, so a
    // sheddable request is shed with probability over 0.98.
    let slo = ("x-slo-ttft-ms", "1");
    let mut shed = 0;
    for n in 0..20 {
        let (status, f) = send(
            &envoy.url,
            &prompt(n, 2_000, 8),
            &[slo, ("x-priority", "sheddable")],
        );
        if status == 429 {
            // The plugin's own answer, its reason in the debug header.
            assert_eq!(f.get("reason").map(String::as_str), Some("shed_latency"));
            shed += 1;
        } else {
            assert_eq!(status, 200);
        }
    }
    assert!(shed >= 16, "{shed} of 20 shed");
    assert_eq!(envoy.stat("ai_lb.latency.shed"), shed);
    for n in 20..30 {
        let body = prompt(n, 2_000, 8);
        let (status, _) = send(&envoy.url, &body, &[slo, ("x-priority", "critical")]);
        assert_eq!(status, 200, "a critical request is never shed");
        let (status, _) = send(&envoy.url, &prompt(n + 100, 2_000, 8), &[slo]);
        assert_eq!(
            status, 200,
            "nor one without a class (the default is standard)"
        );
    }
    // Objective headers that are not objectives: the route's (none) is used, counted.
    for bad in ["abc", "-5", "NaN", "1e400", "99999999999"] {
        let (status, f) = send(
            &envoy.url,
            &prompt(300, 500, 8),
            &[("x-slo-ttft-ms", bad), ("x-priority", "sheddable")],
        );
        assert_eq!(status, 200, "{bad}: {f:?}");
    }
    assert_eq!(envoy.stat("ai_lb.latency.bad_objective"), 5);
    assert_nothing_held(&envoy);
}
