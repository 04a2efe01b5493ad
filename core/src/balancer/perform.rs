//! The effect performer: the VM's services (Redis client, counters, randomness, metrics view,
//! waiting queue, orphaned picks) and the effects a request's transitions ask for, performed
//! against them and the host (docs/architecture.md "A request's path"). An effect that needs an
//! answer (decide, send, wait, publish) returns it as the request's next event.

use super::body_flow::{self, BodyFlow};
use super::events::Pick;
use super::healthy::HealthyLists;
use super::holding::Services;
use super::metrics::Metrics;
use super::policies::{self, Env, Input, Policy};
use super::publish;
use super::queue::{self, Queue};
use super::redis_client::{self, RedisClient};
use super::request::{self, Effect, Event, Request};
use super::rng::VmRng;
use super::routes::Route;
use super::telemetry::Telemetry;
use crate::config::PluginConfig;
use crate::host::{Host, LogLevel};
use crate::id_map::IdMap;
use crate::ranks;
use crate::stats;
use std::rc::Rc;

/// The VM's services, one per plugin config (root context), and the performer of effects.
pub struct Performer {
    pub redis: RedisClient,
    /// The VM's one view of endpoint metrics, shared by every route's policy.
    pub metrics: Metrics,
    pub tel: Telemetry,
    pub rng: VmRng,
    /// Plain Envoy: whether the host delivers a held request's body (body_flow.rs).
    pub body: BodyFlow,
    pub queue: Queue,
    /// Picks whose stream ended before Redis answered, by token: undone when the reply comes.
    pub orphans: IdMap<Box<dyn Pick>>,
    /// The Redis picks' healthy endpoints per route cluster (healthy.rs).
    pub hosts: HealthyLists,
}

impl Performer {
    /// The services of a validated config: the counters defined, each Redis target
    /// initialised once with its scripts preloaded, and one root tick for the scraper, the
    /// body deadlines, the queue and the first bytes.
    pub fn new(host: &mut dyn Host, config: &PluginConfig, seed: u64, level: LogLevel) -> Self {
        let mut vm = Performer {
            metrics: Metrics::new(config, seed),
            tel: Telemetry::new(host, level),
            redis: RedisClient::default(),
            rng: VmRng::new(seed),
            body: BodyFlow::default(),
            queue: Queue::default(),
            orphans: IdMap::default(),
            hosts: HealthyLists::default(),
        };
        // Every route with a Redis target: the endpoint policies', and cluster_metrics' global
        // in-flight count.
        let redis_routes = config.all().filter(|c| c.redis.is_some());
        vm.redis.preload(host, &mut vm.tel, redis_routes);
        let tick = [
            vm.metrics.tick_ms(),
            body_flow::tick_ms(config),
            queue::tick_ms(config),
            redis_client::first_bytes_tick_ms(config),
            policies::tick_ms(config),
        ]
        .into_iter()
        .filter(|&t| t > 0)
        .min();
        if let Some(ms) = tick {
            if let Err(e) = host.set_tick_period(ms) {
                let msg = format_args!("{e}: no scraping, no body deadline, no queue retries");
                vm.tel.log(host, LogLevel::Warn, 0, msg);
            }
        }
        vm
    }

