//! Response path: local replies, upstream errors (503/504), the response-header phase and
//! a pump task that streams the upstream body through `on_response_body` to the client
//! (chunked/SSE stays streamed). The stream guard rides in the client body, so the plugin
//! context is destroyed when hyper finishes or drops the response; so does the count of a
//! client gone mid-response (`gateway.client_aborts`, [`OutBody::count_abort`]).

use crate::abi::{response_header_status, HeaderStatus};
use crate::shared::Shared;
use crate::stream_data::Pairs;
use crate::upstream::{is_hop_header, BodyError, ChanBody, Guards, Reset, UpstreamResult};
use crate::worker::{StreamGuard, Worker};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::Response;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc::UnboundedSender;

pub struct OutBody {
    inner: ChanBody,
    /// Set by [`OutBody::count_abort`], cleared once the body has ended.
    abort_counter: Option<Arc<Shared>>,
    _guard: Option<StreamGuard>,
}

impl OutBody {
    fn new(inner: ChanBody, guard: Option<StreamGuard>) -> OutBody {
        OutBody {
            inner,
            abort_counter: None,
            _guard: guard,
        }
    }

    /// Counts a client abort should hyper drop this body before its end: hyper drops it
    /// unfinished only when the client's connection failed or closed. Counted here, where the
    /// response is, and not by the task feeding the body: that task may see the stream's end
    /// first (its context destroyed by this body's drop, or its last chunk already queued),
    /// which lost about a third of the closes under 200 concurrent streams. Not for a
    /// response hyper sends without a body (HEAD, 1xx, 204, 304): it never reads one.
    pub fn count_abort(&mut self, shared: Arc<Shared>) {
        // An empty body has ended already: hyper never polls it.
        if !self.inner.is_end_stream() {
            self.abort_counter = Some(shared);
        }
    }
}

impl Body for OutBody {
    type Data = Bytes;
    type Error = BodyError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        // The end, or an upstream reset handed to hyper: the client did not leave.
        let ended = match &polled {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => self.inner.is_end_stream(),
            Poll::Pending => false,
        };
        if ended {
            self.abort_counter = None;
        }
        polled
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for OutBody {
    fn drop(&mut self) {
        if let Some(shared) = self.abort_counter.take() {
            shared.counters.client_aborts.fetch_add(1, Relaxed);
        }
    }
}

fn builder_from_pairs(pairs: &Pairs, default_status: u16) -> hyper::http::response::Builder {
    let status = pairs
        .iter()
        .find(|(k, _)| k == b":status")
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<u16>().ok())
        .unwrap_or(default_status);
    let mut b = Response::builder().status(status);
    for (k, v) in pairs {
        if !k.starts_with(b":")
            && !matches!(&k[..], b"connection" | b"transfer-encoding" | b"keep-alive")
        {
            b = b.header(&k[..], &v[..]);
        }
    }
    b
}

pub fn local_reply(
    w: &Rc<Worker>,
    guard: Option<StreamGuard>,
    status: u16,
    body: Vec<u8>,
    headers: Pairs,
) -> Response<OutBody> {
    w.shared.counters.local_replies.fetch_add(1, Relaxed);
    let headers: Pairs = headers
        .into_iter()
        .filter(|(k, _)| !is_hop_header(k))
        .collect();
    let mut b = builder_from_pairs(&headers, status).status(status);
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case(b"content-type"))
    {
        b = b.header("content-type", "text/plain");
    }
    let inner = ChanBody::full(Bytes::from(body));
    b.body(OutBody::new(inner, guard))
        .unwrap_or_else(|_| Response::new(OutBody::new(ChanBody::full(Bytes::new()), None)))
}

