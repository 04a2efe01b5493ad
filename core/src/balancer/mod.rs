//! The per-VM dispatcher (docs/architecture.md "A request's path"). It keeps every live
//! [`request::Request`] by HTTP context id, feeds each host callback and Redis reply to that
//! request's state machine as an [`request::Event`], and performs the [`request::Effect`]s it
//! returns: run the route's policy, send a pick, publish the choice, reply, release. Redis
//! replies arrive on the root context, so a reply whose stream already ended finds its pick
//! among the orphans and is undone there.

mod body_flow;
mod events;
mod healthy;
mod holding;
mod metrics;
mod orphan;
mod perform;
mod pick;
mod policies;
mod publish;
mod queue;
mod redis_client;
mod rejection;
pub mod request;
mod rng;
mod routes;
mod shared;
mod telemetry;
pub(crate) mod waiters;

pub use queue::WAIT_RANK;
pub use redis_client::CallStatus;

use crate::config::PluginConfig;
use crate::host::{Host, LogLevel};
use crate::id_map::IdMap;
use perform::Performer;
use redis_client::{Answered, PickAnswer};
use request::{Effect, Event, Request};
use routes::Routes;
use std::collections::HashSet;

/// What a phase callback answers the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    Pause,
    /// Body callbacks only: hold the request and let the host apply flow control to the rest of
    /// the body (StopIterationAndWatermark, docs/higress-abi.md §2) instead of buffering it to
    /// its limit and answering 413. Used while a pick is in flight for a request whose body is
    /// not read (over `maxBodyBytes`): the rest of the body waits at the client for the Redis
    /// round trip.
    PauseWatermark,
}

pub struct Balancer {
    requests: IdMap<Request>,
    /// Every route config (global first) with its policy object.
    routes: Routes,
    /// The VM's services and the effect performer.
    vm: Performer,
    /// Streams whose response's last chunk waits for their Redis writes
    /// ([`Balancer::holds_response`]).
    held_ends: HashSet<u32>,
}

impl Balancer {
    /// Builds the balancer for a validated config: defines the counters, initialises each Redis
    /// target once and preloads the scripts, and starts the scraper if a route scrapes.
    pub fn configure(
        host: &mut dyn Host,
        config: PluginConfig,
        seed: u64,
        log_level: LogLevel,
    ) -> Balancer {
        Balancer {
            vm: Performer::new(host, &config, seed, log_level),
            routes: Routes::build(config),
            requests: IdMap::default(),
            held_ends: HashSet::new(),
        }
    }

    pub fn on_request_headers(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        end_of_stream: bool,
    ) -> Verdict {
        let Some(request) = self.routes.request(host) else {
            return Verdict::Continue; // no rule and no global config: the plugin is off here
        };
        self.requests.insert(ctx, request);
        let withheld = self.vm.body.withheld();
        self.callback(
            host,
            ctx,
            Event::Headers {
                end_of_stream,
                withheld,
            },
        )
    }

    pub fn on_request_body(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        body_size: usize,
        end_of_stream: bool,
    ) -> Verdict {
        self.vm.body.chunk(host, &self.vm.tel, ctx);
        match self.requests.get(&ctx) {
            Some(r) if r.phase().wants_body() => self.vm.body.delivered(),
            // Decided (at the headers, or on an oversized body) and a pick is in flight: a Continue
            // here would release the held headers to the router before Redis answers (Envoy
            // resumes the whole chain), and buffering would answer 413 at the host's limit for a
            // body we decided not to read.
            Some(r) if r.phase().is_held() => return Verdict::PauseWatermark,
            _ => return Verdict::Continue,
        }
        let event = Event::Body {
            size: body_size,
            end_of_stream,
        };
        self.callback(host, ctx, event)
    }

    /// The response headers. Whether stream `ctx`'s body chunks matter next (see
    /// [`Balancer::wants_response_body`]), so the glue asks once.
    pub fn on_response_headers(&mut self, host: &mut dyn Host, ctx: u32) -> bool {
        let Some(req) = self.requests.get(&ctx) else {
            return false;
        };
        // The status of every routed request: its outcome.
        if req.phase().routed() {
            let status = holding::response_status(host);
            self.drive(host, ctx, Event::ResponseHeaders { status });
        }
        if let Some(req) = self.requests.get_mut(&ctx) {
            self.vm.response_headers(host, ctx, req);
            self.vm.open_reader(host, ctx, req);
        }
        self.wants_response_body(ctx)
    }

