//! The Go-built third-party plugin (src/thirdparty.rs) beside ours: VM time per request from
//! the emulator's counters, same pods, same Redis, same requests, interleaved one by one. Run
//! twice: as is, then with every VM entry finding cold caches (the emulator's
//! `AILB_COLD_ENTRIES`, docs/plugin-cpu.md), the state an idle worker meets a request in.

use crate::common::chat10;
use ailb_bench::thirdparty;
use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::{glr_config, http, Gateway};
use serde_json::json;

pub fn thirdparty_vs_ours_vm_time() -> anyhow::Result<()> {
    let bed = Bed::new(2, |c| {
        c.decode_us_per_token = 0;
        c.prefill_us_per_token = 0;
        c.max_running = 64;
    });
    // A cold entry first writes 96 MiB: fewer requests there.
    let cold: &[(&str, &str)] = &[("AILB_COLD_ENTRIES", "all")];
    for (suffix, env, warm, n) in [("", &[][..], 200, 2000), ("_cold_entries", cold, 10, 100)] {
        let (go, ours) = side_by_side(&bed, env, warm, n)?;
        println!("BENCH thirdparty_go_plugin_vm_us_per_request{suffix} {go:.1} us");
        println!("BENCH plugin_vm_us_per_request_same_run{suffix} {ours:.1} us");
    }
    Ok(())
}

/// VM µs per request of the Go plugin and of ours (global least-request, one Redis script per
/// request like the Go plugin's one `EVAL`), each gateway started with `env`: `warm` requests
/// to each, then `n` more counted.
fn side_by_side(
    bed: &Bed,
    env: &[(&str, &str)],
    warm: usize,
    n: usize,
) -> anyhow::Result<(f64, f64)> {
    let mut spec = bed.spec("go-rate-limit", None);
    spec.plugin = Some((
        thirdparty::rate_limit_wasm()?,
        thirdparty::rate_limit_config(bed.redis.port),
    ));
    let go = Gateway::start_config_env(&spec.config(), &spec.id, env)?;
    let spec = bed.spec("ours", Some(glr_config(bed.redis.port, json!({}))));
    let ours = Gateway::start_config_env(&spec.config(), &spec.id, env)?;
    let body = chat10();
    let post = |gw: &Gateway| -> anyhow::Result<()> {
        let (status, _, _) = http(
            &gw.url,
            "POST",
            "/v1/chat/completions",
            &[("content-type", "application/json"), ("x-user", "alice")],
            &body,
        )?;
        anyhow::ensure!(status == 200, "{}: status {status}", gw.id);
        Ok(())
    };
    for _ in 0..warm {
        post(&go)?;
        post(&ours)?;
    }
    let snap = |gw: &Gateway| {
        (
            gw.stat("gateway.vm_call_ns"),
            gw.stat("gateway.streams_destroyed"),
        )
    };
    let (go0, ours0) = (snap(&go), snap(&ours));
    for _ in 0..n {
        post(&go)?;
        post(&ours)?;
    }
    let (go1, ours1) = (snap(&go), snap(&ours));
    anyhow::ensure!(
        go.stat("gateway.vm_traps") == 0 && ours.stat("gateway.vm_traps") == 0,
        "a VM died during the run"
    );
    let us = |a: (i64, i64), b: (i64, i64)| (b.0 - a.0) as f64 / (b.1 - a.1).max(1) as f64 / 1e3;
    Ok((us(go0, go1), us(ours0, ours1)))
}
