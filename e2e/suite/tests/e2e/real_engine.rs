//! The plugin against real engines (issue 51): three llama.cpp `llama-server`s
//! (ailb_e2e::llama) behind the emulator (Higress build, Redis). Output text is random: every
//! assertion reads usage (`cached_tokens`) and metrics (the engines' `requests_processing` and
//! `requests_deferred`, the plugin's Redis counts and counters). The tests hold
//! [`exclusive`]: the engines decode on the CPU, and the bounds below hold for one test's
//! engines on 2 cores.

mod faults;
mod verify;

use ailb_e2e::conversations::{replay, Conversations};
use ailb_e2e::gateway::{glr_config, Gateway, GatewaySpec, CLUSTER, ROUTE};
use ailb_e2e::llama::{self, exclusive, fleet, EngineConfig};
use ailb_e2e::real::{abort_cancels, compare_seed, judge_cached_shares, loads, tally, LONG};
use ailb_e2e::redis::{counts, Counts};
use ailb_e2e::streams::{hold, Held};
use ailb_testkit::{wait_until, Options, RedisServer};
use serde_json::json;
use std::time::{Duration, Instant};

const DEBUG: &str = "x-ai-lb-debug";

/// The plugin's in-flight count on each engine (Redis), in `addrs`' order.
fn counted(c: &Counts, addrs: &[String]) -> Vec<f64> {
    addrs
        .iter()
        .map(|a| c.load.get(a).copied().unwrap_or(0.0))
        .collect()
}

/// Polls Redis until every count is zero (at most `timeout`); the last counts read.
fn settle(redis: u16, timeout: Duration) -> Counts {
    let mut last = counts(redis, ROUTE, CLUSTER);
    wait_until(timeout, || {
        last = counts(redis, ROUTE, CLUSTER);
        last.is_zero()
    });
    last
}

/// The same conversations (3 seeds) through round robin and through prefix_cache: every later
/// turn stays on its conversation's engine, and the engines' own `cached_tokens` say how much
/// of the later turns' prompts they did not prefill again (ailb_e2e::real::judge_cached_shares
/// for the bounds); nothing is left counted.
#[test]
fn prefix_cache_keeps_conversations_on_their_engine() {
    let _one = exclusive();
    let engines = fleet(3, &EngineConfig::default()).unwrap();
    let addrs = llama::addrs(&engines);
    let redis = RedisServer::start_with(Options::default());
    let px = json!({"lb_policy": "prefix_cache", "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": redis.port, "timeout": 1000,
        "debugHeader": DEBUG}});
    let mut shares = Vec::new();
    for seed in 1..=3 {
        let cfg = Conversations {
            seed,
            debug_header: DEBUG.into(),
            ..Conversations::default()
        };
        let gw = Gateway::start(&GatewaySpec::new("rr", redis.port, &addrs, None)).unwrap();
        let rr = replay(&gw.url, &cfg, &[]);
        drop(gw);
        let gw = Gateway::start(&GatewaySpec::new(
            &format!("px{seed}"),
            redis.port,
            &addrs,
            Some(px.clone()),
        ))
        .unwrap();
        let p = replay(&gw.url, &cfg, &[]);
        shares.push(compare_seed(&format!("seed {seed}"), &rr, &p));
        // Before the gateway is killed: a release still on its way would be lost with it.
        let left = settle(redis.port, Duration::from_secs(5));
        assert!(left.is_zero(), "{left:?}");
    }
    judge_cached_shares(&shares);
}

