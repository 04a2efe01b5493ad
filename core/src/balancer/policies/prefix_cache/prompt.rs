//! What a plain-Envoy prefix_cache request reads of its body (its prefix keys, anchor, session
//! and token estimates, and the body with the usage request added when an answer is to be
//! read), and which of its keys it reads and records (its window).

use super::expect::with_usage_asked;
use crate::balancer::events::{Decision, PromptRead};
use crate::balancer::policies::policy::Input;
use crate::balancer::policies::session::{self, Body};
use crate::balancer::telemetry::Telemetry;
use crate::config::PrefixSettings;
use crate::host::Host;
use crate::prefix::{anchor_of, canonicalize, PromptTokens};
use std::rc::Rc;

/// A request reads and records at most this many of its deepest keys, plus its anchor: a
/// conversation's next turn matches within its last few blocks, and a long new prompt must not
/// touch hundreds of records.
pub const WINDOW: usize = 32;

/// The body's prefix keys, anchor and session id, and the body with the usage request added
/// when the answer's usage is to be read (`usage`: the route verifies, or learns latencies);
/// None (counted, logged) when it has no prompt to key on: least request then decides.
pub fn read_prompt(
    host: &mut dyn Host,
    tel: &mut Telemetry,
    input: &Input,
    (settings, usage): (&PrefixSettings, bool),
) -> Option<(PromptRead, Option<Vec<u8>>)> {
    let body = host.request_body(0, input.body_bytes).unwrap_or_default();
    match canonicalize(&body, &settings.canon) {
        Ok(canon) => Some((
            {
                let who = session::identify(host, tel, input.config, Body::Bytes(&body));
                PromptRead {
                    keys: canon.chain_keys(),
                    anchor: anchor_of(canon.blocks(), settings.anchor),
                    session: who.sticky,
                    answer: who.answer,
                    tokens: PromptTokens::of(&canon, input.body_bytes),
                    prefix_bytes: canon.prefix_bytes(),
                }
            },
            usage.then(|| with_usage_asked(&canon, &body)).flatten(),
        )),
        Err(e) => {
            tel.bad_prompt(host, input.ctx, &e);
            None
        }
    }
}

/// A refusal for want of room keeps what was read, for the retry if the request waits.
pub fn keeping(decision: Decision, read: Rc<PromptRead>) -> Decision {
    match decision {
        Decision::Reject(rejection) if rejection.may_wait() => {
            Decision::Refused { rejection, read }
        }
        other => other,
    }
}

/// The chain positions a request reads and records, deepest first: its last [`WINDOW`] keys
/// from the anchor on, then the anchor if it is further back. Keys before the anchor (tools,
/// system prompt) are shared by many conversations and never route one.
pub fn window(len: usize, anchor: usize) -> Vec<usize> {
    let low = anchor.max(len.saturating_sub(WINDOW));
    let mut w: Vec<usize> = (low..len).rev().collect();
    if anchor < low {
        w.push(anchor);
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_the_deepest_keys_then_the_anchor() {
        assert_eq!(window(3, 1), vec![2, 1]);
        assert_eq!(window(1, 0), vec![0]);
        assert_eq!(window(0, 0), Vec::<usize>::new());
        let w = window(100, 2);
        assert_eq!(w.len(), WINDOW + 1);
        assert_eq!((w[0], w[WINDOW - 1], w[WINDOW]), (99, 68, 2));
        assert_eq!(window(40, 20), (20..40).rev().collect::<Vec<_>>());
    }
}
