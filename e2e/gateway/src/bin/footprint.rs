//! `ailb-footprint CONFIG.yaml N [--pages | --per-page | --trace]`: N streamed requests
//! through one worker's VM, in process and without sockets, each as the cluster bench's
//! streamed run delivers it (request headers, a JSON body, response headers, ten body chunks,
//! stream end). Then, with a mode, N more, counted:
//!
//! - none: run under callgrind by `ailb-bench footprint` (e2e/suite/src/footprint.rs), which
//!   counts the plugin code one request touches: what an idle worker pays for in cold cache
//!   lines and pages (docs/plugin-cpu.md);
//! - `--pages`: per request, `pages <linear memory pages> <compiled code pages>` it touched,
//!   the host's accesses to linear memory included (`ailb_gateway::pages`); then, for N more,
//!   `entry_pages <sum> <chunks> <each>`: the pages of linear memory each VM entry touched,
//!   summed over the request's entries and over its ten answer chunks alone, then each
//!   entry's in order (context creation, request headers, request body, response headers,
//!   the ten chunks, the stream's end), comma-separated. An idle worker meets each entry's
//!   pages anew, so a page touched by every chunk costs ten walks, where the per-request
//!   count has it once (docs/plugin-cpu.md "Body chunks");
//! - `--per-page`: each page of linear memory with how many requests touched it;
//! - `--trace`: the module must be one `wasm-abi trace-memory` made: each 64-byte line of
//!   linear memory every request's own accesses touch, with the functions touching it
//!   (e2e/suite/src/data_footprint.rs names them), then the lines and pages per request.

use ailb_gateway::config::{Config, RouteCfg};
use ailb_gateway::pages;
use ailb_gateway::shared::Shared;
use ailb_gateway::stream_data::pairs;
use ailb_gateway::vm::Plugin;
use ailb_gateway::worker::Worker;
use anyhow::{anyhow, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const BODY: &[u8] = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hello there, tell me a story"}]}"#;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(n)) = (args.get(1), args.get(2)) else {
        anyhow::bail!("usage: ailb-footprint CONFIG.yaml REQUESTS [--pages|--per-page|--trace]");
    };
    let n: usize = n.parse().context("REQUESTS")?;
    let mode = args.get(3).cloned();
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
        let route = route.as_ref();
        for i in 0..n {
            one_request(&w, route, i, &mut plain)?;
        }
        let (memory, code) = w
            .with_vm(|vm| vm.host_ranges())
            .ok_or_else(|| anyhow!("no VM"))?;
        match mode.as_deref() {
            None => Ok(()),
            Some("--pages") => {
                for i in n..2 * n {
                    pages::forget(&memory)?;
                    one_request(&w, route, i, &mut plain)?;
                    let m = pages::touched(&memory)?.len();
                    let c = pages::touched(&code)?.len();
                    println!("pages {m} {c}");
                }
                for i in 2 * n..3 * n {
                    let (mut sum, mut chunks) = (0, 0);
                    let mut each = Vec::new();
                    one_request(&w, route, i, &mut |what, call| {
                        pages::forget(&memory)?;
                        call()?;
                        let touched = pages::touched(&memory)?.len();
                        sum += touched;
                        each.push(touched.to_string());
                        if what == Entry::Chunk {
                            chunks += touched;
                        }
                        Ok(())
                    })?;
                    println!("entry_pages {sum} {chunks} {}", each.join(","));
                }
                Ok(())
            }
            Some("--per-page") => per_page(&w, route, n, &memory),
            Some("--trace") => traced(&w, route, n),
            Some(other) => Err(anyhow!("unknown mode {other}")),
        }
    })
}

/// What a VM entry of a request is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// An answer chunk's `proxy_on_response_body`.
    Chunk,
    /// Any other: context creation, request headers and body, response headers, the
    /// stream's end (done, log and delete back to back, as the host calls them).
    Other,
}

/// How [`one_request`] runs each VM entry: `call` runs it.
type Around<'a> = &'a mut dyn FnMut(Entry, &mut dyn FnMut() -> Result<()>) -> Result<()>;

fn plain(_: Entry, call: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    call()
}

