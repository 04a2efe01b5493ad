//! Request path of one HTTP stream: request headers and body through the plugin (holding
//! and buffering as the header/data statuses say), upstream selection when the headers are
//! released, then the response phases in `response.rs`.

use crate::abi::{request_header_status, HeaderStatus};
use crate::config::FailurePolicy;
use crate::response::{local_reply, proxy_response, OutBody};
use crate::router::{keeps_body, start_upstream, Upstream};
use crate::stream_data::{LocalReply, Pairs, Signals};
use crate::upstream::{match_route, Reset};
use crate::worker::{StreamGuard, Worker};
use bytes::Bytes;
use http_body::{Body as _, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;

/// proxy-wasm FilterDataStatus::StopIterationAndBuffer (docs/higress-abi.md §2).
const DATA_STOP_AND_BUFFER: u32 = 1;
/// proxy-wasm FilterDataStatus::StopIterationAndWatermark (docs/higress-abi.md §2).
const DATA_STOP_AND_WATERMARK: u32 = 2;

fn request_pairs(parts: &hyper::http::request::Parts) -> Pairs {
    let authority = parts
        .headers
        .get("host")
        .map(|v| v.as_bytes().to_vec())
        .or_else(|| {
            parts
                .uri
                .authority()
                .map(|a| a.as_str().as_bytes().to_vec())
        })
        .unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut out: Pairs = vec![
        (b":authority".to_vec(), authority),
        (b":path".to_vec(), path.as_bytes().to_vec()),
        (
            b":method".to_vec(),
            parts.method.as_str().as_bytes().to_vec(),
        ),
        (b":scheme".to_vec(), b"http".to_vec()),
    ];
    for (k, v) in parts.headers.iter() {
        if k != "host" {
            out.push((k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()));
        }
    }
    out
}

/// Take the plugin's pending actions for this stream.
fn take_signals(w: &Worker, ctx: u32) -> Signals {
    w.with_stream(ctx, |s| s.signals.take()).unwrap_or_default()
}

/// Envoy's answer on a stream whose VM died, FAIL_CLOSED: a 503 local reply
/// (`wasm_fail_stream`).
fn vm_failed_reply(w: &Rc<Worker>, guard: Option<StreamGuard>) -> Response<OutBody> {
    local_reply(w, guard, 503, b"wasm vm failed".to_vec(), vec![])
}

pub async fn handle(w: Rc<Worker>, req: Request<Incoming>) -> Result<Response<OutBody>, Reset> {
    w.shared.counters.requests.fetch_add(1, Relaxed);
    let (parts, mut body) = req.into_parts();
    let headers = request_pairs(&parts);
    let route = match_route(&w.shared.cfg.routes, parts.uri.path());
    // A dead VM (docs/higress-abi.md): FAIL_RELOAD builds a new one when its backoff allows,
    // FAIL_OPEN serves the request without the plugin, FAIL_CLOSED answers 503.
    let fail_open = w.fail_open();
    let dead =
        w.vm_failed() && !(w.failure_policy() == FailurePolicy::FailReload && w.try_reload());
    if dead && !fail_open {
        return Ok(vm_failed_reply(&w, None));
    }
    let mut plugin = w.has_plugin() && !dead;
    // Context 0 is no stream of any VM: the plugin never sees this request.
    let mut ctx = 0;
    if plugin {
        match w.new_stream(headers.clone(), route) {
            Ok(c) => ctx = c,
            Err(_) if fail_open => plugin = false,
            Err(_) => return Ok(vm_failed_reply(&w, None)),
        }
    }
    let guard = StreamGuard {
        worker: w.clone(),
        ctx,
    };
    let signals = w.with_stream(ctx, |s| s.signals.clone());
    let limit = w.shared.cfg.buffer_limit_bytes;

    let mut body_done = body.is_end_stream();
    let mut held = false;
    let mut plugin_sees_data = true;
    let mut deliver_buffered = false;
    let mut data_paused = false;
    // The plugin's last data status was StopIterationAndWatermark: buffer past the limit by
    // applying flow control (stop reading from the client) instead of answering 413.
    let mut watermark = false;
    let mut pending: Vec<u8> = Vec::new();
    let mut local_headers = headers;
    // FAIL_OPEN on a dead VM: every later callback would answer Continue, so the stream goes
    // on without the plugin, with what it buffered.
    macro_rules! bypass_plugin {
        () => {{
            plugin = false;
            held = false;
            data_paused = false;
            watermark = false;
            deliver_buffered = false;
            plugin_sees_data = true;
        }};
    }
    if plugin {
        let n = local_headers.len();
        let r = w.with_vm(|vm| vm.on_request_headers(ctx, n, body_done));
        match r {
            Some(Ok(ret)) => match request_header_status(w.abi, ret) {
                HeaderStatus::Continue | HeaderStatus::ContinueAndEndStream => {
                    w.with_stream(ctx, |s| s.signals.flags.borrow_mut().resume_request = false);
                }
                HeaderStatus::StopIteration => held = true,
                HeaderStatus::StopAll => {
                    held = true;
                    plugin_sees_data = false;
                }
            },
            _ if fail_open => bypass_plugin!(),
            _ => return Ok(vm_failed_reply(&w, Some(guard))),
        }
    }
    let mut upstream: Option<Upstream> = None;
    // Headers released to the router; with a retry policy, the body it keeps whole meanwhile
    // (router.rs `keeps_body`): what passed the plugin, not yet sent.
    let (mut released, mut keep_body, mut kept) = (false, false, Vec::new());

    // Call on_request_body with what is buffered; false if the VM trapped.
    let call_body =
        |pending: &mut Vec<u8>, eos: bool, data_paused: &mut bool, watermark: &mut bool| -> bool {
            let buf = std::mem::take(pending);
            let len = buf.len();
            w.with_stream(ctx, |s| s.req_body = buf);
            let r = w.with_vm(|vm| vm.on_request_body(ctx, len, eos));
            // A whole body held with StopIterationAndBuffer stays reachable from the stream's
            // other callbacks (a Redis reply, a callout), as Envoy's `decodingBuffer()` is while
            // its wasm context is `buffering_request_body_`; any other answer takes it out of
            // the plugin's view (docs/higress-abi.md §2). Kept once the body is complete, not
            // copied again at every chunk of a body still arriving.
            let buffering = eos && matches!(r, Some(Ok(ret)) if ret == DATA_STOP_AND_BUFFER);
            *pending = w
                .with_stream(ctx, |s| {
                    s.req_body_set = false;
                    if buffering {
                        s.req_body.clone()
                    } else {
                        std::mem::take(&mut s.req_body)
                    }
                })
                .unwrap_or_default();
            match r {
                Some(Ok(ret)) => {
                    *data_paused = ret != 0;
                    *watermark = ret == DATA_STOP_AND_WATERMARK;
                    true
                }
                _ => false,
            }
        };

    loop {
        if plugin && signals.as_ref().is_some_and(|s| s.vm_failed()) {
            if !fail_open {
                return Ok(vm_failed_reply(&w, Some(guard)));
            }
            bypass_plugin!();
        }
        if plugin {
            // A callback other than the body's replaced the held body: that is what goes on.
            let replaced = w.with_stream(ctx, |s| {
                std::mem::take(&mut s.req_body_set).then(|| std::mem::take(&mut s.req_body))
            });
            if let Some(Some(body)) = replaced {
                pending = body;
            }
            let sig = take_signals(&w, ctx);
            if let Some(lr) = sig.local_reply {
                return Ok(plugin_local_reply(&w, guard, lr));
            }
            if sig.close {
                return Err(Reset("closed by plugin"));
            }
            if sig.resume_request {
                if held {
                    held = false;
                    if !plugin_sees_data {
                        plugin_sees_data = true;
                        deliver_buffered = !pending.is_empty() || body_done;
                    }
                }
                data_paused = false;
                watermark = false;
            }
            if deliver_buffered {
                deliver_buffered = false;
                if !call_body(&mut pending, body_done, &mut data_paused, &mut watermark) {
                    if !fail_open {
                        return Ok(vm_failed_reply(&w, Some(guard)));
                    }
                    bypass_plugin!();
                }
                continue;
            }
        }
        if !held && upstream.is_none() && !released {
            released = true;
            if ctx != 0 {
                local_headers = w
                    .with_stream(ctx, |s| {
                        s.headers_released = true;
                        s.req_headers.clone()
                    })
                    .unwrap_or(local_headers);
            }
            keep_body = keeps_body(&w, &local_headers);
        }
        if keep_body && upstream.is_none() && !held && !data_paused {
            kept.append(&mut pending);
        }
        // A body too large to keep goes on as it arrives (Envoy gives up the retries then).
        let overflow = keep_body && kept.len() > limit;
        if overflow {
            (keep_body, pending) = (false, std::mem::take(&mut kept));
        }
        let ready = !keep_body || (body_done && !data_paused);
        if !held && upstream.is_none() && ready {
            let full = (body_done && !data_paused).then(|| {
                kept.append(&mut pending);
                std::mem::take(&mut kept)
            });
            match start_upstream(&w, ctx, &local_headers, full, keep_body) {
                Ok(u) => upstream = Some(u),
                Err((code, msg)) => {
                    return Ok(local_reply(&w, Some(guard), code, msg.into_bytes(), vec![]));
                }
            }
        }
        if let Some(u) = upstream.as_mut() {
            if !data_paused {
                if let Some(tx) = &u.body_tx {
                    if !pending.is_empty() {
                        let _ = tx.send(Ok(Frame::data(Bytes::from(std::mem::take(&mut pending)))));
                    }
                    if body_done {
                        u.body_tx = None;
                    }
                }
            }
        }
        if (held || data_paused) && !watermark && pending.len() > limit {
            return Ok(local_reply(
                &w,
                Some(guard),
                413,
                b"Payload Too Large".to_vec(),
                vec![],
            ));
        }

        // Flow control (StopIterationAndWatermark): stop reading while over the limit.
        let backpressure = watermark && pending.len() > limit;
        let notified = async {
            match &signals {
                Some(s) => s.notify.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            frame = body.frame(), if !body_done && !backpressure => {
                match frame {
                    None => body_done = true,
                    Some(Err(_)) => {
                        w.shared.counters.client_aborts.fetch_add(1, Relaxed);
                        return Err(Reset("client body error"));
                    }
                    Some(Ok(f)) => {
                        if let Ok(d) = f.into_data() {
                            pending.extend_from_slice(&d);
                        }
                        body_done = body.is_end_stream();
                    }
                }
                if body_done || !pending.is_empty() {
                    if plugin && plugin_sees_data && !(upstream.is_some() && data_paused && pending.is_empty()) {
                        if !call_body(&mut pending, body_done, &mut data_paused, &mut watermark) {
                            if !fail_open {
                                return Ok(vm_failed_reply(&w, Some(guard)));
                            }
                            bypass_plugin!();
                            continue;
                        }
                        // Data Continue while headers are held continues the headers too.
                        if held && !data_paused {
                            held = false;
                        }
                    } else if plugin && !plugin_sees_data {
                        // StopAll: buffered by the host, not shown to the plugin.
                    }
                }
            }
            _ = notified => {}
            tried = async { upstream.as_mut().map(|u| u.fut.as_mut()).unwrap().await }, if upstream.is_some() => {
                return proxy_response(&w, guard, tried.res, tried.guards).await;
            }
        }
    }
}

fn plugin_local_reply(w: &Rc<Worker>, guard: StreamGuard, lr: LocalReply) -> Response<OutBody> {
    local_reply(w, Some(guard), lr.status, lr.body, lr.headers)
}
