//! Redis's reply to an endpoint_metrics session pick (a route with a session and Redis): the
//! pod Redis kept or bound the session to, when it is one the request offered, else the
//! scheduler's pick, as without a session. A session binding holds no count.

use crate::balancer::events::{Answer, Decision, Effect};
use crate::balancer::holding::{Act, Services};
use crate::balancer::pick::{Pick, PickReply, SessionPick};
use crate::reason::{Cause, Reason};
use crate::redis::scripts::SessionState;
use crate::stats::Counter;

/// What `reply` (Err: never sent) comes to for the request that sent `pick`.
pub fn answer(mut pick: SessionPick, reply: Result<PickReply, Cause>) -> Answer {
    match reply {
        Ok(PickReply::Picked {
            endpoint, session, ..
        }) if endpoint == pick.choice || pick.keep.contains(&endpoint) => {
            let (reason, counter) = match session {
                SessionState::Kept => (Reason::Session, Counter::SessionHit),
                SessionState::Rebound => (Reason::SessionRebound, Counter::SessionRebound),
                SessionState::New | SessionState::None => (Reason::Metrics, Counter::SessionBound),
            };
            route(endpoint, reason, counter)
        }
        Ok(PickReply::NoScript) if pick.by_sha => {
            pick.by_sha = false;
            let resend = Decision::Acquire(Box::new(Pick::Session(pick)));
            Answer::new(vec![Effect::Count(Counter::RedisNoScript)], resend)
        }
        // Redis could not keep or bind the session (down, timeout, error, a reply naming a pod
        // not offered): the scheduler's pick, counted (docs/sessions-and-queues.md "Sessions").
        _ => route(pick.choice, Reason::Metrics, Counter::SessionFallback),
    }
}

/// Routes to `endpoint`, counted as sent from this proxy (the in-flight correction).
fn route(endpoint: String, reason: Reason, counter: Counter) -> Answer {
    let effects = vec![
        Effect::Count(counter),
        Effect::Act(Box::new(SentTo(endpoint.clone()))),
    ];
    let decision = Decision::Route {
        endpoint,
        fallbacks: Vec::new(),
        reason,
        hold: None,
    };
    Answer::new(effects, decision)
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
