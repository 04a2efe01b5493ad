//! Redis's reply to an endpoint pick (global_least_request, prefix_cache): the lease it took,
//! a resend (NOSCRIPT, a lost endpoint set), a refusal for want of room, or a fallback.

use super::pick::EndpointPick;
use crate::balancer::events::Pick;
use crate::balancer::events::{Answer, Decision, Effect, Placement, Rejection};
use crate::balancer::holding::{Holding, Services};
use crate::balancer::pick::PickReply;
use crate::balancer::policies::continuation::Continued;
use crate::balancer::policies::session::Kind;
use crate::balancer::redis_client::{calls, Decode, LeaseKeys, RedisClient};
use crate::config::RouteConfig;
use crate::host::Host;
use crate::reason::Cause;
use crate::redis::scripts::release::Learned;
use crate::redis::scripts::Scripts;
use crate::redis::scripts::SessionState;
use crate::stats::Counter;
use std::rc::Rc;

/// What `reply` (Err: never sent, nothing acquired) comes to for the request that sent `pick`.
/// A sticky request that falls back degrades to the cluster's own balancing, counted as a
/// session not honoured (docs/redis-data-model.md §10); a tenant's request that falls back
/// is not held to its share, counted the same way (docs/sessions-and-queues.md "Tenant fairness").
pub fn answer(pick: EndpointPick, reply: Result<PickReply, Cause>) -> Answer {
    let mut if_fallback = Vec::new();
    if pick.session.is_some() {
        if_fallback.push(Counter::SessionFallback);
    }
    if pick.tenant.is_some() {
        if_fallback.push(Counter::TenantFallback);
    }
    let answer = match reply {
        Ok(reply) => replied(pick, reply),
        Err(cause) => Answer::new(Vec::new(), Decision::Fallback(cause)),
    };
    Answer {
        if_fallback,
        ..answer
    }
}

