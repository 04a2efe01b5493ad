//! The Go-built third-party plugin (src/thirdparty.rs) beside ours: VM time per request from
//! the emulator's counters, same pods, same Redis, same requests, interleaved one by one.

use crate::common::chat10;
use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::{glr_config, http, Gateway};
use ailb_e2e::thirdparty;
use serde_json::json;

pub fn thirdparty_vs_ours_vm_time() -> anyhow::Result<()> {
    let bed = Bed::new(2, |c| {
        c.decode_us_per_token = 0;
        c.prefill_us_per_token = 0;
        c.max_running = 64;
    });
    let mut spec = bed.spec("go-rate-limit", None);
    spec.plugin = Some((
        thirdparty::rate_limit_wasm()?,
        thirdparty::rate_limit_config(bed.redis.port),
    ));
    let go = Gateway::start(&spec)?;
    let ours = Gateway::start(&bed.spec("ours", Some(glr_config(bed.redis.port, json!({})))))?;
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
    for _ in 0..200 {
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
    for _ in 0..2000 {
        post(&go)?;
        post(&ours)?;
    }
    let (go1, ours1) = (snap(&go), snap(&ours));
    anyhow::ensure!(
        go.stat("gateway.vm_traps") == 0 && ours.stat("gateway.vm_traps") == 0,
        "a VM died during the run"
    );
    let us = |a: (i64, i64), b: (i64, i64)| (b.0 - a.0) as f64 / (b.1 - a.1).max(1) as f64 / 1e3;
    println!(
        "BENCH thirdparty_go_plugin_vm_us_per_request {:.1} us",
        us(go0, go1)
    );
    println!(
        "BENCH plugin_vm_us_per_request_same_run {:.1} us",
        us(ours0, ours1)
    );
    Ok(())
}
