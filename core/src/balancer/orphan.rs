//! A pick whose stream ended before Redis answered (docs/architecture.md "A request's path",
//! step 8): when its reply comes, [`undo`] gives back whatever it acquired.

use super::events::Effect;
use super::pick::{Pick, PickReply};
use crate::reason::Cause;
use crate::stats::Counter;

/// The stream ended while its pick was in flight and the reply is here: give back whatever
/// the pick acquired.
pub fn undo(pick: Box<Pick>, reply: &PickReply) -> Vec<Effect> {
    let mut e = vec![Effect::Count(Counter::ReleasesOrphaned)];
    if matches!(*pick, Pick::Session(_)) {
        return e; // a session binding holds no count
    }
    let release = match (&*pick, reply) {
        (Pick::Endpoint(p), PickReply::Picked { endpoint, .. }) => Some(Effect::GiveBack {
            held: Box::new(p.lease(endpoint)),
            outcome: None,
        }),
        (Pick::Service(p), PickReply::Service(service)) => Some(Effect::GiveBack {
            held: Box::new(p.global(service)),
            outcome: None,
        }),
        _ => None,
    };
    match release {
        Some(effect) => e.push(effect),
        None if *reply == PickReply::Failed(Cause::RedisTimeout) => {
            e.push(Effect::ReleaseAll(pick))
        }
        None => {}
    }
    e
}
