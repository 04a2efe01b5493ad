//! The plugin against real engines in real Envoy 1.40 (plain-Envoy build, per-proxy state;
//! issue 51): the real_engine tests' cases over three llama.cpp `llama-server`s. There are no
//! Redis counts to read: what the plugin counted is seen in its choices (the debug header), in
//! the engines' own metrics, and at each test's end by [`nothing_held`], which fills the
//! route's pool cap at once. Tests hold [`exclusive`] (the engines share 2 cores).

use ailb_e2e::conversations::{replay, Conversations};
use ailb_e2e::envoy::Envoy;
use ailb_e2e::llama::{addrs, exclusive, fleet, Engine, EngineConfig};
use ailb_e2e::real::{
    abort_cancels, ask, compare_seed, judge_cached_shares, loads, short_chat, tally, until_ejected,
    LONG,
};
use ailb_e2e::real_verify::{restarted_engine_is_found_out, roomy};
use ailb_e2e::streams::{hold, Held};
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::time::Duration;

const DEBUG: &str = "x-ai-lb-debug";

fn plugin(policy: &str, engines: &[Engine], lb: Value) -> Value {
    let pods: Vec<&str> = engines.iter().map(|e| e.addr.as_str()).collect();
    let mut cfg = json!({"endpoints": pods, "debugHeader": DEBUG});
    if let (Value::Object(a), Value::Object(b)) = (&mut cfg, lb) {
        a.extend(b);
    }
    json!({"lb_policy": policy, "lb_config": cfg})
}

/// `pool` streams held at once, each admitted only if every count the proxy kept came back
/// to zero (the route's `maxPoolRequests` is `pool`), and one more refused (429): the cap
/// holds, so the admissions meant something. `pool` must not exceed the live engines' slots
/// (a stream waiting for a slot sends nothing to hold on to).
fn nothing_held(envoy: &Envoy, engines: &[Engine], pool: usize) {
    let held: Vec<Held> = (0..pool)
        .map(|i| hold(&envoy.url, DEBUG, &format!("fill {i}"), LONG).expect("a count was left"))
        .collect();
    assert_eq!(ask(&envoy.url, DEBUG, &short_chat("over")).status, 429);
    drop(held);
    assert!(wait_until(Duration::from_secs(3), || loads(engines)
        .iter()
        .all(|&l| l == 0.0)));
}

#[test]
fn envoy_prefix_cache_keeps_conversations_on_their_engine() {
    let _one = exclusive();
    // A slot for every conversation: the ring places new conversations by hash, not by load
    // (5 of the 8 on one engine, measured), and 2 slots would then thrash whatever the
    // routing; here what an engine keeps is what was routed to it.
    let engines = fleet(
        3,
        &EngineConfig {
            slots: 8,
            context: 8 * 1536,
            threads: 1,
        },
    )
    .unwrap();
    let pods = addrs(&engines);
    let mut shares = Vec::new();
    for seed in 1..=3 {
        let cfg = Conversations {
            seed,
            debug_header: DEBUG.into(),
            ..Conversations::default()
        };
        let rr = replay(&Envoy::start_plain(&pods).url, &cfg, &[]);
        let envoy = Envoy::start(&pods, &plugin("prefix_cache", &engines, json!({})));
        let p = replay(&envoy.url, &cfg, &[]);
        shares.push(compare_seed(&format!("envoy seed {seed}"), &rr, &p));
    }
    judge_cached_shares(&shares);
}

/// As real_engine's: 6 held streams make 2 on each engine, in the plugin's choices and in the
/// engines' own running + waiting requests; engine-0's two closed, it takes the next two.
#[test]
fn envoy_global_least_request_follows_the_engines_real_requests() {
    let _one = exclusive();
    let engines = fleet(3, &EngineConfig::default()).unwrap();
    let a = addrs(&engines);
    let lb = json!({"maxPoolRequests": 6});
    let envoy = Envoy::start(&a, &plugin("global_least_request", &engines, lb));
    let mut held: Vec<Held> = (0..6)
        .map(|i| hold(&envoy.url, DEBUG, &format!("s{i}"), LONG).unwrap())
        .collect();
    let look = |held: &[Held]| {
        let chosen: Vec<&str> = held.iter().map(|h| h.endpoint.as_str()).collect();
        (tally(&engines, &chosen), loads(&engines))
    };
    let even = vec![2.0; 3];
    let mut seen = look(&held);
    wait_until(Duration::from_secs(2), || {
        seen = look(&held);
        seen.1 == even
    });
    eprintln!("envoy 6 held: chosen, engines {seen:?}");
    assert_eq!(seen, (even.clone(), even.clone()));
    held.retain(|h| h.endpoint != a[0]);
    assert!(wait_until(Duration::from_secs(2), || loads(&engines)[0] == 0.0));
    for i in 0..2 {
        let h = hold(&envoy.url, DEBUG, &format!("t{i}"), LONG).unwrap();
        assert_eq!(h.endpoint, a[0], "the least-loaded engine");
        held.push(h);
    }
    wait_until(Duration::from_secs(2), || {
        seen = look(&held);
        seen.1 == even
    });
    assert_eq!(seen, (even.clone(), even));
    drop(held);
    assert!(wait_until(Duration::from_secs(3), || loads(&engines) == vec![0.0; 3]));
    nothing_held(&envoy, &engines, 6);
}