    /// Whether stream `ctx`'s next response body chunk matters (the first, when its holding
    /// wants it; a response being read for its holding): the glue skips the others without
    /// calling in.
    pub fn wants_response_body(&self, ctx: u32) -> bool {
        self.requests
            .get(&ctx)
            .is_some_and(|r| r.phase().wants_response_body() || r.phase().reading())
            // Its last chunk may have to wait for them (holds_response).
            || self.vm.redis.writing(ctx)
    }

    /// A response body chunk of `size` bytes (the last when `end_of_stream`): the first is
    /// measured and told to the request's holding; a response read for its holding keeps its
    /// tail and may have its usage event taken out (`Performer::read_body`). Whether later
    /// chunks still matter. The last chunk is held while the request's Redis writes are in
    /// flight ([`Balancer::holds_response`]).
    pub fn on_response_body(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        size: usize,
        end_of_stream: bool,
    ) -> bool {
        if self
            .requests
            .get(&ctx)
            .is_some_and(|r| r.phase().wants_response_body())
        {
            let now_us = host.now_us();
            self.drive(host, ctx, Event::ResponseBody { now_us });
        }
        if let Some(req) = self.requests.get_mut(&ctx) {
            self.vm.read_body(host, ctx, req, (size, end_of_stream));
        }
        if end_of_stream && self.vm.redis.writing(ctx) {
            self.held_ends.insert(ctx);
        }
        self.wants_response_body(ctx)
    }

    /// Whether stream `ctx`'s last response chunk is held (the glue answers Pause) until the
    /// Redis writes the request started are answered: a Responses answer's pod
    /// (policies/continuation.rs) is then in Redis before the client has the whole answer, so
    /// a continuation it sends next through any gateway finds it. A stream's writes leave at
    /// its first event and are done long before its end; a JSON answer's id comes with its
    /// end, which then waits one Redis round trip (or the call's timeout).
    pub fn holds_response(&self, ctx: u32) -> bool {
        self.held_ends.contains(&ctx)
    }

    /// Stream end, whatever ended it: give back what was acquired, exactly once.
    pub fn on_done(&mut self, host: &mut dyn Host, ctx: u32) {
        self.vm.body.forget(ctx);
        self.held_ends.remove(&ctx);
        let Some(mut req) = self.requests.remove(&ctx) else {
            return;
        };
        // A response that ended without a last body chunk (reset, trailers) is read as it is.
        req.phase_mut().close_reader();
        if let Some(effect) = req.leave_queue() {
            self.perform(host, ctx, effect);
        }
        // The clock only for a routed request: its outcome's end.
        let now_ms = if req.phase().routed() {
            host.now_ms()
        } else {
            0
        };
        if let Some(effect) = req.finish(now_ms) {
            if matches!(effect, Effect::GiveBack { .. }) {
                self.vm.queue.room_freed();
            }
            self.perform(host, ctx, effect);
        }
        // First bytes that waited for their batch go now (first_bytes.rs).
        self.vm.redis.flush_first_bytes(host, &mut self.vm.tel);
        self.serve_queue(host);
    }

