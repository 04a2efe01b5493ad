//! Feeding a request's state machine: a phase callback's event and its verdict, an
//! asynchronous event that may resume the request, the root tick's deadlines and queue
//! retries, and the response headers. Each event's effects are performed (perform.rs) and an
//! effect's answer is fed back as the next event.

use super::holding::{self, Services};
use super::request::{Effect, Event};
use super::{Balancer, Verdict};
use crate::host::{Host, LogLevel};

use crate::stats;

impl Balancer {
    /// A phase callback (headers, body): its verdict follows from where the request ends up.
    pub(super) fn callback(&mut self, host: &mut dyn Host, ctx: u32, event: Event) -> Verdict {
        self.drive(host, ctx, event);
        match self.requests.get(&ctx) {
            Some(r) if r.phase().is_held() || r.phase().replied() => Verdict::Pause,
            _ => Verdict::Continue,
        }
    }

    /// An asynchronous event for a held request: resume it if the event released it.
    pub(super) fn resumed(&mut self, host: &mut dyn Host, ctx: u32, event: Event) {
        self.drive(host, ctx, event);
        let Some(r) = self.requests.get(&ctx) else {
            return;
        };
        if !r.phase().is_held() && !r.phase().replied() {
            if let Err(e) = host.resume_request() {
                self.vm
                    .tel
                    .log(host, LogLevel::Warn, ctx, format_args!("{e}"));
            }
        }
    }

    /// Performs `effect` for request `ctx` (perform.rs).
    pub(super) fn perform(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        effect: Effect,
    ) -> Option<Event> {
        let req = self.requests.get_mut(&ctx);
        self.vm.perform(host, ctx, (req, &mut self.routes), effect)
    }

    /// Feeds `event` to the request and performs its effects; an effect that answers with an
    /// event (decide, send, publish) feeds that event in turn.
    pub(super) fn drive(&mut self, host: &mut dyn Host, ctx: u32, event: Event) {
        let mut next = Some(event);
        while let Some(event) = next.take() {
            let Some(req) = self.requests.get_mut(&ctx) else {
                return;
            };
            for effect in req.handle(event) {
                if let Some(answer) = self.perform(host, ctx, effect) {
                    next = Some(answer);
                }
            }
        }
    }

    /// Root tick: requests held for their body past their deadline, released without it.
    pub(super) fn expire_body_waits(&mut self, host: &mut dyn Host) {
        for ctx in self.vm.body.due(host.now_ms(), &self.requests) {
            // A context the host no longer knows ends with on_done; nothing to resume.
            if host.set_effective_context(ctx).is_err() {
                continue;
            }
            self.resumed(host, ctx, Event::BodyTimeout);
            self.vm.body.released(ctx, host.now_ms());
        }
    }

    /// Root tick: waiting requests past their deadline get the 429 they would have got.
    pub(super) fn expire_queue(&mut self, host: &mut dyn Host) {
        for ctx in self.vm.queue.expired(host.now_ms(), &self.requests) {
            if host.set_effective_context(ctx).is_ok() {
                self.resumed(host, ctx, Event::QueueTimeout);
            }
        }
    }

    /// Room may have freed: the queue's heads try again, one acquire per freed room.
    pub(super) fn serve_queue(&mut self, host: &mut dyn Host) {
        while let Some(ctx) = self.vm.queue.next_head(host, &self.requests) {
            self.resumed(host, ctx, Event::Admit);
        }
    }

    /// The response headers of request `ctx`: cluster_metrics' status, plain Envoy's served-
    /// elsewhere check, the debug header.
    pub(super) fn response_headers(&mut self, host: &mut dyn Host, ctx: u32) {
        let Some(req) = self.requests.get(&ctx) else {
            return;
        };
        // The status of every routed request: its outcome.
        if req.phase().routed() {
            let status = holding::response_status(host);
            self.drive(host, ctx, Event::ResponseHeaders { status });
        }
        // Plain Envoy, least request and sessions: a response from another endpoint than the
        // one counted is Envoy's retry to a fallback, so that pod refused or reset the
        // connection. One property read per such request; the release marks the pod down.
        let served_elsewhere = self
            .requests
            .get(&ctx)
            .and_then(|r| r.phase().watched_endpoint())
            .is_some_and(|chosen| {
                host.property(&["upstream", "address"])
                    .ok()
                    .flatten()
                    .is_some_and(|served| served != chosen.as_bytes())
            });
        if let Some(req) = self.requests.get_mut(&ctx).filter(|_| served_elsewhere) {
            let counter = stats::pod_down(req.phase().describe().1);
            req.phase_mut().mark_failed();
            self.vm.tel.inc(host, counter);
        }
        let Some(req) = self.requests.get(&ctx) else {
            return;
        };
        if let Some(name) = &req.config.common.debug_header {
            let (endpoint, reason) = req.phase().describe();
            let mut value = format!(
                "endpoint={}; reason={}",
                endpoint.unwrap_or("-"),
                reason.name()
            );
            if let Some(ms) = req.queued_ms {
                value.push_str(&format!("; queued_ms={ms}"));
            }
            let _ = host.add_response_header(name, &value);
        }
    }

    /// The response headers told the request's holding: a body reader, if it asks for one.
    pub(super) fn open_reader(&mut self, host: &mut dyn Host, ctx: u32) {
        let Some(req) = self.requests.get_mut(&ctx) else {
            return;
        };
        let Some((held, outcome)) = req.phase_mut().holding_mut() else {
            return;
        };
        let mut svc = Services {
            host,
            tel: &mut self.vm.tel,
            redis: &mut self.vm.redis,
            ctx,
        };
        if let Some(read) = held.read_response(&mut svc, outcome) {
            req.phase_mut().read_response(read);
        }
    }

    /// A response body chunk of `size` bytes of a response read for its holding (the last
    /// when `end`): its tail kept, the usage event taken out if asked. A chunk that cannot be
    /// read is never written: the reader is given up (an event held back, if any, is lost; the
    /// rest of the stream passes as it is).
    pub(super) fn read_body(&mut self, host: &mut dyn Host, ctx: u32, size: usize, end: bool) {
        let Some(req) = self.requests.get_mut(&ctx).filter(|r| r.phase().reading()) else {
            return;
        };
        let chunk = match host.response_body(0, size) {
            Ok(c) => c,
            Err(err) => {
                req.phase_mut().drop_reader();
                let msg = format_args!("{err}: response not read");
                self.vm.tel.log(host, LogLevel::Warn, ctx, msg);
                return;
            }
        };
        if let Some(out) = req.phase_mut().read_chunk(&chunk, end) {
            if let Err(err) = host.set_response_body(&out) {
                self.vm
                    .tel
                    .log(host, LogLevel::Warn, ctx, format_args!("{err}"));
            }
        }
    }
}
