//! A pick whose stream ended before Redis answered (docs/architecture.md "A request's path",
//! step 8): when its reply comes, [`undo`] gives back whatever it acquired.

use super::events::{Effect, Pick};
use super::pick::PickReply;
use crate::stats::Counter;

/// The stream ended while its pick was in flight and the reply is here: give back whatever
/// the pick acquired.
pub fn undo(pick: Box<dyn Pick>, reply: &PickReply) -> Vec<Effect> {
    let mut e = vec![Effect::Count(Counter::ReleasesOrphaned)];
    e.extend(pick.undo(reply));
    e
}
