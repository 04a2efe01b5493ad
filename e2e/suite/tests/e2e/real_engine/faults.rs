//! An engine killed mid-stream (SIGKILL, a crashed pod) behind the emulator: the stream it
//! served ends at once, cut (no `[DONE]`), the others go on; following requests are answered
//! by the two left (the route retries a refused connection, as envoy/envoy.yaml's does) while
//! failure memory learns the dead one's refusals (each moves the request's count to the engine
//! that answered, its own held `failurePenaltyMs`) and ejects it; no count is left.

use super::{counted, settle, DEBUG};
use ailb_e2e::gateway::{glr_config, Gateway, GatewaySpec, CLUSTER, ROUTE};
use ailb_e2e::llama::{self, exclusive, fleet, EngineConfig};
use ailb_e2e::real::{ask, loads, short_chat, until_ejected, LONG};
use ailb_e2e::redis::counts;
use ailb_e2e::streams::{hold, Held};
use ailb_testkit::{wait_until, Options, RedisServer};
use serde_json::json;
use std::time::Duration;

#[test]
fn an_engine_killed_mid_stream_is_cut_forgotten_and_avoided() {
    let _one = exclusive();
    let mut engines = fleet(3, &EngineConfig::default()).unwrap();
    let addrs = llama::addrs(&engines);
    let redis = RedisServer::start_with(Options::default());
    let cfg = glr_config(
        redis.port,
        json!({"debugHeader": DEBUG, "ejectAfterFailures": 2}),
    );
    let mut spec = GatewaySpec::new("kill", redis.port, &addrs, Some(cfg));
    spec.retry_policy = Some(json!({"retry_on": "connect-failure,reset", "num_retries": 2}));
    let gw = Gateway::start(&spec).unwrap();
    let mut held: Vec<Held> = (0..3)
        .map(|i| hold(&gw.url, DEBUG, &format!("s{i}"), LONG).unwrap())
        .collect();
    let victim = held.remove(0);
    let dead = addrs.iter().position(|a| *a == victim.endpoint).unwrap();
    engines[dead].kill();
    let (ended, done, took) = victim.finish(Duration::from_secs(10));
    eprintln!("killed engine-{dead}: its stream ended {ended} (done {done}) in {took:?}");
    assert!(ended && !done, "the cut stream must end, without [DONE]");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // The two others run on, each on its engine, and are counted there only.
    let mut live = vec![1.0; 3];
    live[dead] = 0.0;
    assert_eq!(loads(&engines), live);
    assert_eq!(counted(&counts(redis.port, ROUTE, CLUSTER), &addrs), live);
    drop(held);
    // Following requests, one every 150 ms: every one answered; the dead engine is chosen
    // once, kept off for its failed request's held count (1 s), chosen once more and ejected
    // (ejectAfterFailures 2), then never again.
    let (answers, before) = until_ejected(&gw.url, DEBUG, &|| gw.stat("ai_lb.eject.ejected") > 0);
    let chosen_dead: Vec<usize> = (0..answers.len())
        .filter(|&i| answers[i].endpoint == addrs[dead])
        .collect();
    let stats = gw.stats();
    let stat = |k: &str| stats.get(k).copied().unwrap_or(0);
    eprintln!(
        "after: chosen dead {chosen_dead:?}, pod_down {}, ejected {}, failures {}",
        stat("ai_lb.glr.pod_down"),
        stat("ai_lb.eject.ejected"),
        stat("ai_lb.eject.failures")
    );
    assert!(answers.iter().all(|a| a.status == 200), "{answers:?}");
    assert!(answers.iter().all(|a| a.prompt_tokens > 0), "{answers:?}");
    assert!(before < 60, "not ejected");
    assert_eq!(chosen_dead.len(), 2, "chosen dead: {chosen_dead:?}");
    assert!(
        chosen_dead.iter().all(|&i| i < before),
        "{chosen_dead:?}, ejected at {before}"
    );
    assert_eq!(stat("ai_lb.eject.ejected"), 1);
    assert_eq!(stat("ai_lb.glr.pod_down") as usize, chosen_dead.len());
    assert!(wait_until(Duration::from_secs(3), || loads(&engines) == vec![0.0; 3]));
    // The last failed try's count is held 1 s on the dead engine, and given back by the first
    // pick after that (its reclaim, docs/redis-data-model.md §14): probes until then.
    let mut left = counts(redis.port, ROUTE, CLUSTER);
    wait_until(Duration::from_secs(5), || {
        ask(&gw.url, DEBUG, &short_chat("probe"));
        left = settle(redis.port, Duration::from_millis(300));
        left.is_zero()
    });
    assert!(left.is_zero(), "{left:?}");
}
