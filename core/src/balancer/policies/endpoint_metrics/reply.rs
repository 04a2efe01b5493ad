//! Redis's reply to an endpoint_metrics session pick (a route with a session and Redis): the
//! pod Redis kept or bound the session to, when it is one the request offered, else the
//! scheduler's pick, as without a session. A session binding holds no count.

use super::pick::SessionPick;
use crate::balancer::events::Pick;
use crate::balancer::events::{Answer, Decision, Effect, Placement};
use crate::balancer::holding::{Act, Services};
use crate::balancer::pick::PickReply;
use crate::balancer::policies::continuation::{self, Record};
use crate::balancer::policies::session::Kind;
use crate::balancer::redis_client::{calls, Decode};
use crate::config::RouteConfig;
use crate::reason::{Cause, Reason};
use crate::redis::scripts::SessionState;
use crate::redis::scripts::{self, Scripts};
use crate::stats::Counter;
use std::rc::Rc;

/// What `reply` (Err: never sent) comes to for the request that sent `pick`.
pub fn answer(mut pick: SessionPick, reply: Result<PickReply, Cause>) -> Answer {
    match reply {
        Ok(PickReply::Picked {
            endpoint, session, ..
        }) if endpoint == pick.choice || pick.keep.contains(&endpoint) => {
            let kept = match pick.kind {
                Kind::Configured => Reason::Session,
                Kind::Agent => Reason::AgentSession,
                Kind::Continuation => Reason::Continuation,
            };
            let (reason, counter) = match session {
                SessionState::Kept => (kept, Counter::SessionHit),
                SessionState::Rebound => (Reason::SessionRebound, Counter::SessionRebound),
                SessionState::New | SessionState::None => (Reason::Metrics, Counter::SessionBound),
            };
            let mut answer = route(endpoint, reason, counter, pick.record);
            if session == SessionState::New && pick.kind == Kind::Continuation {
                answer
                    .effects
                    .push(Effect::Count(Counter::ContinuationUnknown));
            }
            answer
        }
        Ok(PickReply::NoScript) if pick.by_sha => {
            pick.by_sha = false;
            let resend = Decision::Acquire(Box::new(pick));
            Answer::new(vec![Effect::Count(Counter::RedisNoScript)], resend)
        }
        // Redis could not keep or bind the session (down, timeout, error, a reply naming a pod
        // not offered): the scheduler's pick, counted (docs/sessions-and-queues.md "Sessions").
        _ => route(
            pick.choice,
            Reason::Metrics,
            Counter::SessionFallback,
            pick.record,
        ),
    }
}

/// Routes to `endpoint`, counted as sent from this proxy (the in-flight correction); a
/// Responses request's answer is recorded (`record`).
fn route(endpoint: String, reason: Reason, counter: Counter, record: Option<Record>) -> Answer {
    let effects = vec![
        Effect::Count(counter),
        Effect::Act(Box::new(SentTo(endpoint.clone()))),
    ];
    let decision = Decision::Route {
        place: Placement::on(endpoint),
        reason,
        hold: None,
    };
    Answer::new(effects, continuation::hold(decision, record))
}

/// This proxy sends the request to this endpoint (the in-flight correction's count), once
/// Redis has said where a session goes.
#[derive(Debug)]
pub struct SentTo(pub String);

impl Act for SentTo {
    fn run(self: Box<Self>, svc: &mut Services) {
        super::count_sent(svc.host, &self.0);
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Pick for SessionPick {
    fn config(&self) -> &Rc<RouteConfig> {
        &self.config
    }

    fn query(&self, scripts: &Scripts, _now_ms: u64, _random: u32) -> Vec<u8> {
        scripts::session_bind_call(
            scripts,
            self.by_sha,
            &self.key,
            self.ttl_s,
            &self.choice,
            &self.keep,
        )
    }

    fn decode(&self) -> Decode {
        calls::decode_pick
    }

    fn answer(self: Box<Self>, reply: Result<PickReply, Cause>) -> Answer {
        answer(*self, reply)
    }

    /// A session binding holds no count: nothing to undo.
    fn undo(self: Box<Self>, _reply: &PickReply) -> Vec<Effect> {
        Vec::new()
    }

    fn release_all(self: Box<Self>, _svc: &mut Services) {}

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
