//! Session stickiness end to end: two emulator gateways × two workers in front of fake pods,
//! sharing one real redis-server. A session's turns stay on one pod whichever gateway and
//! worker takes them, move when that pod dies, and leave no count behind.

use ailb_e2e::bed::{chat_body, wait_for_zero, Bed};
use ailb_e2e::gateway::{glr_config, http, Gateway};
use ailb_testkit::wait_until;
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

const DEBUG: &str = "x-ai-lb-debug";

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
        &chat_body(text, 3),
    )
    .unwrap();
    assert_eq!(status, 200);
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

/// Every session's turns, concurrently (one thread per session), alternating gateways.
fn converse(
    a: &Gateway,
    b: &Gateway,
    sessions: &[String],
    turns: usize,
    tag: &str,
) -> Vec<Vec<(String, String)>> {
    std::thread::scope(|s| {
        let threads: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(i, sid)| {
                s.spawn(move || {
                    (0..turns)
                        .map(|t| {
                            let gw = if (i + t) % 2 == 0 { a } else { b };
                            turn(gw, sid, &format!("{tag} {sid} turn {t}"))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

fn sum(gws: [&Gateway; 2], stat: &str) -> i64 {
    gws.iter().map(|g| g.stat(stat)).sum()
}

#[test]
fn sessions_stay_put_across_gateways_and_move_when_their_pod_dies() {
    let bed = Bed::new(3, |c| {
        c.decode_us_per_token = 2_000;
        c.prefill_us_per_token = 1;
    });
    let cfg = glr_config(
        bed.redis.port,
        json!({"sessionHeader": "x-session-id", "debugHeader": DEBUG, "sessionTTL": 60}),
    );
    let a = bed.gateway(&bed.spec("gw-a", Some(cfg.clone())));
    let b = bed.gateway(&bed.spec("gw-b", Some(cfg)));
    // Ids of every shape: short, 10 KB, unicode.
    let mut sessions: Vec<String> = (0..10).map(|i| format!("conv-{i}")).collect();
    sessions.push("x".repeat(10 * 1024));
    sessions.push("\u{4f1a}\u{8bdd}-\u{00e9}".into());
    let turns = 6;
    let runs = converse(&a, &b, &sessions, turns, "first");
    let mut home = HashMap::new();
    for (sid, run) in sessions.iter().zip(&runs) {
        let first = &run[0].0;
        assert_eq!(
            run[0].1, "least_request",
            "a new session is placed by the policy"
        );
        for (t, (pod, reason)) in run.iter().enumerate().skip(1) {
            assert_eq!(pod, first, "session {:.12} turn {t} left its pod", sid);
            assert_eq!(reason, "session");
        }
        home.insert(sid.clone(), first.clone());
    }
    let used: std::collections::HashSet<_> = home.values().collect();
    assert!(used.len() >= 2, "sessions spread over the pods: {used:?}");
    let n = sessions.len() as i64;
    assert_eq!(sum([&a, &b], "ai_lb.session.bound"), n);
    assert_eq!(sum([&a, &b], "ai_lb.session.hit"), n * (turns as i64 - 1));
    assert_eq!(sum([&a, &b], "ai_lb.session.rebound"), 0);

    // The pod holding the most sessions dies (unhealthy on both gateways).
    let mut per_pod: HashMap<&String, usize> = HashMap::new();
    for p in home.values() {
        *per_pod.entry(p).or_default() += 1;
    }
    let (dead, _) = per_pod.into_iter().max_by_key(|(_, n)| *n).unwrap();
    let dead = dead.clone();
    bed.mark_unhealthy(&dead, &[&a, &b]);
    let runs = converse(&a, &b, &sessions, 3, "after");
    let mut moved = 0;
    for (sid, run) in sessions.iter().zip(&runs) {
        let was = &home[sid];
        let now = &run[0].0;
        assert_ne!(now, &dead, "no session is sent to the dead pod");
        if *was == dead {
            moved += 1;
            assert_eq!(run[0].1, "session_rebound");
        } else {
            assert_eq!(
                (now, run[0].1.as_str()),
                (was, "session"),
                "an unaffected session stays"
            );
        }
        for (pod, reason) in &run[1..] {
            assert_eq!(
                (pod, reason.as_str()),
                (now, "session"),
                "and stays on its new pod"
            );
        }
    }
    assert!(moved >= 1);
    assert_eq!(sum([&a, &b], "ai_lb.session.rebound"), moved);
    assert_eq!(sum([&a, &b], "ai_lb.session.fallback"), 0);
    let left = wait_for_zero(&bed, Duration::from_secs(10));
    assert!(left.is_zero() && !left.any_negative(), "leaked: {left:?}");
}

#[test]
fn sessions_degrade_to_the_cluster_when_redis_is_down() {
    let mut bed = Bed::new(2, |c| c.decode_us_per_token = 100);
    let cfg = glr_config(
        bed.redis.port,
        json!({"sessionHeader": "x-session-id", "debugHeader": DEBUG}),
    );
    let a = bed.gateway(&bed.spec("gw-a", Some(cfg)));
    assert_eq!(turn(&a, "s", "warm").1, "least_request");
    bed.redis.stop();
    for i in 0..5 {
        let (pod, reason) = turn(&a, "s", &format!("down {i}"));
        assert!(!pod.is_empty(), "served by the cluster's own balancing");
        assert!(reason.starts_with("redis_"), "{reason}");
    }
    assert_eq!(a.stat("ai_lb.session.fallback"), 5);
    bed.redis.restart();
    // Once Redis answers again (the first calls may still fail while it restarts), the session
    // has a pod again and keeps it.
    let mut pod = String::new();
    let back = wait_until(Duration::from_secs(10), || {
        let (p, reason) = turn(&a, "s", "back");
        pod = p;
        reason == "session"
    });
    assert!(back, "stickiness resumes once Redis is back");
    for i in 0..5 {
        assert_eq!(
            turn(&a, "s", &format!("up {i}")),
            (pod.clone(), "session".into())
        );
    }
    assert!(wait_for_zero(&bed, Duration::from_secs(10)).is_zero());
}

/// The plain-Envoy artifact in two real Envoy proxies sharing nothing: a session's turns reach
/// the same pod through either (consistent hashing on the session id).
#[test]
fn envoy_replicas_agree_on_a_sessions_pod_without_talking() {
    let bed = Bed::new(3, |c| c.decode_us_per_token = 100);
    let pods = bed.pod_addrs();
    let plugin = json!({"lb_policy": "global_least_request",
        "lb_config": {"endpoints": pods, "sessionHeader": "x-session-id"}});
    let one = ailb_e2e::envoy::Envoy::start(&pods, &plugin);
    let two = ailb_e2e::envoy::Envoy::start(&pods, &plugin);
    let send = |url: &str, sid: &str, t: usize| {
        let (status, headers, _) = http(
            url,
            "POST",
            "/v1/chat/completions",
            &[("content-type", "application/json"), ("x-session-id", sid)],
            &chat_body(&format!("{sid} turn {t}"), 2),
        )
        .unwrap();
        assert_eq!(status, 200);
        headers
            .iter()
            .find(|(k, _)| k == "x-pod")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let mut homes = std::collections::HashSet::new();
    for s in 0..12 {
        let sid = format!("conv-{s}");
        let home = send(&one.url, &sid, 0);
        for t in 1..4 {
            let url = if t % 2 == 0 { &one.url } else { &two.url };
            assert_eq!(send(url, &sid, t), home, "{sid} turn {t}");
        }
        homes.insert(home);
    }
    assert!(homes.len() >= 2, "sessions spread: {homes:?}");
    let hits = one.stat("ai_lb.session.hit") + two.stat("ai_lb.session.hit");
    assert_eq!(hits, 48, "{}", one.logs());
}
