//! `ailb-footprint CONFIG.yaml N`: N streamed requests through one worker's VM, in process and
//! without sockets, each as the cluster bench's streamed run delivers it (request headers, a
//! JSON body, response headers, ten body chunks, stream end). Run under callgrind by
//! `ailb-bench footprint` (e2e/suite/src/footprint.rs), which counts the plugin code one
//! request touches: what an idle worker pays for in cold cache lines (docs/plugin-cpu.md).

use ailb_gateway::config::Config;
use ailb_gateway::shared::Shared;
use ailb_gateway::stream_data::pairs;
use ailb_gateway::vm::Plugin;
use ailb_gateway::worker::Worker;
use anyhow::{anyhow, Context, Result};
use std::sync::Arc;

const BODY: &[u8] = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hello there, tell me a story"}]}"#;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(n)) = (args.get(1), args.get(2)) else {
        anyhow::bail!("usage: ailb-footprint CONFIG.yaml REQUESTS");
    };
    let n: usize = n.parse().context("REQUESTS")?;
    let cfg = Config::load(std::path::Path::new(path), &[])?;
    let route = cfg.routes.first().cloned();
    let plugin_cfg = cfg.plugin.as_ref().ok_or_else(|| anyhow!("no plugin"))?;
    let wasm = std::fs::read(cfg.resolve(&plugin_cfg.wasm))?;
    let plugin = Arc::new(Plugin::load(&wasm)?);
    let shared = Shared::new(cfg)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tokio::task::LocalSet::new().block_on(&rt, async move {
        let w = Worker::new(0, shared, Some(plugin))?;
        let vm_err = || anyhow!("the VM failed");
        for i in 0..n {
            let id = format!("req-{i}");
            let headers = pairs(&[
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                (":authority", "gw"),
                (":scheme", "http"),
                ("content-type", "application/json"),
                ("x-user", &id),
            ]);
            let count = headers.len();
            let ctx = w.new_stream(headers, route.as_ref())?;
            w.with_vm(|vm| vm.on_request_headers(ctx, count, false))
                .ok_or_else(vm_err)??;
            w.with_stream(ctx, |s| s.req_body = BODY.to_vec());
            w.with_vm(|vm| vm.on_request_body(ctx, BODY.len(), true))
                .ok_or_else(vm_err)??;
            let answer = pairs(&[(":status", "200"), ("content-type", "text/event-stream")]);
            w.with_stream(ctx, |s| s.resp_headers = answer);
            w.with_vm(|vm| vm.on_response_headers(ctx, 2, false))
                .ok_or_else(vm_err)??;
            for k in 0..10 {
                let chunk =
                    format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{k}\"}}}}]}}\n\n");
                let len = chunk.len();
                w.with_stream(ctx, |s| s.resp_body = chunk.into_bytes());
                w.with_vm(|vm| vm.on_response_body(ctx, len, k == 9))
                    .ok_or_else(vm_err)??;
            }
            w.destroy_stream(ctx);
        }
        Ok(())
    })
}