/// Held streams one after another: each goes to the engine with the fewest, so 6 make 2 on
/// each; the engines' own running + waiting requests, the plugin's Redis counts and its debug
/// header agree at every step. Engine-0's two closed, it is the least loaded for the next two,
/// in its own metrics too; everything is back to 0 once the clients go.
#[test]
fn global_least_request_follows_the_engines_real_requests() {
    let _one = exclusive();
    let engines = fleet(3, &EngineConfig::default()).unwrap();
    let addrs = llama::addrs(&engines);
    let redis = RedisServer::start_with(Options::default());
    let cfg = glr_config(redis.port, json!({"debugHeader": DEBUG}));
    let gw = Gateway::start(&GatewaySpec::new("glr", redis.port, &addrs, Some(cfg))).unwrap();
    let mut held: Vec<Held> = (0..6)
        .map(|i| hold(&gw.url, DEBUG, &format!("s{i}"), LONG).unwrap())
        .collect();
    // Three ways to see the same 6 requests.
    let look = |held: &[Held]| {
        let chosen: Vec<&str> = held.iter().map(|h| h.endpoint.as_str()).collect();
        (
            tally(&engines, &chosen),
            loads(&engines),
            counted(&counts(redis.port, ROUTE, CLUSTER), &addrs),
        )
    };
    let even = vec![2.0; 3];
    let mut seen = look(&held);
    // An engine's metrics page is read at once; a request's slot is taken before its first
    // event, so no wait should be needed: allow a little anyway.
    wait_until(Duration::from_secs(2), || {
        seen = look(&held);
        seen.1 == even
    });
    eprintln!("6 held: chosen, engines, redis {seen:?}");
    assert_eq!(seen, (even.clone(), even.clone(), even.clone()));

    held.retain(|h| h.endpoint != addrs[0]);
    let freed = Instant::now();
    assert!(wait_until(Duration::from_secs(2), || {
        seen = look(&held);
        seen.1[0] == 0.0 && seen.2[0] == 0.0
    }));
    eprintln!("engine-0's closed: {seen:?} in {:?}", freed.elapsed());
    assert_eq!(
        seen,
        (
            vec![0.0, 2.0, 2.0],
            vec![0.0, 2.0, 2.0],
            vec![0.0, 2.0, 2.0]
        )
    );
    for i in 0..2 {
        let h = hold(&gw.url, DEBUG, &format!("t{i}"), LONG).unwrap();
        assert_eq!(h.endpoint, addrs[0], "the least-loaded engine");
        held.push(h);
    }
    wait_until(Duration::from_secs(2), || {
        seen = look(&held);
        seen.1 == even
    });
    assert_eq!(seen, (even.clone(), even.clone(), even));
    drop(held);
    assert!(wait_until(Duration::from_secs(3), || loads(&engines) == vec![0.0; 3]));
    let left = settle(redis.port, Duration::from_secs(3));
    assert!(left.is_zero(), "{left:?}");
}

/// A client that leaves mid-stream: the engine's task is cancelled (its slot freed and its
/// token count stopped) within a second, where the answer would have run 10 s more, and the
/// plugin's count goes with it.
#[test]
fn a_client_abort_cancels_the_engines_task_and_leaves_no_count() {
    let _one = exclusive();
    let engines = fleet(3, &EngineConfig::default()).unwrap();
    let addrs = llama::addrs(&engines);
    let redis = RedisServer::start_with(Options::default());
    let cfg = glr_config(redis.port, json!({"debugHeader": DEBUG}));
    let gw = Gateway::start(&GatewaySpec::new("abort", redis.port, &addrs, Some(cfg))).unwrap();
    let h = hold(&gw.url, DEBUG, "abort", LONG).unwrap();
    let engine = engines.iter().find(|e| e.addr == h.endpoint).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(engine.load(), 1.0);
    assert_eq!(
        counted(
            &counts(redis.port, ROUTE, CLUSTER),
            std::slice::from_ref(&h.endpoint)
        ),
        [1.0]
    );
    abort_cancels(engine, h, "emulator");
    assert!(wait_until(Duration::from_secs(2), || gw
        .stat("gateway.client_aborts")
        == 1));
    let left = settle(redis.port, Duration::from_secs(3));
    assert!(left.is_zero(), "{left:?}");
}
