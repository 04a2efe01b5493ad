//! endpoint_metrics sessions end to end in the Higress emulator: two gateways × two workers in
//! front of fake vLLM pods whose `/metrics` pages the test writes, read through the gateways'
//! health checks (`store_metrics`). A session's turns stay on one pod whichever gateway takes
//! them (consistent hashing over the healthy pods, nothing shared between the gateways), leave
//! it while its page says saturated (`session_rebound`, counted), come back when it recovers,
//! and move when the pod dies (`session_rebound` while it is listed unhealthy or recently gone). With Redis configured the binding lives there: a moved
//! session stays on its new pod, and Redis down is the scheduler's pick, counted.

use ailb_e2e::bed::{chat_body, Bed};
use ailb_e2e::gateway::{http, Gateway, GatewaySpec};
use ailb_e2e::metrics::{metrics_check_path, wait_pages_stored};
use ailb_fakepod::MetricsSource;
use ailb_testkit::wait_until;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

const DEBUG: &str = "x-ai-lb-debug";
/// The two gateways of each test.
const GATEWAYS: [&str; 2] = ["gw-a", "gw-b"];

/// Until both gateways' health checks have stored every pod's page as it is now.
fn pages_stored(bed: &Bed) {
    assert!(
        wait_pages_stored(&bed.pods, &GATEWAYS),
        "the health checks did not store the pods' pages"
    );
}

/// A vLLM metrics page with this queue and KV-cache use.
fn vllm_page(waiting: u32, kv: f64) -> String {
    format!(
        "# TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"m\"}} 1\n\
         # TYPE vllm:gpu_cache_usage_perc gauge\n\
         vllm:gpu_cache_usage_perc{{model_name=\"m\"}} {kv}\n"
    )
}

fn gateway_spec(bed: &Bed, id: &str) -> GatewaySpec {
    let lb = json!({"sessionHeader": "x-session-id", "debugHeader": DEBUG});
    spec_with(bed, id, lb)
}

fn spec_with(bed: &Bed, id: &str, lb: serde_json::Value) -> GatewaySpec {
    let mut spec = bed.spec(
        id,
        Some(json!({"lb_policy": "endpoint_metrics", "lb_config": lb})),
    );
    // A dead pod refuses the probe at once; the long timeout only keeps a probe slowed by a
    // loaded CI machine from marking a live pod unhealthy (two in a row did, once).
    spec.health_check = Some(
        json!({"path": metrics_check_path(id), "interval_ms": 100, "timeout_ms": 2000,
        "unhealthy_threshold": 2, "healthy_threshold": 1, "store_metrics": true}),
    );
    spec
}

/// One turn of `session` through `gw`: (pod name, debug reason).
fn turn(gw: &Gateway, session: &str, text: &str) -> (String, String) {
    let (status, headers, _) = http(
        &gw.url,
        "POST",
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("x-session-id", session),
        ],
        &chat_body(text, 2),
    )
    .unwrap();
    assert_eq!(status, 200, "{}", gw.logs());
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let reason = get(DEBUG)
        .split("reason=")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (get("x-pod"), reason)
}

/// [`turn`] that may fail (a pod just died): its pod when answered 200.
fn try_turn(gw: &Gateway, session: &str, text: &str) -> Option<String> {
    let headers = [
        ("content-type", "application/json"),
        ("x-session-id", session),
    ];
    let (status, hs, _) = http(
        &gw.url,
        "POST",
        "/v1/chat/completions",
        &headers,
        &chat_body(text, 2),
    )
    .ok()?;
    (status == 200).then(|| {
        hs.iter()
            .find(|(k, _)| k == "x-pod")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    })
}

fn sum(gws: [&Gateway; 2], stat: &str) -> i64 {
    gws.iter().map(|g| g.stat(stat)).sum()
}

/// Each session's turn through both gateways (a, then b): (pod, reason) of each, which must
/// agree.
fn both(a: &Gateway, b: &Gateway, sid: &str, text: &str) -> (String, String) {
    let one = turn(a, sid, &format!("{text} via a"));
    let two = turn(b, sid, &format!("{text} via b"));
    assert_eq!(
        one,
        two,
        "the gateways disagree on {sid:.12} ({text})\n--- gw-a:\n{}\n--- gw-b:\n{}",
        a.logs(),
        b.logs()
    );
    one
}

