//! Failure memory in real Envoy 1.40, per proxy (docs/plain-envoy.md "Failure memory"): one of
//! four fake pods answers every generation with 500 at once; global_least_request in the
//! plain-Envoy build ejects it after `ejectAfterFailures` failures, proxy-wide (both workers
//! share the counts record), and it draws almost nothing after; with every pod failing the
//! picks fail open, counted; a pod that heals is taken back after its ejection by a trial,
//! and a trial that fails ejects it again. Nothing leaks: every test ends by filling the
//! route's pool cap with slow requests at once, which all pass only if every count (the
//! failed requests' held ones included) came back to zero.

use ailb_e2e::bed::chat_body;
use ailb_e2e::bed::{chat, chats, failing_bed, Bed};
use ailb_e2e::envoy::{envoy_config, envoy_wasm, Envoy};
use ailb_e2e::gateway::http;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

const BAD: &str = "pod-0";
/// `maxPoolRequests` of every route here: far above what the tests' 8 clients hold.
const POOL: usize = 32;

/// Envoy with global_least_request over the bed's pods, `lb` added to its `lb_config`.
fn envoy(bed: &Bed, lb: Value) -> Envoy {
    let pods = bed.pod_addrs();
    let mut cfg = json!({"endpoints": pods, "maxPoolRequests": POOL});
    if let (Value::Object(a), Value::Object(b)) = (&mut cfg, lb) {
        a.extend(b);
    }
    Envoy::start(
        &pods,
        &json!({"lb_policy": "global_least_request", "lb_config": cfg}),
    )
}

/// `n` requests from 8 clients: (pod, status) of each.
fn send(url: &str, n: usize) -> Vec<(String, u16)> {
    chats(&[url.to_string()], n)
}

fn to_bad(sent: &[(String, u16)]) -> usize {
    sent.iter().filter(|(pod, _)| pod == BAD).count()
}

/// Every pod healed, then [`POOL`] requests of ~1 s at once: each is admitted (no 429) only if
/// the proxy's counts are all back to zero, once the failed requests' held counts
/// (`failurePenaltyMs`, 1 s by default) expired.
fn assert_nothing_held(bed: &Bed, envoy: &Envoy) {
    for pod in &bed.pods {
        pod.engine().set_error_rate(0.0);
    }
    std::thread::sleep(Duration::from_millis(1_200));
    let full = envoy.stat("ai_lb.pool.full");
    let threads: Vec<_> = (0..POOL)
        .map(|_| {
            let url = envoy.url.clone();
            std::thread::spawn(move || chat(&url, "slow", 100).0)
        })
        .collect();
    let statuses: Vec<u16> = threads
        .into_iter()
        .map(|t| t.join().expect("client thread"))
        .collect();
    assert!(
        statuses.iter().all(|&s| s == 200),
        "a count was left over: {statuses:?}"
    );
    assert_eq!(envoy.stat("ai_lb.pool.full"), full);
}

#[test]
fn envoy_a_pod_that_fails_fast_is_ejected_and_draws_almost_nothing() {
    let bed = failing_bed(&[BAD]);
    let envoy = envoy(&bed, json!({"ejectAfterFailures": 3}));
    let sent = send(&envoy.url, 400);
    let per_pod: BTreeMap<&str, usize> = sent.iter().fold(BTreeMap::new(), |mut m, (p, _)| {
        *m.entry(p.as_str()).or_default() += 1;
        m
    });
    eprintln!("per pod: {per_pod:?}");
    let failed = to_bad(&sent);
    // ejectAfterFailures (3), plus the requests already on their way when it was ejected.
    assert!(failed <= 3 + 8, "{failed} requests reached the failing pod");
    assert!((failed as f64 / sent.len() as f64) < 0.05);
    assert!(sent
        .iter()
        .all(|(pod, s)| *s == 200 || (pod == BAD && *s == 500)));
    let [ejected, failures, fail_open, refused] = envoy.stats([
        "ai_lb.eject.ejected",
        "ai_lb.eject.failures",
        "ai_lb.eject.fail_open",
        "ai_lb.eject.refused",
    ]);
    assert_eq!(ejected, 1, "ejected once, for both workers");
    assert!(failures >= 3, "{failures}");
    assert_eq!((fail_open, refused), (0, 0));
    assert_nothing_held(&bed, &envoy);
}

