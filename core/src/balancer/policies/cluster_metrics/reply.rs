//! Redis's reply to a cluster_metrics global in-flight pick: Redis chose and counted a
//! service, or the local path's choice decides, as Higress does on any Redis trouble
//! (docs/higress-cluster-policies.md §3.6). Either way the service is counted in this proxy's
//! statistics too ([`Start`]) and held until stream end.

use super::holding::{Local, ServiceLease, Start};
use crate::balancer::events::{Answer, Decision, Effect};
use crate::balancer::pick::{Pick, PickReply, ServicePick};
use crate::reason::{Cause, Reason};
use crate::stats::Counter;

/// What `reply` (Err: never sent, nothing acquired) comes to for the request that sent `pick`.
pub fn answer(mut pick: ServicePick, reply: Result<PickReply, Cause>) -> Answer {
    let reply = match reply {
        Ok(reply) => reply,
        Err(cause) => return locally(&pick, cause, Vec::new()),
    };
    match reply {
        PickReply::Service(service) if pick.offered(&service) => {
            let lease = pick.lease(&service);
            route(lease, vec![Effect::Count(Counter::ClusterInflightGlobal)])
        }
        PickReply::Service(service) => {
            let release = vec![Effect::GiveBack {
                held: Box::new(pick.global(&service)),
                outcome: None,
            }];
            locally(&pick, Cause::BadReply, release)
        }
        PickReply::NoScript if pick.by_sha => {
            pick.by_sha = false;
            let resend = Decision::Acquire(Box::new(Pick::Service(pick)));
            Answer::new(vec![Effect::Count(Counter::RedisNoScript)], resend)
        }
        PickReply::Failed(Cause::RedisTimeout) => {
            // The script may have run before the reply was lost: give back whatever it
            // could have counted.
            let lease = pick.local_lease(&pick.local);
            let release = vec![Effect::ReleaseAll(Box::new(Pick::Service(pick)))];
            route_local(lease, Cause::RedisTimeout, release)
        }
        PickReply::Failed(cause) => locally(&pick, cause, Vec::new()),
        PickReply::NoScript => locally(&pick, Cause::RedisError, Vec::new()),
        PickReply::Picked { .. }
        | PickReply::Resync
        | PickReply::Full
        | PickReply::PoolFull
        | PickReply::Tenant => locally(&pick, Cause::BadReply, Vec::new()),
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
        endpoint: lease.name().to_string(),
        fallbacks: Vec::new(),
        reason: Reason::ClusterMetrics,
        hold: Some(Box::new(lease)),
    };
    Answer::new(effects, decision)
}
