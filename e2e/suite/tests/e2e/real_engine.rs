//! The plugin against real engines (issue 51): three llama.cpp `llama-server`s
//! (ailb_e2e::llama) behind the emulator (Higress build, Redis).

use ailb_e2e::conversations::{replay, Conversations};
use ailb_e2e::gateway::{Gateway, GatewaySpec};
use ailb_e2e::llama::{fleet, EngineConfig};
use ailb_testkit::{Options, RedisServer};
use serde_json::json;

const DEBUG: &str = "x-ai-lb-debug";

#[test]
fn prefix_cache_keeps_conversations_on_their_engine() {
    let engines = fleet(3, &EngineConfig::default()).unwrap();
    let addrs: Vec<String> = engines.iter().map(|e| e.addr.clone()).collect();
    let redis = RedisServer::start_with(Options::default());
    let px = json!({"lb_policy": "prefix_cache", "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": redis.port, "timeout": 1000,
        "debugHeader": DEBUG}});
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
        eprintln!(
            "seed {seed}: rr {:.3} ({} failed) px {:.3} ({} failed) p50 rr {:?} px {:?}",
            rr.later_turn_cached_share(),
            rr.failed(),
            p.later_turn_cached_share(),
            p.failed(),
            rr.later_turn_latency(0.5),
            p.later_turn_latency(0.5)
        );
        assert_eq!((rr.failed(), p.failed()), (0, 0));
        assert!(
            p.later_turn_cached_share() > rr.later_turn_cached_share() + 0.3,
            "prefix_cache must keep conversations on the engine holding them"
        );
    }
}
