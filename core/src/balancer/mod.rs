//! The per-VM dispatcher (docs/architecture.md "A request's path"). It keeps every live
//! [`request::Request`] by HTTP context id, feeds each host callback and Redis reply to that
//! request's state machine as an [`request::Event`], and performs the [`request::Effect`]s it
//! returns: run the route's policy, send a pick, publish the choice, reply, release. Redis
//! replies arrive on the root context, so a reply whose stream already ended finds its pick
//! among the orphans and is undone there.

mod events;
mod held;
mod pick;
mod policies;
mod publish;
mod redis_client;
pub mod request;
mod rng;
mod service_stats;
mod shared;
mod telemetry;
pub(crate) mod waiters;

pub use redis_client::CallStatus;

use crate::config::{PluginConfig, RequestKeys};
use crate::host::{self, Host, LogLevel};
use crate::id_map::IdMap;
use crate::redis::inflight::InflightKeys;
use crate::redis::scripts::Keys;
use pick::Pick;
use policies::{Env, Input, Policies};
use redis_client::{LeaseKeys, PickAnswer, RedisClient};
use request::{Effect, Event, Leave, Request, Ticket, WaitAnswer, Waiter};
use rng::VmRng;
use std::collections::BTreeSet;
use std::rc::Rc;
use telemetry::Telemetry;

/// Plain Envoy: whether this VM has seen the host deliver the body of a request it holds
/// (docs/higress-abi.md §10). Without the wasm filter's `allow_on_headers_stop_iteration`,
/// Envoy turns a headers Pause into "stop everything": the body is buffered and delivered only
/// after the request is resumed, at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyFlow {
    Unknown,
    /// A held request received a body chunk: the flag is set.
    Delivered,
    /// A request released by the body deadline got its body right at the release: Envoy held
    /// it back. Routes that use the body decide at the headers from now on (no hold).
    Withheld,
}

/// A body chunk arriving this soon after the deadline released its request was held back by
/// the host, not late from the client: Envoy delivers the buffered body in the same event-loop
/// turn as the resume (measured on Envoy 1.40: README "Plain Envoy").
const WITHHELD_GAP_MS: u64 = 50;

/// The root tick that checks body deadlines: a tenth of the shortest wait, within 10-100 ms.
fn hold_tick_ms(config: &PluginConfig) -> u32 {
    config
        .all()
        .filter(|c| !c.decide_at_headers && c.common.max_body_wait_ms > 0)
        .map(|c| (c.common.max_body_wait_ms / 10).clamp(10, 100) as u32)
        .min()
        .unwrap_or(0)
}

/// The root tick that retries the waiting queue's head and ends waits past their deadline:
/// a twentieth of the shortest `queueTimeoutMs`, within 10-50 ms (a waiter learns of room
/// freed on another gateway at the next tick).
fn queue_tick_ms(config: &PluginConfig) -> u32 {
    config
        .all()
        .filter_map(|c| c.common.queue)
        .map(|q| (q.timeout_ms / 20).clamp(10, 50) as u32)
        .min()
        .unwrap_or(0)
}