    /// Performs `effect` for request `ctx` (`req`, None once its stream ended; its route among
    /// `routes`); the event it answers with, if any.
    pub fn perform(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        (mut req, routes): (Option<&mut Request>, &mut [Route]),
        effect: Effect,
    ) -> Option<Event> {
        match effect {
            Effect::Decide { read_body } => {
                let (req, route) = with_route(req, routes)?;
                Some(Event::Decided(self.decide(
                    host,
                    ctx,
                    req,
                    route,
                    (read_body, None),
                )))
            }
            Effect::Redecide(read) => {
                let (req, route) = with_route(req, routes)?;
                let read = Some(&read);
                Some(Event::Decided(self.decide(
                    host,
                    ctx,
                    req,
                    route,
                    (false, read),
                )))
            }
            Effect::Retry(mut pick) => {
                if let Err(cause) = pick.refresh(host, &self.redis) {
                    return Some(Event::Sent {
                        result: Err(cause),
                        pick,
                    });
                }
                self.perform(host, ctx, (req, routes), Effect::Send(pick))
            }
            Effect::Wait(rejection) => {
                let req = req.as_deref()?;
                let (redis, tel, rng) = (&mut self.redis, &mut self.tel, &mut self.rng);
                let answer = self.queue.join(host, ctx, req, redis, tel, rng);
                Some(Event::Waited { rejection, answer })
            }
            Effect::LeaveQueue { ticket, why } => {
                let (redis, tel) = (&mut self.redis, &mut self.tel);
                let waited = self.queue.leave(host, ctx, ticket, why, redis, tel);
                if let Some(req) = req.as_deref_mut() {
                    req.queued_ms = Some(waited);
                }
                None
            }
            Effect::Send(pick) => {
                let random = (self.rng.next_u64() >> 32) as u32;
                let query = pick.query(self.redis.scripts(), host.now_ms(), random);
                let call = (pick.config().as_ref(), query.as_slice(), pick.decode());
                let result = self.redis.send_pick(host, &mut self.tel, ctx, call);
                Some(Event::Sent { result, pick })
            }
            Effect::Publish(place) => {
                let config = req.as_deref()?.config.clone();
                let result = publish::publish(host, &config, &place, req.as_deref()?.body_bytes);
                match &result {
                    Err(e) => self.tel.log(host, LogLevel::Warn, ctx, format_args!("{e}")),
                    Ok(()) if config.common.detail_log && self.tel.enabled(LogLevel::Debug) => {
                        let (_, reason) = req.as_deref()?.phase().describe();
                        self.tel.log(
                            host,
                            LogLevel::Debug,
                            ctx,
                            format_args!("routed to {} ({})", place.to.endpoint, reason.name()),
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
            Effect::GiveBack { held, outcome } => {
                let mut svc = Services {
                    host,
                    tel: &mut self.tel,
                    redis: &mut self.redis,
                    ctx,
                };
                held.give_back(&mut svc, outcome.as_ref());
                None
            }
            Effect::FirstBytes => {
                let (h, outcome) = req?.phase_mut().holding_mut()?;
                let mut svc = Services {
                    host,
                    tel: &mut self.tel,
                    redis: &mut self.redis,
                    ctx,
                };
                h.first_bytes(&mut svc, outcome);
                None
            }
            Effect::Act(act) => {
                let mut svc = Services {
                    host,
                    tel: &mut self.tel,
                    redis: &mut self.redis,
                    ctx,
                };
                act.run(&mut svc);
                None
            }
            Effect::ReleaseAll(pick) => {
                let mut svc = Services {
                    host,
                    tel: &mut self.tel,
                    redis: &mut self.redis,
                    ctx,
                };
                pick.release_all(&mut svc);
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
                let route = req.map(|r| &*r.config);
                self.tel.no_body(host, ctx, cause, route);
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

    /// Runs the route's policy for request `ctx`: `read_body` whether the body may be read,
    /// `read` what a waiting request's first decision read from it.
    fn decide(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        req: &Request,
        policy: &mut dyn Policy,
        (read_body, read): (bool, Option<&Rc<request::PromptRead>>),
    ) -> request::Decision {
        // A copy: the policy may use the Redis client too (Env).
        let synced = req
            .keys
            .as_ref()
            .and_then(|k| self.redis.synced(&k.namespace))
            .cloned();
        let input = Input {
            ctx,
            config: &req.config,
            keys: req.keys.as_ref(),
            inflight: req.inflight.as_ref(),
            body_bytes: req.body_bytes,
            read_body,
            read,
            synced: synced.as_ref(),
        };
        let env = Env {
            tel: &mut self.tel,
            rng: &mut self.rng,
            metrics: &mut self.metrics,
            redis: &mut self.redis,
            hosts: &mut self.hosts,
        };
        policy.decide(host, env, &input)
    }

    /// The response headers of a routed request: the served-elsewhere check, the debug
    /// header.
    pub fn response_headers(&mut self, host: &mut dyn Host, ctx: u32, req: &mut Request) {
        // A response from another endpoint than the one counted is the host's retry: the
        // counted pod failed (refused, reset, timed out or answered a retried 5xx). One
        // property read per request whose holding counts an endpoint (docs/redis-data-model.md
        // §14 "Served elsewhere").
        let served = req.phase().counted_endpoint().and_then(|chosen| {
            let served = host.property(&["upstream", "address"]).ok().flatten()?;
            // As bytes: the usual answer, from the pod counted, allocates nothing. A retry
            // elsewhere took a rank endpoint's rank header along.
            if served.is_empty() || served == ranks::pod(chosen).as_bytes() {
                return None;
            }
            Some(ranks::same_rank(std::str::from_utf8(&served).ok()?, chosen))
        });
        if let Some(served) = served {
            let counter = stats::pod_down(req.phase().describe().1);
            self.tel.inc(host, counter);
            let mut svc = Services {
                host,
                tel: &mut self.tel,
                redis: &mut self.redis,
                ctx,
            };
            req.phase_mut().served_elsewhere(&mut svc, &served);
        }
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
            if let Some(extra) = req.phase().holding().and_then(|h| h.debug()) {
                value.push_str(&extra);
            }
            let _ = host.add_response_header(name, &value);
        }
    }

    /// The response headers told the request's holding: a body reader, if it asks for one.
    pub fn open_reader(&mut self, host: &mut dyn Host, ctx: u32, req: &mut Request) {
        let Some((held, outcome)) = req.phase_mut().holding_mut() else {
            return;
        };
        let mut svc = Services {
            host,
            tel: &mut self.tel,
            redis: &mut self.redis,
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
    pub fn read_body(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        req: &mut Request,
        at: (usize, bool),
    ) {
        let (size, end) = at;
        if !req.phase().reading() {
            return;
        }
        let chunk = match host.response_body(0, size) {
            Ok(c) => c,
            Err(err) => {
                req.phase_mut().drop_reader();
                let msg = format_args!("{err}: response not read");
                self.tel.log(host, LogLevel::Warn, ctx, msg);
                return;
            }
        };
        let (out, found) = req.phase_mut().read_chunk(&chunk, end);
        if found {
            // Before the chunk reaches the client: a continuation it sends next finds what its
            // holding does with the id (policies/continuation.rs).
            if let Some((held, outcome)) = req.phase_mut().holding_mut() {
                let mut svc = Services {
                    host: &mut *host,
                    tel: &mut self.tel,
                    redis: &mut self.redis,
                    ctx,
                };
                held.answer_id(&mut svc, outcome);
            }
        }
        if let Some(out) = out {
            if let Err(err) = host.set_response_body(&out) {
                self.tel
                    .log(host, LogLevel::Warn, ctx, format_args!("{err}"));
            }
        }
    }
}

/// The request and its route's policy, for a decision.
fn with_route<'a>(
    req: Option<&'a mut Request>,
    routes: &'a mut [Route],
) -> Option<(&'a Request, &'a mut dyn Policy)> {
    let req = req?;
    let route = routes.get_mut(req.route)?;
    Some((req, route.policy.as_mut()))
}
