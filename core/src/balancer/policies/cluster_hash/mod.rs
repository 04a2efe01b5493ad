//! cluster_hash (`lb_type: cluster`): the `hash_header` value's FNV-1a 32 picks one of
//! Higress's 100 weighted slots, and the slot's cluster is written into `cluster_header`
//! (docs/higress-cluster-policies.md §2). A missing or empty header is answered 403, as
//! Higress answers it. No state beyond the slot table, which is built once per config.

use super::policy::{Env, Input, Policy};
use crate::balancer::events::{Decision, Rejection};
use crate::cluster::hash::{HashDecision, SlotTable};
use crate::config::ClusterHashConfig;
use crate::host::Host;
use crate::reason::{Cause, Reason};

/// A cluster_hash route: its `hash_header` and its slot table.
pub struct ClusterHash {
    header: String,
    slots: Option<SlotTable>,
}

impl ClusterHash {
    pub fn new(config: &ClusterHashConfig) -> ClusterHash {
        ClusterHash {
            header: config.hash_header.clone(),
            slots: slots(config),
        }
    }
}

impl Policy for ClusterHash {
    fn decide(&mut self, host: &mut dyn Host, _: Env, _: &Input) -> Decision {
        decide(host, &self.header, self.slots.as_ref())
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

fn decide(host: &mut dyn Host, header: &str, slots: Option<&SlotTable>) -> Decision {
    let Some(slots) = slots else {
        return Decision::Fallback(Cause::NoRoute);
    };
    // The raw bytes, as Go hashes them: a lossy UTF-8 reading would move obs-text values.
    let value = host.request_header_bytes(header).ok().flatten();
    match slots.route(value.as_deref()) {
        HashDecision::Cluster(cluster) => Decision::Route {
            endpoint: cluster.to_string(),
            fallbacks: Vec::new(),
            reason: Reason::ClusterHash,
            hold: None,
        },
        HashDecision::Reject { .. } => Decision::Reject(Rejection::HashHeaderMissing),
    }
}