#[test]
fn envoy_a_client_abort_cancels_the_engines_task_and_leaves_no_count() {
    let _one = exclusive();
    let engines = fleet(3, &EngineConfig::default()).unwrap();
    let lb = json!({"maxPoolRequests": 6});
    let envoy = Envoy::start(
        &addrs(&engines),
        &plugin("global_least_request", &engines, lb),
    );
    let h = hold(&envoy.url, DEBUG, "abort", LONG).unwrap();
    let engine = engines.iter().find(|e| e.addr == h.endpoint).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(engine.load(), 1.0);
    abort_cancels(engine, h, "envoy");
    nothing_held(&envoy, &engines, 6);
}

/// envoy/envoy.yaml's route retries a refused or reset connection: after the kill every
/// request is answered, and the refusal Envoy's retry went around ejects the dead engine at
/// once (docs/plain-envoy.md "Failure memory").
#[test]
fn envoy_an_engine_killed_mid_stream_is_cut_forgotten_and_avoided() {
    let _one = exclusive();
    let mut engines = fleet(3, &EngineConfig::default()).unwrap();
    let a = addrs(&engines);
    let lb = json!({"maxPoolRequests": 4});
    let envoy = Envoy::start(&a, &plugin("global_least_request", &engines, lb));
    let mut held: Vec<Held> = (0..3)
        .map(|i| hold(&envoy.url, DEBUG, &format!("s{i}"), LONG).unwrap())
        .collect();
    let victim = held.remove(0);
    let dead = a.iter().position(|x| *x == victim.endpoint).unwrap();
    engines[dead].kill();
    let (ended, done, took) = victim.finish(Duration::from_secs(10));
    eprintln!("envoy: killed engine-{dead}: stream ended {ended} (done {done}) in {took:?}");
    assert!(ended && !done, "the cut stream must end, without [DONE]");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let mut live = vec![1.0; 3];
    live[dead] = 0.0;
    assert_eq!(loads(&engines), live);
    drop(held);
    // The refusal Envoy's retry went around ejects the dead engine at once: chosen once.
    let (answers, before) =
        until_ejected(&envoy.url, DEBUG, &|| envoy.stat("ai_lb.eject.ejected") > 0);
    let chosen_dead: Vec<usize> = (0..answers.len())
        .filter(|&i| answers[i].endpoint == a[dead])
        .collect();
    let [pod_down, ejected] = envoy.stats(["ai_lb.glr.pod_down", "ai_lb.eject.ejected"]);
    eprintln!("envoy after: chosen dead {chosen_dead:?}, pod_down {pod_down}, ejected {ejected}");
    assert!(answers.iter().all(|x| x.status == 200), "{answers:?}");
    assert!(answers.iter().all(|x| x.prompt_tokens > 0), "{answers:?}");
    assert!(before < 60, "not ejected");
    assert_eq!(chosen_dead.len(), 1, "chosen dead: {chosen_dead:?}");
    assert!(
        chosen_dead[0] < before,
        "{chosen_dead:?}, ejected at {before}"
    );
    assert_eq!(ejected, 1);
    assert_eq!(pod_down as usize, chosen_dead.len());
    // The failed request's count is held failurePenaltyMs (1 s) before the pool is full again.
    std::thread::sleep(Duration::from_millis(1_200));
    nothing_held(&envoy, &engines, 4);
}

#[test]
fn envoy_a_restarted_engine_is_found_out_from_its_real_usage() {
    let _one = exclusive();
    let mut engines = fleet(2, &roomy()).unwrap();
    let envoy = Envoy::start(
        &addrs(&engines),
        &plugin("prefix_cache", &engines, json!({})),
    );
    restarted_engine_is_found_out(&envoy.url, DEBUG, &mut engines, 2, &|k| envoy.stat(k));
}