/// The router's own answer to an upstream that failed before its response (504 timeout, 503
/// connect failure or reset). Envoy sends it through the encoder filters, the plugin's among
/// them: the plugin sees its headers and body as a response's (its failure memory learns the
/// 5xx, docs/redis-data-model.md §14); what the plugin does to them is not applied here.
fn upstream_error_reply(
    w: &Rc<Worker>,
    guard: StreamGuard,
    status: u16,
    body: Vec<u8>,
) -> Response<OutBody> {
    let ctx = guard.ctx;
    let live = w.has_plugin()
        && ctx != 0
        && !w
            .with_stream(ctx, |s| s.signals.vm_failed())
            .unwrap_or(true);
    if live {
        let pairs: Pairs = vec![
            (b":status".to_vec(), status.to_string().into_bytes()),
            (b"content-type".to_vec(), b"text/plain".to_vec()),
            (
                b"content-length".to_vec(),
                body.len().to_string().into_bytes(),
            ),
        ];
        let n = pairs.len();
        w.with_stream(ctx, |s| s.resp_headers = pairs);
        let wants_body = matches!(
            w.with_vm(|vm| vm.on_response_headers(ctx, n, false)),
            Some(Ok(_))
        );
        if wants_body {
            let mut buf = body.clone();
            let _ = body_call(w, ctx, &mut buf, true);
        }
    }
    local_reply(w, Some(guard), status, body, vec![])
}

/// FAIL_CLOSED on a dead VM before the response started: Envoy's 503 `wasm_fail_stream`.
fn vm_failed_reply(w: &Rc<Worker>, guard: StreamGuard) -> Response<OutBody> {
    local_reply(w, Some(guard), 503, b"wasm vm failed".to_vec(), vec![])
}

pub async fn proxy_response(
    w: &Rc<Worker>,
    guard: StreamGuard,
    res: UpstreamResult,
    guards: Option<Guards>,
) -> Result<Response<OutBody>, Reset> {
    let resp = match res {
        Err(_) => {
            let msg = b"upstream request timeout".to_vec();
            return Ok(upstream_error_reply(w, guard, 504, msg));
        }
        Ok(Err(_)) => {
            w.shared.counters.upstream_5xx_local.fetch_add(1, Relaxed);
            let msg = b"upstream connect error or disconnect/reset before headers".to_vec();
            return Ok(upstream_error_reply(w, guard, 503, msg));
        }
        Ok(Ok(r)) => r,
    };
    let ctx = guard.ctx;
    let (parts, rbody) = resp.into_parts();
    let mut pairs: Pairs = vec![(
        b":status".to_vec(),
        parts.status.as_str().as_bytes().to_vec(),
    )];
    for (k, v) in parts.headers.iter() {
        pairs.push((k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()));
    }
    // Context 0: the request went on without the plugin (FAIL_OPEN on a dead VM).
    let mut plugin = w.has_plugin() && ctx != 0;
    let fail_open = w.fail_open();
    let signals = w.with_stream(ctx, |s| s.signals.clone());
    let dead = || signals.as_ref().is_some_and(|s| s.vm_failed());
    if plugin && dead() {
        if !fail_open {
            return Ok(vm_failed_reply(w, guard));
        }
        plugin = false;
    }
    if plugin {
        let n = pairs.len();
        w.with_stream(ctx, |s| s.resp_headers = pairs.clone());
        let eos = rbody.is_end_stream();
        let st = match w.with_vm(|vm| vm.on_response_headers(ctx, n, eos)) {
            Some(Ok(ret)) => response_header_status(ret),
            _ if fail_open => {
                plugin = false;
                HeaderStatus::Continue
            }
            _ => return Ok(vm_failed_reply(w, guard)),
        };
        loop {
            if dead() {
                if !fail_open {
                    return Ok(vm_failed_reply(w, guard));
                }
                plugin = false;
                break;
            }
            let sig = w.with_stream(ctx, |s| s.signals.take()).unwrap_or_default();
            if let Some(lr) = sig.local_reply {
                return Ok(local_reply(w, Some(guard), lr.status, lr.body, lr.headers));
            }
            if sig.close {
                return Err(Reset("closed by plugin"));
            }
            if matches!(
                st,
                HeaderStatus::Continue | HeaderStatus::ContinueAndEndStream
            ) || sig.resume_response
            {
                break;
            }
            match &signals {
                Some(s) => s.notify.notified().await,
                None => break,
            }
        }
        pairs = w
            .with_stream(ctx, |s| s.resp_headers.clone())
            .unwrap_or(pairs);
    }
    let (tx, inner) = ChanBody::channel();
    let out = builder_from_pairs(&pairs, 200)
        .body(OutBody::new(inner, Some(guard)))
        .map_err(|_| Reset("bad response headers from plugin"))?;
    tokio::task::spawn_local(pump(w.clone(), ctx, plugin, rbody, tx, guards));
    Ok(out)
}

