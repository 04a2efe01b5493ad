//! Which prefix keys the Redis build sends: from the anchor block on.

use super::anchored_chain;
use crate::prefix::{canonicalize, prefix_key, Anchor, CanonConfig};
use serde_json::{json, Value};

fn canon(messages: Value) -> crate::prefix::Canonical {
    let body = json!({"model": "m", "messages": messages}).to_string();
    canonicalize(body.as_bytes(), &CanonConfig::default()).unwrap()
}

fn full_chain(messages: Value) -> Vec<String> {
    canon(messages)
        .chain_keys()
        .iter()
        .map(|k| prefix_key("ns", k))
        .collect()
}

#[test]
fn conversations_under_one_system_prompt_share_no_key() {
    let sys = json!({"role": "system", "content": "You are a helpful assistant."});
    let a = json!([sys, {"role": "user", "content": "first question"}]);
    let b = json!([sys, {"role": "user", "content": "another question"}]);
    let ka = anchored_chain(&canon(a.clone()), Anchor::Conversation, "ns");
    let kb = anchored_chain(&canon(b), Anchor::Conversation, "ns");
    // The system prompt's own key is not sent: it would match for every conversation.
    assert_eq!(ka, full_chain(a)[1..]);
    assert!(ka.iter().all(|k| !kb.contains(k)), "{ka:?} {kb:?}");
    // The conversation's next turn still extends its chain.
    let a2 = json!([sys, {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"}, {"role": "user", "content": "more"}]);
    let ka2 = anchored_chain(&canon(a2), Anchor::Conversation, "ns");
    assert_eq!(ka2[..ka.len()], ka[..]);
}

#[test]
fn the_preamble_anchor_keeps_the_whole_preamble_key() {
    let sys = json!({"role": "system", "content": "Shared rules."});
    let a = json!([sys, {"role": "user", "content": "q1"}]);
    let b = json!([sys, {"role": "user", "content": "q2"}]);
    let ka = anchored_chain(&canon(a.clone()), Anchor::Preamble, "ns");
    let kb = anchored_chain(&canon(b), Anchor::Preamble, "ns");
    assert_eq!(ka, full_chain(a));
    assert_eq!(ka[0], kb[0], "the shared system prompt's key is sent");
}

#[test]
fn a_prompt_without_preamble_sends_every_key() {
    let long = "A long shared document. ".repeat(800); // cut into several blocks
    let m = json!([{"role": "user", "content": long}]);
    let keys = anchored_chain(&canon(m.clone()), Anchor::Conversation, "ns");
    assert!(keys.len() > 2, "{}", keys.len());
    assert_eq!(keys, full_chain(m));
}

#[test]
fn a_request_of_preamble_only_keeps_its_last_key() {
    let m = json!([{"role": "system", "content": "only a system prompt"}]);
    let keys = anchored_chain(&canon(m.clone()), Anchor::Conversation, "ns");
    assert_eq!(keys, full_chain(m));
}