/// One request as the streamed run delivers it, each VM entry run through `around`.
fn one_request(w: &Worker, route: Option<&RouteCfg>, i: usize, around: Around) -> Result<()> {
    let vm_err = || anyhow!("the VM failed");
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
    let mut headers = Some(headers);
    let mut ctx = 0;
    around(Entry::Other, &mut || {
        let h = headers
            .take()
            .ok_or_else(|| anyhow!("one context per request"))?;
        ctx = w.new_stream(h, route)?;
        Ok(())
    })?;
    around(Entry::Other, &mut || {
        w.with_vm(|vm| vm.on_request_headers(ctx, count, false))
            .ok_or_else(vm_err)??;
        Ok(())
    })?;
    w.with_stream(ctx, |s| s.req_body = BODY.to_vec());
    around(Entry::Other, &mut || {
        w.with_vm(|vm| vm.on_request_body(ctx, BODY.len(), true))
            .ok_or_else(vm_err)??;
        Ok(())
    })?;
    let answer = pairs(&[(":status", "200"), ("content-type", "text/event-stream")]);
    w.with_stream(ctx, |s| s.resp_headers = answer);
    around(Entry::Other, &mut || {
        w.with_vm(|vm| vm.on_response_headers(ctx, 2, false))
            .ok_or_else(vm_err)??;
        Ok(())
    })?;
    for k in 0..10 {
        let chunk = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{k}\"}}}}]}}\n\n");
        let len = chunk.len();
        w.with_stream(ctx, |s| s.resp_body = chunk.into_bytes());
        around(Entry::Chunk, &mut || {
            w.with_vm(|vm| vm.on_response_body(ctx, len, k == 9))
                .ok_or_else(vm_err)??;
            Ok(())
        })?;
    }
    around(Entry::Other, &mut || {
        w.destroy_stream(ctx);
        Ok(())
    })
}

/// The data a module made by `wasm-abi trace-memory` touches per request (its accesses, not
/// the host's writes into its buffers): each 64-byte line every one of `n` requests touches,
/// with how many bytes of it, then the lines and pages per request.
fn traced(w: &Worker, route: Option<&RouteCfg>, n: usize) -> Result<()> {
    let _ = ailb_gateway::trace::take();
    let mut lines: BTreeMap<u32, (usize, BTreeSet<u32>)> = Default::default();
    let mut users: BTreeMap<u32, BTreeSet<u32>> = Default::default();
    for i in n..2 * n {
        one_request(w, route, i, &mut plain)?;
        let mut seen = BTreeSet::new();
        for (address, length, function) in ailb_gateway::trace::take() {
            for b in address..address.saturating_add(length.max(1)) {
                seen.insert(b);
            }
            users.entry(address / 64).or_default().insert(function);
        }
        let mut per_line: BTreeMap<u32, Vec<u32>> = Default::default();
        for b in seen {
            per_line.entry(b / 64).or_default().push(b);
        }
        for (line, bytes) in per_line {
            let e = lines.entry(line).or_default();
            e.0 += 1;
            e.1.extend(bytes);
        }
    }
    let every: Vec<(&u32, &(usize, BTreeSet<u32>))> =
        lines.iter().filter(|(_, (c, _))| *c == n).collect();
    let pages: BTreeSet<u32> = every.iter().map(|(l, _)| *l / 64).collect();
    for (line, (_, bytes)) in &every {
        let by: Vec<&u32> = users
            .get(line)
            .map(|u| u.iter().collect())
            .unwrap_or_default();
        println!(
            "line {:#x} bytes {} functions {by:?}",
            *line * 64,
            bytes.len()
        );
    }
    println!(
        "data lines per request {} pages {} ({:x?})",
        every.len(),
        pages.len(),
        pages.iter().map(|p| p * 4096).collect::<Vec<_>>()
    );
    Ok(())
}

/// Each page of linear memory, as an offset, with how many of `n` requests touched it.
fn per_page(
    w: &Worker,
    route: Option<&RouteCfg>,
    n: usize,
    memory: &std::ops::Range<usize>,
) -> Result<()> {
    pages::split(memory)?;
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for i in n..2 * n {
        pages::forget(memory)?;
        one_request(w, route, i, &mut plain)?;
        for page in pages::touched(memory)? {
            *counts.entry(page).or_default() += 1;
        }
    }
    for (page, count) in counts {
        println!("page {page:#x} {count}");
    }
    Ok(())
}