type Tx = UnboundedSender<Result<Frame<Bytes>, BodyError>>;

/// Run on_response_body for what is buffered; `None` if the stream is gone or the VM trapped
/// (the buffer is kept when the stream still is there, for FAIL_OPEN).
fn body_call(w: &Worker, ctx: u32, buf: &mut Vec<u8>, eos: bool) -> Option<bool> {
    let data = std::mem::take(buf);
    let len = data.len();
    w.with_stream(ctx, |s| s.resp_body = data)?;
    let r = w.with_vm(|vm| vm.on_response_body(ctx, len, eos));
    *buf = w.with_stream(ctx, |s| std::mem::take(&mut s.resp_body))?;
    match r {
        Some(Ok(ret)) => Some(ret != 0),
        _ => None,
    }
}

/// The stream's VM died: FAIL_OPEN goes on without the plugin, FAIL_CLOSED ends the stream
/// (its headers are out, so Envoy's local reply becomes a reset).
fn vm_died(w: &Worker, ctx: u32) -> bool {
    w.with_stream(ctx, |s| s.signals.vm_failed())
        .unwrap_or(true)
}

async fn pump(
    w: Rc<Worker>,
    ctx: u32,
    mut plugin: bool,
    mut rbody: Incoming,
    tx: Tx,
    _guards: Option<Guards>,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut eos = rbody.is_end_stream();
    let mut trailers = None;
    loop {
        if !eos {
            let frame = tokio::select! {
                f = rbody.frame() => f,
                // The client left (its abort is counted where the body was dropped).
                _ = tx.closed() => return,
            };
            match frame {
                None => eos = true,
                Some(Err(_)) => {
                    let _ = tx.send(Err(Box::new(Reset("upstream reset after headers"))));
                    return;
                }
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => buf.extend_from_slice(&d),
                    Err(f) => trailers = f.into_trailers().ok(),
                },
            }
            eos = eos || rbody.is_end_stream();
            if !eos && buf.is_empty() {
                continue;
            }
        }
        if plugin {
            match body_call(&w, ctx, &mut buf, eos) {
                Some(true) if !eos => continue,
                Some(true) => {
                    // Held at end of stream: the plugin must continue_stream(Response).
                    w.with_stream(ctx, |s| s.resp_body = std::mem::take(&mut buf));
                    if !wait_resume(&w, ctx, &tx).await {
                        return;
                    }
                    buf = w
                        .with_stream(ctx, |s| std::mem::take(&mut s.resp_body))
                        .unwrap_or_default();
                }
                Some(false) => {}
                None if w.fail_open() && vm_died(&w, ctx) => plugin = false,
                None => return,
            }
        }
        if !buf.is_empty()
            && tx
                .send(Ok(Frame::data(Bytes::from(std::mem::take(&mut buf)))))
                .is_err()
        {
            return;
        }
        if eos {
            if let Some(t) = trailers {
                let _ = tx.send(Ok(Frame::trailers(t)));
            }
            return;
        }
    }
}

/// Body held at end of stream: wait for continue_stream(Response) or the client leaving.
async fn wait_resume(w: &Worker, ctx: u32, tx: &Tx) -> bool {
    let Some(signals) = w.with_stream(ctx, |s| s.signals.clone()) else {
        return false;
    };
    loop {
        if signals.vm_failed() {
            return w.fail_open();
        }
        let resumed = w.with_stream(ctx, |s| {
            std::mem::take(&mut s.signals.flags.borrow_mut().resume_response)
        });
        match resumed {
            Some(true) => return true,
            None => return false,
            Some(false) => {}
        }
        tokio::select! {
            _ = signals.notify.notified() => {}
            _ = tx.closed() => return false,
        }
    }
}