/// A score unit per class rank in the Redis wait set (docs/redis-data-model.md §12; the
/// scripts' `WAIT_RANK`, 2^42 ms): `rank * WAIT_RANK + expiry`.
pub const WAIT_RANK: u64 = 1 << 42;

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
    config: PluginConfig,
    /// The headers a client must never send us (`publish::destination_headers`).
    destination_headers: Vec<String>,
    requests: IdMap<Request>,
    /// Whether a request's `:authority` is read: only a `_match_domain_` rule needs it.
    matches_domains: bool,
    /// Whether a request's `cluster_name` is read before its config is chosen: only a
    /// `_match_service_` rule needs it then (an endpoint policy's keys need it after).
    matches_services: bool,
    /// Picks whose stream ended before Redis answered, by token: undone when the reply comes.
    orphans: IdMap<Box<Pick>>,
    redis: RedisClient,
    policies: Policies,
    tel: Telemetry,
    rng: VmRng,
    body_flow: BodyFlow,
    /// Requests the body deadline released while `body_flow` was unknown: when each was
    /// released (ms), to tell a withheld body from a late one.
    released: IdMap<u64>,
    /// Waiting queue: the requests waiting now (not retrying), highest class then arrival first.
    waiting: BTreeSet<(usize, u64, u32)>,
    /// Requests holding a queue ticket (waiting or retrying), against `maxQueued`.
    queued: usize,
    /// Arrival order of the queue.
    queue_seq: u64,
    /// Room may have freed this many times since the queue was last served.
    kicks: usize,
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
        let destination_headers = publish::destination_headers(&config);
        let mut b = Balancer {
            policies: Policies::new(&config, seed),
            tel: Telemetry::new(host, log_level),
            matches_domains: config.matches_domains(),
            matches_services: config.matches_services(),
            destination_headers,
            config,
            requests: IdMap::default(),
            orphans: IdMap::default(),
            redis: RedisClient::default(),
            rng: VmRng::new(seed),
            body_flow: BodyFlow::Unknown,
            released: IdMap::default(),
            waiting: BTreeSet::new(),
            queued: 0,
            queue_seq: 0,
            kicks: 0,
        };
        // Every route with a Redis target: the endpoint policies', and cluster_metrics' global
        // in-flight count.
        let redis_routes = b.config.all().filter(|c| c.redis.is_some());
        b.redis.preload(host, &mut b.tel, redis_routes);
        // One tick per root context: the scraper's and the body deadlines' share it.
        let tick = [
            b.policies.tick_ms(),
            hold_tick_ms(&b.config),
            queue_tick_ms(&b.config),
        ]
        .into_iter()
        .filter(|&t| t > 0)
        .min();
        if let Some(ms) = tick {
            if let Err(e) = host.set_tick_period(ms) {
                b.tel.log(
                    host,
                    LogLevel::Warn,
                    0,
                    format_args!("{e}: no scraping, no body deadline, no queue retries"),
                );
            }
        }
        b
    }

    pub fn on_request_headers(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        end_of_stream: bool,
    ) -> Verdict {
        // Host calls a rule-less cluster policy would only throw away. Each name is read only
        // where something needs it: `:authority` for a domain rule, `cluster_name` for a
        // service rule or, below, an endpoint policy's keys.
        let names = self.config.needs_request_names();
        let (route, mut cluster, authority) = if names {
            (
                host::text_property(host, "route_name"),
                self.matches_services
                    .then(|| host::text_property(host, "cluster_name"))
                    .flatten(),
                self.matches_domains
                    .then(|| host.request_header(":authority").ok().flatten())
                    .flatten(),
            )
        } else {
            (None, None, None)
        };
        let request_keys = RequestKeys {
            route: route.as_deref(),
            cluster: cluster.as_deref(),
            authority: authority.as_deref(),
        };
        let config = self.config.select(&request_keys).cloned();
        // A client must never steer override_host or a cluster_header route: its copies of
        // the destination headers go.
        publish::strip_destination_headers(host, &self.destination_headers);
        let Some(config) = config else {
            return Verdict::Continue; // no rule and no global config: the plugin is off here
        };
        if names && !self.matches_services && !config.policy.is_cluster() {
            cluster = host::text_property(host, "cluster_name");
        }
        let keys = match (&route, &cluster) {
            (Some(r), Some(c)) if !r.is_empty() && !c.is_empty() => {
                Some(Rc::new(Keys::new(&config.common.key_prefix, r, c)))
            }
            _ => None,
        };
        let inflight = config
            .policy
            .global_inflight()
            .zip(route.as_deref().filter(|r| !r.is_empty()))
            .map(|(g, r)| Rc::new(InflightKeys::new(&g.key_prefix, r)));
        let mut request = Request::new(config, keys);
        request.inflight = inflight;
        if request.config.common.max_body_wait_ms > 0 {
            // Only a route with a body deadline (plain Envoy) needs the clock here.
            request.since_ms = host.now_ms();
        }
        self.requests.insert(ctx, request);
        let withheld = self.body_flow == BodyFlow::Withheld;
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
        if let Some(at) = self.released.remove(&ctx) {
            self.learn_withheld(host, ctx, at);
        }
        match self.requests.get(&ctx) {
            Some(r) if r.wants_body() => {
                if self.body_flow == BodyFlow::Unknown {
                    self.body_flow = BodyFlow::Delivered;
                    self.released.clear();
                }
            }
            // Decided (at the headers, or on an oversized body) and a pick is in flight: a Continue
            // here would release the held headers to the router before Redis answers (Envoy
            // resumes the whole chain), and buffering would answer 413 at the host's limit for a
            // body we decided not to read.
            Some(r) if r.is_held() => return Verdict::PauseWatermark,
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
        self.response_headers(host, ctx);
        self.wants_response_body(ctx)
    }

    fn response_headers(&mut self, host: &mut dyn Host, ctx: u32) {
        let Some(req) = self.requests.get(&ctx) else {
            return;
        };
        // Only cluster_metrics' statistics read the status: a host call saved elsewhere.
        if req.wants_status() {
            let status = held::response_status(host);
            self.drive(host, ctx, Event::ResponseHeaders { status });
        }
        // Plain Envoy, least request and sessions: a response from another endpoint than the
        // one counted is Envoy's retry to a fallback, so that pod refused or reset the
        // connection. One property read per such request; the release marks the pod down.
        let served_elsewhere = self
            .requests
            .get(&ctx)
            .and_then(Request::watched_endpoint)
            .is_some_and(|chosen| {
                host.property(&["upstream", "address"])
                    .ok()
                    .flatten()
                    .is_some_and(|served| served != chosen.as_bytes())
            });
        if let Some(req) = self.requests.get_mut(&ctx).filter(|_| served_elsewhere) {
            let sticky = matches!(
                req.describe().1,
                crate::reason::Reason::Session | crate::reason::Reason::SessionRebound
            );
            req.mark_failed();
            let counter = if sticky {
                crate::stats::Counter::SessionPodDown
            } else {
                crate::stats::Counter::GlrPodDown
            };
            self.tel.inc(host, counter);
        }
        let Some(req) = self.requests.get(&ctx) else {
            return;
        };
        if let Some(name) = &req.config.common.debug_header {
            let (endpoint, reason) = req.describe();
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

    /// Whether stream `ctx`'s next response body chunk matters (cluster_metrics before its
    /// first byte): the glue skips the others without calling in.
    pub fn wants_response_body(&self, ctx: u32) -> bool {
        self.requests
            .get(&ctx)
            .is_some_and(Request::wants_response_body)
    }

    /// A response body chunk: cluster_metrics records its time to the first one. Never holds
    /// the response (the glue answers Continue). Whether later chunks still matter.
    pub fn on_response_body(&mut self, host: &mut dyn Host, ctx: u32) -> bool {
        if self.wants_response_body(ctx) {
            self.drive(host, ctx, Event::ResponseBody);
        }
        self.wants_response_body(ctx)
    }

    /// Stream end, whatever ended it: give back what was acquired, exactly once.
    pub fn on_done(&mut self, host: &mut dyn Host, ctx: u32) {
        self.released.remove(&ctx);
        let Some(mut req) = self.requests.remove(&ctx) else {
            return;
        };
        if let Some(effect) = req.leave_queue() {
            self.perform(host, ctx, effect);
        }
        if let Some(effect) = req.finish() {
            if matches!(
                effect,
                Effect::Release(_) | Effect::ReleaseLocal(_) | Effect::ServiceDone { .. }
            ) {
                self.room_freed();
            }
            self.perform(host, ctx, effect);
        }
        self.serve_queue(host);
    }

    pub fn on_redis_reply(
        &mut self,
        host: &mut dyn Host,
        token: u32,
        status: CallStatus,
        size: usize,
    ) {
        let Some(PickAnswer { ctx, token, reply }) =
            self.redis
                .on_reply(host, &mut self.tel, token, status, size)
        else {
            return;
        };
        let alive = self.requests.get(&ctx).is_some_and(|r| r.awaits(token));
        if alive && host.set_effective_context(ctx).is_ok() {
            self.resumed(host, ctx, Event::PickReply(reply));
            self.serve_queue(host);
            return;
        }
        // The stream is gone (or the host lost its context): undo what the pick acquired.
        let pick = match self.orphans.remove(&token) {
            Some(p) => Some(p),
            None => self
                .requests
                .get_mut(&ctx)
                .filter(|r| r.awaits(token))
                .and_then(Request::abandon_pick),
        };
        if let Some(pick) = pick {
            for effect in request::undo(pick, &reply) {
                self.perform(host, ctx, effect);
            }
        }
    }

    /// Root context tick: the metrics scraper, then body deadlines (last: resuming a request
    /// makes its stream the effective context, and the scraper's callouts belong to the root).
    pub fn on_tick(&mut self, host: &mut dyn Host) {
        self.policies.on_tick(host, &mut self.tel);
        self.expire_body_waits(host);
        if !self.waiting.is_empty() {
            self.expire_queue(host);
            // Room freed on another gateway (or a pod came back) is not announced: the head
            // tries once per tick, never each waiting request.
            self.kicks = self.kicks.max(1);
            self.serve_queue(host);
        }
    }

    /// A count given back (a lease, a per-proxy count, a service's): room for the queue's
    /// head, served by the caller's next `serve_queue`.
    fn room_freed(&mut self) {
        if !self.waiting.is_empty() {
            self.kicks += 1;
        }
    }

    /// Waiting requests past their deadline get the 429 they would have got at once.
    fn expire_queue(&mut self, host: &mut dyn Host) {
        let now = host.now_ms();
        let due: Vec<(usize, u64, u32)> = self
            .waiting
            .iter()
            .filter(|(_, _, ctx)| {
                self.requests
                    .get(ctx)
                    .and_then(Request::ticket)
                    .is_none_or(|t| now >= t.deadline_ms)
            })
            .copied()
            .collect();
        for entry in due {
            self.waiting.remove(&entry);
            let ctx = entry.2;
            if host.set_effective_context(ctx).is_ok() {
                self.resumed(host, ctx, Event::QueueTimeout);
            }
        }
    }

    /// Room may have freed (`kicks` times): the queue's head tries again, highest class first,
    /// then arrival order; one acquire per kick. A head that finds no room waits again.
    fn serve_queue(&mut self, host: &mut dyn Host) {
        while self.kicks > 0 {
            self.kicks -= 1;
            let Some((rank, seq, ctx)) = self.waiting.pop_first() else {
                self.kicks = 0;
                return;
            };
            if !self.requests.get(&ctx).is_some_and(Request::is_waiting) {
                self.kicks += 1; // a stale entry: the kick goes to the next one
                continue;
            }
            if host.set_effective_context(ctx).is_err() {
                // The host lost the stream: on_done removes it; keep its place until then.
                self.waiting.insert((rank, seq, ctx));
                continue;
            }
            self.resumed(host, ctx, Event::Admit);
        }
    }

    /// Plain Envoy: requests held for their body past `maxBodyWaitMs` (or any held request,
    /// once the host is known to withhold the body) are balanced without it and resumed, so
    /// a filter deployed without `allow_on_headers_stop_iteration` never hangs a request.
    fn expire_body_waits(&mut self, host: &mut dyn Host) {
        let now = host.now_ms();
        let withheld = self.body_flow == BodyFlow::Withheld;
        let mut due: Vec<u32> = self
            .requests
            .iter()
            .filter(|(_, r)| r.body_deadline().is_some_and(|d| withheld || now >= d))
            .map(|(ctx, _)| ctx)
            .collect();
        due.sort_unstable();
        for ctx in due {
            // A context the host no longer knows ends with on_done; nothing to resume.
            if host.set_effective_context(ctx).is_err() {
                continue;
            }
            self.resumed(host, ctx, Event::BodyTimeout);
            if self.body_flow == BodyFlow::Unknown {
                self.released.insert(ctx, host.now_ms());
            }
        }
    }

    /// The first body chunk of a request the deadline released: right at the release means
    /// the host held it back (the filter lacks `allow_on_headers_stop_iteration`).
    fn learn_withheld(&mut self, host: &mut dyn Host, ctx: u32, released_ms: u64) {
        let gap = host.now_ms().saturating_sub(released_ms);
        self.tel.log(
            host,
            LogLevel::Debug,
            ctx,
            format_args!("first body chunk {gap} ms after the body deadline released it"),
        );
        if self.body_flow != BodyFlow::Unknown || gap > WITHHELD_GAP_MS {
            return;
        }
        self.body_flow = BodyFlow::Withheld;
        self.released.clear();
        self.tel
            .inc(host, crate::stats::Counter::BodyWithheldDetected);
        self.tel.log(
            host,
            LogLevel::Warn,
            ctx,
            format_args!(
                "Envoy delivers the request body only after the filter releases the request: \
                 the wasm filter's config lacks `allow_on_headers_stop_iteration: true`. \
                 This worker now balances at the request headers, without the body \
                 (counted as ai_lb.fallback.body_withheld)"
            ),
        );
    }

    /// A callout answered (the metrics scraper's).
    pub fn on_http_response(&mut self, host: &mut dyn Host, token: u32, body_size: usize) {
        self.policies
            .on_http_response(host, &mut self.tel, token, body_size);
    }

    /// How many requests and Redis calls this VM is tracking (tests and leak checks).
    pub fn tracked(&self) -> (usize, usize) {
        (self.requests.len(), self.redis.in_flight())
    }

    /// A phase callback (headers, body): its verdict follows from where the request ends up.
    fn callback(&mut self, host: &mut dyn Host, ctx: u32, event: Event) -> Verdict {
        self.drive(host, ctx, event);
        match self.requests.get(&ctx) {
            Some(r) if r.is_held() || r.replied() => Verdict::Pause,
            _ => Verdict::Continue,
        }
    }

    /// An asynchronous event for a held request: resume it if the event released it.
    fn resumed(&mut self, host: &mut dyn Host, ctx: u32, event: Event) {
        self.drive(host, ctx, event);
        let Some(r) = self.requests.get(&ctx) else {
            return;
        };
        if !r.is_held() && !r.replied() {
            if let Err(e) = host.resume_request() {
                self.tel.log(host, LogLevel::Warn, ctx, format_args!("{e}"));
            }
        }
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

    fn perform(&mut self, host: &mut dyn Host, ctx: u32, effect: Effect) -> Option<Event> {
        match effect {
            Effect::Decide { read_body } => {
                Some(Event::Decided(self.decide(host, ctx, read_body, None)?))
            }
            Effect::Redecide(read) => Some(Event::Decided(self.decide(
                host,
                ctx,
                false,
                Some(&read),
            )?)),
            Effect::Retry(mut pick) => {
                if let Pick::Endpoint(p) = &mut *pick {
                    let synced = self.redis.synced(&p.keys.namespace).cloned();
                    if let Err(cause) = p.refresh(host, synced.as_ref()) {
                        return Some(Event::Sent {
                            result: Err(cause),
                            pick,
                        });
                    }
                }
                self.perform(host, ctx, Effect::Send(pick))
            }
            Effect::Wait(rejection) => {
                let answer = self.wait(host, ctx);
                Some(Event::Waited { rejection, answer })
            }
            Effect::LeaveQueue { ticket, why } => {
                self.leave_queue(host, ctx, ticket, why);
                None
            }
            Effect::Send(pick) => {
                let random = (self.rng.next_u64() >> 32) as u32;
                let result = self
                    .redis
                    .send_pick(host, &mut self.tel, ctx, &pick, random);
                Some(Event::Sent { result, pick })
            }
            Effect::Publish {
                endpoint,
                fallbacks,
            } => {
                let config = self.requests.get(&ctx)?.config.clone();
                let result = publish::publish(host, &config, &endpoint, &fallbacks);
                match &result {
                    Err(e) => self.tel.log(host, LogLevel::Warn, ctx, format_args!("{e}")),
                    Ok(()) if config.common.detail_log && self.tel.enabled(LogLevel::Debug) => {
                        let (_, reason) = self.requests.get(&ctx)?.describe();
                        self.tel.log(
                            host,
                            LogLevel::Debug,
                            ctx,
                            format_args!("routed to {endpoint} ({})", reason.name()),
                        );
                    }
                    Ok(()) => {}
                }
                Some(Event::Published(
                    result.map_err(|_| crate::reason::Cause::OverrideFailed),
                ))
            }
            Effect::Reply(r) => {
                let retry;
                let mut headers: Vec<(&str, &str)> = Vec::new();
                if r.retry_after_s > 0 {
                    retry = r.retry_after_s.to_string();
                    headers.push(("retry-after", retry.as_str()));
                }
                let _ = host.send_local_response(r.status, r.details, r.body, &headers);
                None
            }
            Effect::Release(lease) => {
                let keys = LeaseKeys::Endpoint(lease.keys);
                let members = vec![lease.member];
                self.redis
                    .release(host, &mut self.tel, &lease.config, keys, members);
                None
            }
            Effect::ReleaseService(lease) => {
                let keys = LeaseKeys::Service(lease.keys);
                let members = vec![lease.member];
                self.redis
                    .release(host, &mut self.tel, &lease.config, keys, members);
                None
            }
            Effect::ReleaseAll(pick) => {
                let (keys, members) = match &*pick {
                    Pick::Endpoint(p) => (LeaseKeys::Endpoint(p.keys.clone()), p.every_lease()),
                    Pick::Service(p) => (LeaseKeys::Service(p.keys.clone()), p.every_member()),
                    Pick::Session(_) => return None, // a session binding holds no count
                };
                self.redis
                    .release(host, &mut self.tel, pick.config(), keys, members);
                None
            }
            Effect::ServiceStart(lease) => {
                policies::cluster_metrics::start(host, &self.tel, &lease);
                None
            }
            Effect::InflightLocal(cause) => {
                self.tel.inflight_local(host, ctx, cause);
                None
            }
            Effect::SentTo(endpoint) => {
                policies::endpoint_metrics::count_sent(host, &endpoint);
                None
            }
            Effect::ReleaseLocal(lease) => {
                policies::local_least_request::release(host, &self.tel, lease);
                None
            }
            Effect::FirstByte { lease, success } => {
                policies::cluster_metrics::first_byte(host, &self.tel, &lease, success);
                None
            }
            Effect::ServiceDone { lease, outcome } => {
                if let Some(global) = &lease.global {
                    let keys = LeaseKeys::Service(global.keys.clone());
                    let members = vec![global.member.clone()];
                    self.redis
                        .release(host, &mut self.tel, &global.config, keys, members);
                }
                policies::cluster_metrics::done(host, &self.tel, lease, outcome);
                None
            }
            Effect::Orphan { token, pick } => {
                self.tel.log(
                    host,
                    LogLevel::Debug,
                    ctx,
                    format_args!("stream ended before pick {token} returned"),
                );
                self.orphans.insert(token, pick);
                None
            }
            Effect::Count(counter) => {
                self.tel.inc(host, counter);
                None
            }
            Effect::NoBody(cause) => {
                let wait = self
                    .requests
                    .get(&ctx)
                    .map_or(0, |r| r.config.common.max_body_wait_ms);
                self.tel.no_body(host, ctx, cause, wait);
                None
            }
            Effect::FellBack { cause, denied } => {
                self.tel.fell_back(host, ctx, cause, denied);
                None
            }
            Effect::Synced {
                namespace,
                fingerprint,
            } => {
                self.redis.set_synced(namespace, fingerprint);
                None
            }
            Effect::Unsynced { namespace } => {
                self.redis.unsync(&namespace);
                None
            }
        }
    }

    /// Queues request `ctx` (refused for want of room), or queues it again after a retry
    /// found no room, or says why it cannot wait.
    fn wait(&mut self, host: &mut dyn Host, ctx: u32) -> WaitAnswer {
        let now = host.now_ms();
        let Some(req) = self.requests.get(&ctx) else {
            return WaitAnswer::Full;
        };
        let Some(queue) = req.config.common.queue else {
            return WaitAnswer::Full;
        };
        if let Some(t) = req.ticket() {
            if now >= t.deadline_ms {
                return WaitAnswer::Timeout;
            }
            self.waiting.insert((t.rank, t.seq, ctx));
            return WaitAnswer::Wait(t.clone());
        }
        if self.queued as u64 >= queue.max_queued {
            return WaitAnswer::Full;
        }
        // The class as the policy read it (not counted again when unknown).
        let rank = req.config.common.priority.as_ref().map_or(0, |p| {
            let value = host.request_header(&p.header).ok().flatten();
            p.class_of(value.as_deref()).rank
        });
        let deadline_ms = now.saturating_add(queue.timeout_ms);
        // Only classes order waiters across gateways and workers: without them no entry.
        let id = self.rng.next_u64();
        let waiter = match (&req.keys, &req.config.redis, &req.config.common.priority) {
            (_, _, None) => None,
            (Some(keys), Some(_), Some(_)) => Some(Rc::new(Waiter::Redis {
                config: req.config.clone(),
                keys: keys.clone(),
                member: format!("{id:016x}"),
            })),
            (_, None, Some(_)) if !req.config.endpoints.is_empty() => {
                Some(Rc::new(Waiter::Shared {
                    key: waiters::key(&req.config.endpoints),
                    id,
                }))
            }
            _ => None,
        };
        match waiter.as_deref() {
            Some(w @ Waiter::Redis { .. }) => {
                let score = (rank as u64).saturating_mul(WAIT_RANK) + deadline_ms % WAIT_RANK;
                self.redis.waiter(host, &mut self.tel, w, Some(score));
            }
            Some(Waiter::Shared { key, id }) => {
                // Unwritten, this waiter only loses its class's precedence on other workers.
                let _ = waiters::set(host, key, *id, Some(rank), deadline_ms);
            }
            None => {}
        }
        self.queue_seq += 1;
        self.queued += 1;
        self.tel.inc(host, crate::stats::Counter::QueueQueued);
        let ticket = Ticket {
            rank,
            seq: self.queue_seq,
            since_ms: now,
            deadline_ms,
            waiter,
        };
        self.waiting.insert((rank, ticket.seq, ctx));
        WaitAnswer::Wait(ticket)
    }

    /// Request `ctx` left the queue (`why`): its place, its Redis waiter, counted.
    fn leave_queue(&mut self, host: &mut dyn Host, ctx: u32, ticket: Ticket, why: Leave) {
        use crate::stats::Counter;
        self.waiting.remove(&(ticket.rank, ticket.seq, ctx));
        self.queued = self.queued.saturating_sub(1);
        match ticket.waiter.as_deref() {
            Some(w @ Waiter::Redis { .. }) => self.redis.waiter(host, &mut self.tel, w, None),
            Some(Waiter::Shared { key, id }) => {
                // Not removed: the line expires at its deadline.
                let _ = waiters::set(host, key, *id, None, 0);
            }
            None => {}
        }
        let counter = match why {
            Leave::Admitted => {
                // Room was found: maybe more of it, for the next one (it stops at no room).
                self.kicks += 1;
                Some(Counter::QueueAdmitted)
            }
            Leave::Timeout => Some(Counter::QueueTimeout),
            Leave::Abandoned => Some(Counter::QueueAbandoned),
            Leave::Other => None,
        };
        if let Some(c) = counter {
            self.tel.inc(host, c);
        }
        let waited = host.now_ms().saturating_sub(ticket.since_ms);
        if let Some(req) = self.requests.get_mut(&ctx) {
            req.queued_ms = Some(waited);
        }
    }

    /// How many requests wait or retry in this VM's queue (tests and leak checks).
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Runs the route's policy for request `ctx`.
    fn decide(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        read_body: bool,
        read: Option<&Rc<request::PromptRead>>,
    ) -> Option<request::Decision> {
        let req = self.requests.get(&ctx)?;
        let input = Input {
            ctx,
            config: &req.config,
            keys: req.keys.as_ref(),
            inflight: req.inflight.as_ref(),
            body_bytes: req.body_bytes,
            read_body,
            read,
            synced: req
                .keys
                .as_ref()
                .and_then(|k| self.redis.synced(&k.namespace)),
        };
        let env = Env {
            tel: &mut self.tel,
            rng: &mut self.rng,
        };
        Some(self.policies.decide(host, env, &input))
    }
}

#[cfg(test)]
mod body_tests;
#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod fairness_tests;
#[cfg(test)]
mod local_prefix_tests;
#[cfg(test)]
mod priority_tests;
#[cfg(test)]
mod queue_tests;
#[cfg(test)]
mod tests;