#[test]
fn envoy_with_every_pod_failing_the_picks_fail_open_and_say_so() {
    let bed = failing_bed(&["pod-0", "pod-1", "pod-2", "pod-3"]);
    let lb = json!({"ejectAfterFailures": 2, "maxEjectedPercent": 100, "failurePenaltyMs": 0});
    let envoy = envoy(&bed, lb);
    let sent = send(&envoy.url, 160);
    assert!(
        sent.iter().all(|(pod, s)| *s == 500 && !pod.is_empty()),
        "served, as failures"
    );
    let used: std::collections::BTreeSet<&str> = sent.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(used.len(), 4, "no pod is left out for good: {used:?}");
    assert_eq!(
        envoy.stat("ai_lb.eject.ejected"),
        4,
        "each once: late failures change nothing"
    );
    assert!(envoy.stat("ai_lb.eject.fail_open") > 0);
    assert_nothing_held(&bed, &envoy);
}

#[test]
fn envoy_a_healed_pod_is_taken_back_after_its_ejection_and_a_failed_trial_ejects_it_again() {
    let bed = failing_bed(&[BAD]);
    // Every ejection 500 ms (the cap is the first one), so the phases below need no exact
    // timing: each waits out whatever ejection the one before left.
    let lb = json!({"ejectAfterFailures": 2, "ejectionMs": 500, "maxEjectionMs": 500});
    let envoy = envoy(&bed, lb);
    send(&envoy.url, 80);
    let first = envoy.stat("ai_lb.eject.ejected");
    assert!(first >= 1);
    // Still failing when its ejection ends: its one trial request fails and ejects it again.
    std::thread::sleep(Duration::from_millis(700));
    let trial = send(&envoy.url, 80);
    assert!(to_bad(&trial) <= 2, "{} reached it", to_bad(&trial));
    assert!(envoy.stat("ai_lb.eject.ejected") > first);
    // Healed: after its ejection a trial answers, and it takes its share again.
    bed.pods[0].engine().set_error_rate(0.0);
    std::thread::sleep(Duration::from_millis(700));
    let back = send(&envoy.url, 200);
    assert!(back.iter().all(|(_, s)| *s == 200), "{back:?}");
    assert!(
        to_bad(&back) >= 20,
        "{} of 200 to the healed pod",
        to_bad(&back)
    );
    assert_nothing_held(&bed, &envoy);
}

/// Ordered fallback (docs/plain-envoy.md "Failure memory"): with a route that retries 5xx, a
/// request whose chosen pod fails is answered by the policy's next choice (the second address
/// of the destination header Envoy's override_host reads), never by a random pod; the client
/// sees no error; each such request is counted once, its count moved to the pod that answered;
/// nothing is left held. The failing pod is ejected at its first failed try and comes back on
/// trial every 100 ms, so several requests meet it.
#[test]
fn envoy_a_retried_request_goes_to_the_policys_next_choice_and_its_count_follows() {
    let bed = failing_bed(&[BAD]);
    let pods = bed.pod_addrs();
    let lb = json!({"endpoints": pods, "maxPoolRequests": POOL, "ejectionMs": 100,
        "maxEjectionMs": 100});
    let plugin = json!({"lb_policy": "global_least_request", "lb_config": lb});
    let envoy = Envoy::start_with(|port, admin| {
        let mut c = envoy_config(port, admin, &pods, &plugin, &envoy_wasm());
        let route = &mut c["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
        route["retry_policy"] = json!({"retry_on": "5xx,connect-failure,reset", "num_retries": 1});
        c
    });
    let name_of = |addr: &str| {
        pods.iter()
            .position(|p| p == addr)
            .map(|i| format!("pod-{i}"))
            .unwrap_or_default()
    };
    let bad_addr = &pods[0];
    let mut retried = 0;
    for i in 0..60 {
        let (status, headers, _) = http(
            &envoy.url,
            "POST",
            "/v1/chat/completions",
            &[("content-type", "application/json")],
            &chat_body(&format!("q{i}"), 2),
        )
        .unwrap();
        assert_eq!(status, 200, "the retry answered");
        let get = |k: &str| {
            headers
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let listed: Vec<String> = get("x-fake-listed").split(',').map(String::from).collect();
        if listed.first() == Some(bad_addr) {
            retried += 1;
            assert_eq!(
                get("x-pod"),
                name_of(&listed[1]),
                "the next choice: {listed:?}"
            );
        } else {
            assert_eq!(get("x-pod"), name_of(&listed[0]));
        }
        std::thread::sleep(Duration::from_millis(40));
    }
    assert!(retried >= 2, "the failing pod was tried {retried} times");
    assert_eq!(envoy.stat("ai_lb.glr.pod_down"), retried);
    assert_eq!(envoy.stat("ai_lb.eject.failures"), retried);
    assert_nothing_held(&bed, &envoy);
}
