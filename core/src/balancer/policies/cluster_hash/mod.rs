//! cluster_hash (`lb_type: cluster`): the key's FNV-1a 32 picks one of Higress's 100 weighted
//! slots, and the slot's cluster is written into `cluster_header`
//! (docs/higress-cluster-policies.md §2). The key is the `hash_header` value, or where Higress
//! PR #3921's `key` block says: a header, a cookie, a JSON body field, a Wasm property. A
//! missing or empty key is answered 403, as Higress answers it. No state beyond the slot table,
//! which is built once per config.

use super::policy::{Env, Input, Policy};
use crate::balancer::events::{Decision, Placement, Rejection};
use crate::cluster::hash::{HashDecision, SlotTable};
use crate::cluster::{cookie, json_path};
use crate::config::{ClusterHashConfig, HashKey};
use crate::host::Host;
use crate::reason::{Cause, Reason};

/// A cluster_hash route: where its key comes from and its slot table.
pub struct ClusterHash {
    key: HashKey,
    /// A missing key is answered with the PR's `hash key required` (else `hash header required`).
    key_block: bool,
    slots: Option<SlotTable>,
}

impl ClusterHash {
    pub fn new(config: &ClusterHashConfig) -> ClusterHash {
        ClusterHash {
            key: config.key.clone(),
            key_block: config.key_block,
            slots: slots(config),
        }
    }
}

impl Policy for ClusterHash {
    fn decide(&mut self, host: &mut dyn Host, _: Env, input: &Input) -> Decision {
        let Some(slots) = self.slots.as_ref() else {
            return Decision::Fallback(Cause::NoRoute);
        };
        let key = key_of(&*host, &self.key, input);
        match slots.route(key.as_deref()) {
            HashDecision::Cluster(cluster) => Decision::Route {
                place: Placement::on(cluster.to_string()),
                reason: Reason::ClusterHash,
                hold: None,
            },
            HashDecision::Reject { .. } if self.key_block => {
                Decision::Reject(Rejection::HashKeyMissing)
            }
            HashDecision::Reject { .. } => Decision::Reject(Rejection::HashHeaderMissing),
        }
    }
}

/// The slot table of a parsed config. The parser already checked what `SlotTable::build`
/// checks (docs/higress-cluster-policies.md §4.2), so `None` cannot happen for a config the
/// plugin accepted.
fn slots(config: &ClusterHashConfig) -> Option<SlotTable> {
    let entries: Vec<(&str, i64)> = config
        .clusters
        .iter()
        .map(|c| (c.cluster.as_str(), i64::from(c.weight)))
        .collect();
    SlotTable::build(&entries).ok()
}

/// The request's key bytes, as Go hashes them (raw bytes: a lossy UTF-8 reading would move
/// obs-text values); `None` when the request has none. A body that was not read (none, too
/// long, withheld) has no key.
fn key_of(host: &dyn Host, key: &HashKey, input: &Input) -> Option<Vec<u8>> {
    match key {
        HashKey::Header(name) => host.request_header_bytes(name).ok().flatten(),
        HashKey::Cookie(name) => {
            let header = host.request_header_bytes("cookie").ok().flatten()?;
            cookie::go_cookie(&header, name)
        }
        HashKey::Body { path, .. } => {
            // The PR answers a GET or HEAD 403 at its headers, whatever body it carries.
            let method = host.request_header(":method").ok().flatten();
            let bodiless = method
                .is_some_and(|m| m.eq_ignore_ascii_case("GET") || m.eq_ignore_ascii_case("HEAD"));
            if bodiless || !input.read_body || input.body_bytes == 0 {
                return None;
            }
            let body = host.request_body(0, input.body_bytes).ok()?;
            json_path::lookup(&body, path)
        }
        HashKey::Metadata(path) => {
            let parts: Vec<&str> = path.iter().map(String::as_str).collect();
            host.property(&parts).ok().flatten()
        }
    }
}

#[cfg(test)]
mod tests;
