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

pub use redis_client::CallStatus;

use crate::config::{PluginConfig, RequestKeys};
use crate::hash::IdMap;
use crate::host::{self, Host, LogLevel};
use crate::redis::scripts::Keys;
use pick::Pick;
use policies::{Env, Input, Policies};
use redis_client::{PickAnswer, RedisClient};
use request::{Effect, Event, Request};
use rng::VmRng;
use std::rc::Rc;
use telemetry::Telemetry;

/// What a phase callback answers the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    Pause,
}

pub struct Balancer {
    config: PluginConfig,
    requests: IdMap<Request>,
    /// Picks whose stream ended before Redis answered, by token: undone when the reply comes.
    orphans: IdMap<Box<Pick>>,
    redis: RedisClient,
    policies: Policies,
    tel: Telemetry,
    rng: VmRng,
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
        let mut b = Balancer {
            policies: Policies::new(&config, seed),
            tel: Telemetry::new(host, log_level),
            config,
            requests: IdMap::default(),
            orphans: IdMap::default(),
            redis: RedisClient::default(),
            rng: VmRng::new(seed),
        };
        // cluster_metrics' global in-flight Redis is not called by this build (its counts are
        // per proxy, README "Cluster policies"): only the endpoint policies' targets.
        let endpoint_routes = b.config.all().filter(|c| !c.policy.is_cluster());
        b.redis.preload(host, &mut b.tel, endpoint_routes);
        b.policies.start(host, &mut b.tel);
        b
    }

    pub fn on_request_headers(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        end_of_stream: bool,
    ) -> Verdict {
        // Three host calls a rule-less cluster policy would only throw away.
        let (route, cluster, authority) = if self.config.needs_request_names() {
            (
                host::text_property(host, "route_name"),
                host::text_property(host, "cluster_name"),
                host.request_header(":authority").ok().flatten(),
            )
        } else {
            (None, None, None)
        };
        let request_keys = RequestKeys {
            route: route.as_deref(),
            cluster: cluster.as_deref(),
            authority: authority.as_deref(),
        };
        // A client must never steer override_host or a cluster_header route.
        publish::strip_destination_headers(host, &self.config);
        let Some(config) = self.config.select(&request_keys).cloned() else {
            return Verdict::Continue; // no rule and no global config: the plugin is off here
        };
        let keys = match (&route, &cluster) {
            (Some(r), Some(c)) if !r.is_empty() && !c.is_empty() => {
                Some(Rc::new(Keys::new(&config.common.key_prefix, r, c)))
            }
            _ => None,
        };
        self.requests.insert(ctx, Request::new(config, keys));
        self.callback(host, ctx, Event::Headers { end_of_stream })
    }

    pub fn on_request_body(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        body_size: usize,
        end_of_stream: bool,
    ) -> Verdict {
        if !self.requests.get(&ctx).is_some_and(Request::wants_body) {
            return Verdict::Continue;
        }
        let event = Event::Body {
            size: body_size,
            end_of_stream,
        };
        self.callback(host, ctx, event)
    }

    pub fn on_response_headers(&mut self, host: &mut dyn Host, ctx: u32) {
        if !self.requests.contains_key(&ctx) {
            return;
        }
        let status = host
            .response_header(":status")
            .ok()
            .flatten()
            .and_then(|s| s.parse::<u32>().ok());
        self.drive(host, ctx, Event::ResponseHeaders { status });
        let Some(req) = self.requests.get(&ctx) else {
            return;
        };
        if let Some(name) = &req.config.common.debug_header {
            let (endpoint, reason) = req.describe();
            let value = format!(
                "endpoint={}; reason={}",
                endpoint.unwrap_or("-"),
                reason.name()
            );
            let _ = host.add_response_header(name, &value);
        }
    }

    /// A response body chunk: cluster_metrics records its time to the first one. Never holds
    /// the response.
    pub fn on_response_body(&mut self, host: &mut dyn Host, ctx: u32) -> Verdict {
        if self
            .requests
            .get(&ctx)
            .is_some_and(Request::wants_response_body)
        {
            self.drive(host, ctx, Event::ResponseBody);
        }
        Verdict::Continue
    }

    /// Stream end, whatever ended it: give back what was acquired, exactly once.
    pub fn on_done(&mut self, host: &mut dyn Host, ctx: u32) {
        let Some(req) = self.requests.remove(&ctx) else {
            return;
        };
        if let Some(effect) = req.finish() {
            self.perform(host, ctx, effect);
        }
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

    /// Root context tick (the metrics scraper).
    pub fn on_tick(&mut self, host: &mut dyn Host) {
        self.policies.on_tick(host, &mut self.tel);
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
                Some(Event::Decided(self.decide(host, ctx, read_body)?))
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
                let _ = host.send_local_response(r.status, r.details, r.body);
                None
            }
            Effect::Release(lease) => {
                let members = vec![lease.member];
                self.redis
                    .release(host, &mut self.tel, &lease.config, &lease.keys, members);
                None
            }
            Effect::ReleaseAll(pick) => {
                let members = pick.every_lease();
                self.redis
                    .release(host, &mut self.tel, &pick.config, &pick.keys, members);
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

    /// Runs the route's policy for request `ctx`.
    fn decide(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        read_body: bool,
    ) -> Option<request::Decision> {
        let req = self.requests.get(&ctx)?;
        let input = Input {
            ctx,
            config: &req.config,
            keys: req.keys.as_ref(),
            body_bytes: req.body_bytes,
            read_body,
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
mod cluster_tests;
#[cfg(test)]
mod tests;
