//! Redis's reply to a cluster_metrics global in-flight pick: Redis chose and counted a
//! service, or the local path's choice decides, as Higress does on any Redis trouble
//! (docs/higress-cluster-policies.md §3.6). Either way the service is counted in this proxy's
//! statistics too ([`Start`]) and held until stream end.

use super::holding::{Local, ServiceLease, Start};
use super::pick::ServicePick;
use crate::balancer::events::Pick;
use crate::balancer::events::{Answer, Decision, Effect, Placement};
use crate::balancer::holding::{Holding, Services};
use crate::balancer::pick::{OwnReply, PickReply};
use crate::balancer::redis_client::{calls, Decode, LeaseKeys};
use crate::balancer::telemetry::Telemetry;
use crate::config::RouteConfig;
use crate::host::Host;
use crate::reason::{Cause, Reason};
use crate::redis::inflight::{self, ServiceAcquireArgs};
use crate::redis::scripts::{Scripts, RECLAIM_LIMIT};
use crate::stats::Counter;
use std::rc::Rc;

/// The service Redis chose and counted (`service_acquire.lua`'s reply).
#[derive(Debug)]
pub struct Counted(pub String);

impl OwnReply for Counted {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Tests: Redis counted `service`.
#[cfg(test)]
pub fn counted_reply(service: &str) -> PickReply {
    PickReply::Own(Rc::new(Counted(service.to_string())))
}

/// The service a reply names, if it is this policy's.
pub fn counted(reply: &PickReply) -> Option<&str> {
    match reply {
        PickReply::Own(own) => own.as_any().downcast_ref::<Counted>().map(|c| c.0.as_str()),
        _ => None,
    }
}

/// A global in-flight acquire's reply (a `Decode`). No service (no candidates) or garbage:
/// the local path.
pub fn decode(host: &mut dyn Host, tel: &mut Telemetry, ctx: u32, bytes: &[u8]) -> PickReply {
    match inflight::parse_acquire(bytes) {
        Ok(Some(service)) => PickReply::Own(Rc::new(Counted(service))),
        Ok(None) => PickReply::Failed(Cause::BadReply),
        Err(e) => calls::reply_error(host, tel, ctx, e),
    }
}

/// What `reply` (Err: never sent, nothing acquired) comes to for the request that sent `pick`.
pub fn answer(mut pick: ServicePick, reply: Result<PickReply, Cause>) -> Answer {
    let reply = match reply {
        Ok(reply) => reply,
        Err(cause) => return locally(&pick, cause, Vec::new()),
    };
    if let Some(service) = counted(&reply) {
        if pick.offered(service) {
            let lease = pick.lease(service);
            return route(lease, vec![Effect::Count(Counter::ClusterInflightGlobal)]);
        }
        let release = vec![Effect::GiveBack {
            held: Box::new(pick.global(service)),
            outcome: None,
        }];
        return locally(&pick, Cause::BadReply, release);
    }
    match reply {
        PickReply::NoScript if pick.by_sha => {
            pick.by_sha = false;
            let resend = Decision::Acquire(Box::new(pick));
            Answer::new(vec![Effect::Count(Counter::RedisNoScript)], resend)
        }
        PickReply::Failed(Cause::RedisTimeout) => {
            // The script may have run before the reply was lost: give back whatever it
            // could have counted.
            let lease = pick.local_lease(&pick.local);
            let release = vec![Effect::ReleaseAll(Box::new(pick))];
            route_local(lease, Cause::RedisTimeout, release)
        }
        PickReply::Failed(cause) => locally(&pick, cause, Vec::new()),
        PickReply::NoScript => locally(&pick, Cause::RedisError, Vec::new()),
        PickReply::Own(_)
        | PickReply::Picked { .. }
        | PickReply::Resync
        | PickReply::Full
        | PickReply::PoolFull
        | PickReply::Tenant
        | PickReply::Shed(_) => locally(&pick, Cause::BadReply, Vec::new()),
    }
}

/// The local path's choice, with nothing counted in Redis, after `effects`.
fn locally(pick: &ServicePick, cause: Cause, effects: Vec<Effect>) -> Answer {
    route_local(pick.local_lease(&pick.local), cause, effects)
}

fn route_local(lease: ServiceLease, cause: Cause, mut effects: Vec<Effect>) -> Answer {
    effects.push(Effect::Act(Box::new(Local(cause))));
    route(lease, effects)
}

/// Routes to `lease`'s service, counted in this proxy's statistics.
fn route(lease: ServiceLease, mut effects: Vec<Effect>) -> Answer {
    effects.push(Effect::Act(Box::new(Start(lease.clone()))));
    let decision = Decision::Route {
        place: Placement::on(lease.name().to_string()),
        reason: Reason::ClusterMetrics,
        hold: Some(Box::new(lease)),
    };
    Answer::new(effects, decision)
}

impl Pick for ServicePick {
    fn config(&self) -> &Rc<RouteConfig> {
        &self.config
    }

    fn query(&self, scripts: &Scripts, now_ms: u64, random: u32) -> Vec<u8> {
        inflight::acquire_call(
            scripts,
            self.by_sha,
            &self.keys,
            &ServiceAcquireArgs {
                now_ms,
                lease_ttl_ms: self.config.common.lease_ttl_ms,
                key_ttl_s: self.key_ttl_s,
                request_id: &self.request_id,
                random,
                reclaim: RECLAIM_LIMIT,
                candidates: &self.candidates,
            },
        )
    }

    fn decode(&self) -> Decode {
        decode
    }

    fn answer(self: Box<Self>, reply: Result<PickReply, Cause>) -> Answer {
        answer(*self, reply)
    }

    fn undo(self: Box<Self>, reply: &PickReply) -> Vec<Effect> {
        if let Some(service) = counted(reply) {
            let held: Box<dyn Holding> = Box::new(self.global(service));
            return vec![Effect::GiveBack {
                held,
                outcome: None,
            }];
        }
        match reply {
            PickReply::Failed(Cause::RedisTimeout) => vec![Effect::ReleaseAll(self)],
            _ => Vec::new(),
        }
    }

    fn release_all(self: Box<Self>, svc: &mut Services) {
        let keys = LeaseKeys::Service(self.keys.clone());
        let members = self.every_member();
        svc.redis
            .release(svc.host, svc.tel, &self.config, keys, members);
    }

    #[cfg(test)]
    fn by_sha(&self) -> bool {
        self.by_sha
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    #[cfg(test)]
    fn clone_box(&self) -> Box<dyn Pick> {
        Box::new(self.clone())
    }
}