#[test]
fn metrics_sessions_stay_put_across_gateways_leave_a_saturated_pod_and_a_dead_one() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("ailb-session-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = |name: &str| dir.join(format!("{name}.prom"));
    for i in 0..3 {
        std::fs::write(page(&format!("pod-{i}")), vllm_page(0, 0.1)).unwrap();
    }
    let mut bed = Bed::new(3, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 1_000;
        c.metrics = MetricsSource::File(page(&c.name));
    });
    let a = bed.gateway(&gateway_spec(&bed, "gw-a"));
    let b = bed.gateway(&gateway_spec(&bed, "gw-b"));
    // Both gateways have stored every pod's page.
    pages_stored(&bed);
    // Ids of every shape: short, 10 KB, unicode.
    let mut sessions: Vec<String> = (0..14).map(|i| format!("conv-{i}")).collect();
    sessions.push("x".repeat(10 * 1024));
    sessions.push("\u{4f1a}\u{8bdd}-\u{00e9}".into());
    let mut home = BTreeMap::new();
    for sid in &sessions {
        let first = both(&a, &b, sid, "t0");
        assert_eq!(first.1, "session", "{sid:.12}");
        for t in 1..3 {
            assert_eq!(
                both(&a, &b, sid, &format!("t{t}")),
                first,
                "{sid:.12} turn {t}"
            );
        }
        home.insert(sid.clone(), first.0);
    }
    let used: BTreeSet<&String> = home.values().collect();
    assert!(used.len() >= 2, "sessions spread over the pods: {used:?}");
    let n = sessions.len() as i64;
    assert_eq!(sum([&a, &b], "ai_lb.session.hit"), 6 * n);
    assert_eq!(sum([&a, &b], "ai_lb.session.rebound"), 0);

    // The pod holding the most sessions reports a full queue (over queueThresholdCritical 5):
    // its sessions leave it, counted, and every other one stays.
    let mut per_pod: BTreeMap<&String, usize> = BTreeMap::new();
    for p in home.values() {
        *per_pod.entry(p).or_default() += 1;
    }
    let (hot, _) = per_pod.into_iter().max_by_key(|(_, n)| *n).unwrap();
    let hot = hot.clone();
    std::fs::write(page(&hot), vllm_page(50, 0.1)).unwrap();
    pages_stored(&bed);
    let mut moved = 0;
    for sid in &sessions {
        for gw in [&a, &b] {
            let (pod, reason) = turn(gw, sid, "saturated");
            if home[sid] == hot {
                moved += 1;
                assert_ne!(pod, hot, "{sid:.12}");
                assert_eq!(reason, "session_rebound", "{sid:.12}");
            } else {
                assert_eq!(
                    (&pod, reason.as_str()),
                    (&home[sid], "session"),
                    "{sid:.12}"
                );
            }
        }
    }
    assert!(moved >= 2);
    assert_eq!(sum([&a, &b], "ai_lb.session.rebound"), moved);
    // It recovers: its sessions are back on it.
    std::fs::write(page(&hot), vllm_page(0, 0.1)).unwrap();
    pages_stored(&bed);
    for sid in &sessions {
        assert_eq!(
            both(&a, &b, sid, "recovered"),
            (home[sid].clone(), "session".into())
        );
    }

    // It dies: the health checks take it out of both gateways' healthy set, its sessions move
    // (to one pod each, the same from both gateways) and the others stay.
    let at = bed.pods.iter().position(|p| p.name == hot).unwrap();
    let pod = bed.pods.remove(at);
    // It keeps its port: a pod another test binds there would answer in its place.
    let _dead = pod.die();
    let gone = wait_until(Duration::from_secs(10), || {
        sessions.iter().filter(|s| home[*s] == hot).all(|s| {
            [&a, &b]
                .iter()
                .all(|gw| try_turn(gw, s, "probe").is_some_and(|p| p != hot))
        })
    });
    assert!(gone, "{}", a.logs());
    // Its ring points stay (the pod is still listed, unhealthy): each of its sessions goes to
    // its walk's next pod, counted as rebound on every turn.
    let before = sum([&a, &b], "ai_lb.session.rebound");
    let mut rebound = 0;
    for sid in &sessions {
        let now = both(&a, &b, sid, "after");
        assert_ne!(now.0, hot);
        if home[sid] == hot {
            assert_eq!(now.1, "session_rebound", "{sid:.12}: its pod died");
            rebound += 4;
        } else {
            assert_eq!(
                now,
                (home[sid].clone(), "session".into()),
                "an unaffected session stays"
            );
        }
        assert_eq!(
            both(&a, &b, sid, "after 2"),
            now,
            "and stays on its new pod"
        );
    }
    assert!(rebound >= 4);
    assert_eq!(sum([&a, &b], "ai_lb.session.rebound") - before, rebound);
    assert_eq!(sum([&a, &b], "ai_lb.fallback.no_metrics"), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn redis_bound_metrics_sessions_follow_their_binding_and_survive_redis_down() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("ailb-session-bound-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = |name: &str| dir.join(format!("{name}.prom"));
    for i in 0..3 {
        std::fs::write(page(&format!("pod-{i}")), vllm_page(0, 0.1)).unwrap();
    }
    let mut bed = Bed::new(3, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 1_000;
        c.metrics = MetricsSource::File(page(&c.name));
    });
    let lb = json!({"serviceFQDN": "redis.static", "servicePort": bed.redis.port,
        "timeout": 1000, "sessionHeader": "x-session-id", "sessionTTL": 60,
        "debugHeader": DEBUG});
    let a = bed.gateway(&spec_with(&bed, "gw-a", lb.clone()));
    let b = bed.gateway(&spec_with(&bed, "gw-b", lb));
    pages_stored(&bed);
    let mut sessions: Vec<String> = (0..10).map(|i| format!("conv-{i}")).collect();
    sessions.push("x".repeat(10 * 1024));
    sessions.push("\u{4f1a}\u{8bdd}-\u{00e9}".into());
    // Bound by the first turn (the scheduler's pick), kept by both gateways after.
    let mut home = BTreeMap::new();
    for sid in &sessions {
        let (first, reason) = turn(&a, sid, "t0");
        assert_eq!(
            reason, "metrics",
            "a new session is placed by the scheduler"
        );
        for t in 1..4 {
            let gw = if t % 2 == 1 { &b } else { &a };
            let got = turn(gw, sid, &format!("t{t}"));
            assert_eq!(got, (first.clone(), "session".into()), "{sid:.12} turn {t}");
        }
        home.insert(sid.clone(), first);
    }
    let n = sessions.len() as i64;
    assert_eq!(sum([&a, &b], "ai_lb.session.bound"), n);
    assert_eq!(sum([&a, &b], "ai_lb.session.hit"), 3 * n);
    // The busiest pod saturates: its sessions are rebound (counted) and their new binding
    // holds on both gateways, even once the pod recovers.
    let mut per_pod: BTreeMap<&String, usize> = BTreeMap::new();
    for p in home.values() {
        *per_pod.entry(p).or_default() += 1;
    }
    let (hot, _) = per_pod.into_iter().max_by_key(|(_, n)| *n).unwrap();
    let hot = hot.clone();
    std::fs::write(page(&hot), vllm_page(50, 0.1)).unwrap();
    pages_stored(&bed);
    let mut moved = BTreeMap::new();
    for sid in &sessions {
        let (pod, reason) = turn(&a, sid, "saturated");
        if home[sid] == hot {
            assert_ne!(pod, hot, "{sid:.12}");
            assert_eq!(reason, "session_rebound", "{sid:.12}");
            moved.insert(sid.clone(), pod.clone());
        } else {
            assert_eq!(
                (&pod, reason.as_str()),
                (&home[sid], "session"),
                "{sid:.12}"
            );
        }
        let now = moved.get(sid).unwrap_or(&home[sid]).clone();
        assert_eq!(turn(&b, sid, "saturated b"), (now, "session".into()));
    }
    assert!(!moved.is_empty());
    assert_eq!(sum([&a, &b], "ai_lb.session.rebound"), moved.len() as i64);
    std::fs::write(page(&hot), vllm_page(0, 0.1)).unwrap();
    pages_stored(&bed);
    for (sid, pod) in &moved {
        assert_eq!(turn(&b, sid, "recovered"), (pod.clone(), "session".into()));
    }
    // Redis down: every turn is still served, by the scheduler's pick, counted.
    bed.redis.stop();
    for sid in sessions.iter().take(4) {
        let (pod, reason) = turn(&a, sid, "redis down");
        assert!(!pod.is_empty());
        assert_eq!(reason, "metrics");
    }
    assert_eq!(a.stat("ai_lb.session.fallback"), 4);
    bed.redis.restart();
    let back = wait_until(Duration::from_secs(10), || {
        turn(&a, &sessions[0], "back").1 == "session"
    });
    assert!(back, "the binding is used again once Redis is back");
    let _ = std::fs::remove_dir_all(&dir);
}