fn replied(mut pick: EndpointPick, reply: PickReply) -> Answer {
    let namespace = pick.keys.namespace.clone();
    match reply {
        PickReply::Picked {
            ref endpoint,
            depth,
            spilled,
            session,
            load_before,
            booked,
            all_ejected,
        } => {
            let mut lease = pick.lease(endpoint);
            lease.booking = booked.filter(|b| b.tokens > 0).map(|b| pick.booking(b));
            if !pick.candidates.contains(endpoint) {
                // Only possible if two endpoint sets share a fingerprint: resync next time.
                let effects = vec![
                    Effect::Unsynced { namespace },
                    Effect::GiveBack {
                        held: Box::new(lease),
                        outcome: None,
                    },
                ];
                return Answer::new(effects, Decision::Fallback(Cause::BadReply));
            }
            let counted = match session {
                SessionState::None => None,
                SessionState::Kept => Some(Counter::SessionHit),
                SessionState::New => Some(Counter::SessionBound),
                SessionState::Rebound => Some(Counter::SessionRebound),
            };
            let mut effects: Vec<Effect> = counted.map(Effect::Count).into_iter().collect();
            if session == SessionState::New && pick.session_kind == Kind::Continuation {
                // Its previous response's pod is not known: placed as the policy places it
                // (and bound there, so a retry of it finds that pod).
                effects.push(Effect::Count(Counter::ContinuationUnknown));
            }
            if all_ejected {
                // Failure memory fails open: every endpoint was ejected (health.lua).
                effects.push(Effect::Count(Counter::EjectedFailOpen));
            }
            // Only the top class is admitted past `maxRequestCount`: its headroom
            // (docs/sessions-and-queues.md "Priority classes"), as the plain-Envoy pick counts it.
            let base_cap = pick.config.common.max_load;
            if base_cap > 0 && load_before.is_some_and(|l| l >= base_cap) {
                effects.push(Effect::Count(Counter::PriorityAdmittedHeadroom));
            }
            effects.push(Effect::Synced {
                namespace,
                fingerprint: pick.fingerprint.clone(),
            });
            let mut place = Placement::on(endpoint.clone());
            let mut hold: Box<dyn Holding> = match pick.wrap.take() {
                Some(wrap) => wrap.wrap(lease, &reply, &mut place),
                None => Box::new(lease),
            };
            if let Some(record) = pick.record.take() {
                hold = Box::new(Continued::new(Some(hold), endpoint.clone(), record));
            }
            let decision = Decision::Route {
                reason: pick.reason(depth, spilled, session),
                place,
                hold: Some(hold),
            };
            Answer::new(effects, decision)
        }
        PickReply::Resync if !pick.sent_list => {
            // Redis lost or never had our endpoint set: resend the pick with it, once.
            pick.sent_list = true;
            let effects = vec![
                Effect::Count(Counter::RedisResync),
                Effect::Unsynced { namespace },
            ];
            Answer::new(effects, resend(pick))
        }
        PickReply::Resync | PickReply::Own(_) => Answer::new(
            vec![Effect::Unsynced { namespace }],
            Decision::Fallback(Cause::BadReply),
        ),
        full @ (PickReply::Full | PickReply::PoolFull) => {
            let rejection = match pick.class {
                Some(_) => Rejection::ShedPriority,
                None => Rejection::MaxRequestCount,
            };
            // A full pool answers as full endpoints do, and may wait the same way.
            let mut effects = Vec::new();
            if matches!(full, PickReply::PoolFull) {
                effects.push(Effect::Count(Counter::PoolFull));
            }
            let pick = Box::new(pick);
            Answer::new(effects, Decision::Full { rejection, pick })
        }
        PickReply::Tenant => Answer::new(Vec::new(), Decision::Reject(Rejection::ShedTenant)),
        PickReply::Shed(_) => Answer::new(Vec::new(), Decision::Reject(Rejection::ShedLatency)),
        PickReply::NoScript if pick.by_sha => {
            // Redis restarted or flushed its script cache: EVAL reloads it.
            pick.by_sha = false;
            Answer::new(vec![Effect::Count(Counter::RedisNoScript)], resend(pick))
        }
        PickReply::NoScript => Answer::new(Vec::new(), Decision::Fallback(Cause::RedisError)),
        PickReply::Failed(cause) => {
            let mut effects = Vec::new();
            if cause == Cause::RedisTimeout {
                // The script may have run before the reply was lost.
                effects.push(Effect::ReleaseAll(Box::new(pick)));
            }
            Answer::new(effects, Decision::Fallback(cause))
        }
    }
}

fn resend(pick: EndpointPick) -> Decision {
    Decision::Acquire(Box::new(pick))
}

impl Pick for EndpointPick {
    fn config(&self) -> &Rc<RouteConfig> {
        &self.config
    }

    fn query(&self, scripts: &Scripts, now_ms: u64, random: u32) -> Vec<u8> {
        super::pick::query(scripts, self, now_ms, random)
    }

    fn decode(&self) -> Decode {
        calls::decode_pick
    }

    fn answer(self: Box<Self>, reply: Result<PickReply, Cause>) -> Answer {
        answer(*self, reply)
    }

    fn undo(self: Box<Self>, reply: &PickReply) -> Vec<Effect> {
        match reply {
            PickReply::Picked { endpoint, .. } => {
                let held: Box<dyn Holding> = Box::new(self.lease(endpoint));
                vec![Effect::GiveBack {
                    held,
                    outcome: None,
                }]
            }
            PickReply::Failed(Cause::RedisTimeout) => vec![Effect::ReleaseAll(self)],
            _ => Vec::new(),
        }
    }

    fn release_all(self: Box<Self>, svc: &mut Services) {
        let keys = LeaseKeys::Endpoint {
            keys: self.keys.clone(),
            booked: self.chain.is_some(),
            learned: Learned::Nothing,
            now_ms: svc.host.now_ms(),
        };
        let members = self.every_lease();
        svc.redis
            .release(svc.host, svc.tel, &self.config, keys, members);
    }

    fn refresh(&mut self, host: &dyn Host, redis: &RedisClient) -> Result<(), Cause> {
        let synced = redis.synced(&self.keys.namespace).cloned();
        EndpointPick::refresh(self, host, synced.as_ref())
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