    pub fn on_redis_reply(
        &mut self,
        host: &mut dyn Host,
        token: u32,
        status: CallStatus,
        size: usize,
    ) {
        let answered = self
            .vm
            .redis
            .on_reply(host, &mut self.vm.tel, token, status, size);
        let PickAnswer { ctx, token, reply } = match answered {
            Some(Answered::Pick(a)) => a,
            Some(Answered::Written(ctx)) => {
                let held = self.held_ends.remove(&ctx) && self.requests.get(&ctx).is_some();
                if held && host.set_effective_context(ctx).is_ok() {
                    let _ = host.resume_response();
                }
                return;
            }
            None => return,
        };
        let alive = self
            .requests
            .get(&ctx)
            .is_some_and(|r| r.phase().awaits(token));
        if alive && host.set_effective_context(ctx).is_ok() {
            self.resumed(host, ctx, Event::PickReply(reply));
            self.serve_queue(host);
            return;
        }
        // The stream is gone (or the host lost its context): undo what the pick acquired.
        let pick = match self.vm.orphans.remove(&token) {
            Some(p) => Some(p),
            None => self
                .requests
                .get_mut(&ctx)
                .filter(|r| r.phase().awaits(token))
                .and_then(|r| r.phase_mut().abandon_pick()),
        };
        if let Some(pick) = pick {
            for effect in request::undo(pick, &reply) {
                self.perform(host, ctx, effect);
            }
        }
    }

    /// Root context tick: the metrics scraper, the policies' timed work, then body deadlines
    /// (last: resuming a request makes its stream the effective context, and the scraper's
    /// callouts belong to the root).
    pub fn on_tick(&mut self, host: &mut dyn Host) {
        self.vm.metrics.on_tick(host, &self.vm.tel);
        self.vm.redis.flush_first_bytes(host, &mut self.vm.tel);
        self.routes.tick(host, &mut self.vm.tel, &mut self.vm.redis);
        self.expire_body_waits(host);
        if !self.vm.queue.is_empty() {
            self.expire_queue(host);
            self.vm.queue.tick();
            self.serve_queue(host);
        }
    }

    /// A callout answered (the metrics scraper's).
    pub fn on_http_response(&mut self, host: &mut dyn Host, token: u32, body_size: usize) {
        self.vm
            .metrics
            .on_http_response(host, &self.vm.tel, token, body_size);
    }

    /// A phase callback (headers, body): its verdict follows from where the request ends up.
    fn callback(&mut self, host: &mut dyn Host, ctx: u32, event: Event) -> Verdict {
        self.drive(host, ctx, event);
        match self.requests.get(&ctx) {
            Some(r) if r.phase().is_held() || r.phase().replied() => Verdict::Pause,
            _ => Verdict::Continue,
        }
    }

    /// An asynchronous event for a held request: resume it if the event released it.
    fn resumed(&mut self, host: &mut dyn Host, ctx: u32, event: Event) {
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
    fn perform(&mut self, host: &mut dyn Host, ctx: u32, effect: Effect) -> Option<Event> {
        let req = self.requests.get_mut(&ctx);
        self.vm
            .perform(host, ctx, (req, &mut self.routes.list), effect)
    }

    /// Feeds `event` to the request and performs its effects; an effect that answers with an
    /// event (decide, send, publish) feeds that event in turn.
    fn drive(&mut self, host: &mut dyn Host, ctx: u32, event: Event) {
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
    fn expire_body_waits(&mut self, host: &mut dyn Host) {
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
    fn expire_queue(&mut self, host: &mut dyn Host) {
        for ctx in self.vm.queue.expired(host.now_ms(), &self.requests) {
            if host.set_effective_context(ctx).is_ok() {
                self.resumed(host, ctx, Event::QueueTimeout);
            }
        }
    }

    /// Room may have freed: the queue's heads try again, one acquire per freed room.
    fn serve_queue(&mut self, host: &mut dyn Host) {
        while let Some(ctx) = self.vm.queue.next_head(host, &self.requests) {
            self.resumed(host, ctx, Event::Admit);
        }
    }

    /// How many requests wait or retry in this VM's queue (tests and leak checks).
    pub fn queued(&self) -> usize {
        self.vm.queue.queued()
    }

    /// How many requests and Redis calls this VM is tracking (tests and leak checks).
    pub fn tracked(&self) -> (usize, usize) {
        (self.requests.len(), self.vm.redis.in_flight())
    }
}

#[cfg(test)]
mod body_tests;
#[cfg(test)]
mod clamp_tests;
#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod envoy_failure_tests;
#[cfg(test)]
mod fairness_tests;
#[cfg(test)]
mod latency_tests;
#[cfg(test)]
mod local_prefix_tests;
#[cfg(test)]
mod priority_tests;
#[cfg(test)]
mod queue_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod verify_tests;
