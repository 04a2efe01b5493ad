//! The effects a request's transitions ask for, performed against the host, Redis and the
//! VM's state (docs/architecture.md "A request's path"). An effect that needs an answer
//! (decide, send, wait, publish) returns it as the request's next event.

use super::holding::Services;
use super::pick::Pick;
use super::policies::{Env, Input};
use super::publish;
use super::redis_client::LeaseKeys;
use super::request::{self, Effect, Event};
use super::Balancer;
use crate::host::{Host, LogLevel};
use std::rc::Rc;

impl Balancer {
    /// Performs `effect` for request `ctx`; the event it answers with, if any.
    pub(super) fn perform(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        effect: Effect,
    ) -> Option<Event> {
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
                let req = self.requests.get(&ctx)?;
                let (redis, tel, rng) = (&mut self.redis, &mut self.tel, &mut self.rng);
                let answer = self.queue.join(host, ctx, req, redis, tel, rng);
                Some(Event::Waited { rejection, answer })
            }
            Effect::LeaveQueue { ticket, why } => {
                let (redis, tel) = (&mut self.redis, &mut self.tel);
                let waited = self.queue.leave(host, ctx, ticket, why, redis, tel);
                if let Some(req) = self.requests.get_mut(&ctx) {
                    req.queued_ms = Some(waited);
                }
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
                let (h, outcome) = self.requests.get_mut(&ctx)?.holding_mut()?;
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
                let (keys, members) = match &*pick {
                    Pick::Endpoint(p) => {
                        let keys = LeaseKeys::Endpoint {
                            keys: p.keys.clone(),
                            booked: p.chain.is_some(),
                        };
                        (keys, p.every_lease())
                    }
                    Pick::Service(p) => (LeaseKeys::Service(p.keys.clone()), p.every_member()),
                    Pick::Session(_) => return None, // a session binding holds no count
                };
                self.redis
                    .release(host, &mut self.tel, pick.config(), keys, members);
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
                let route = self.requests.get(&ctx).map(|r| &*r.config);
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
        let mut expect = None;
        let mut restarted = Vec::new();
        let env = Env {
            tel: &mut self.tel,
            rng: &mut self.rng,
            metrics: &mut self.metrics,
            expect: &mut expect,
            restarted: &mut restarted,
        };
        let route = self.routes.get_mut(req.route)?;
        let decision = route.policy.decide(host, env, &input);
        if let Some(e) = expect {
            self.expects.insert(ctx, e);
        }
        if let (false, Some(keys)) = (restarted.is_empty(), req.keys.clone()) {
            let config = req.config.clone();
            for pod in restarted {
                self.tel.log(
                    host,
                    LogLevel::Info,
                    ctx,
                    format_args!("{pod} restarted (its start time changed): its older prefixes stop matching"),
                );
                self.redis
                    .forget(host, &mut self.tel, &config, &keys, &[], &pod);
            }
        }
        Some(decision)
    }
}
