//! The engine-verified prefix index on real usage behind the emulator (Higress build, Redis):
//! ailb_e2e::real_verify for what it checks. One worker, so the short answers that find the
//! restart out are that worker's FLUSH_CONVERSATIONS exactly.

use super::{settle, DEBUG};
use ailb_e2e::gateway::{Gateway, GatewaySpec};
use ailb_e2e::llama::{self, exclusive, fleet};
use ailb_e2e::real_verify::{restarted_engine_is_found_out, roomy};
use ailb_testkit::{Options, RedisServer};
use serde_json::json;
use std::time::Duration;

#[test]
fn a_restarted_engine_is_found_out_from_its_real_usage() {
    let _one = exclusive();
    let mut engines = fleet(2, &roomy()).unwrap();
    let addrs = llama::addrs(&engines);
    let redis = RedisServer::start_with(Options::default());
    let px = json!({"lb_policy": "prefix_cache", "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": redis.port, "timeout": 1000,
        "debugHeader": DEBUG}});
    let mut spec = GatewaySpec::new("verify", redis.port, &addrs, Some(px));
    spec.workers = 1;
    let gw = Gateway::start(&spec).unwrap();
    restarted_engine_is_found_out(&gw.url, DEBUG, &mut engines, 1, &|k| gw.stat(k));
    let left = settle(redis.port, Duration::from_secs(5));
    assert!(left.is_zero(), "{left:?}");
}
