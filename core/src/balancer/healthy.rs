//! The healthy endpoints a Redis pick chooses among (global_least_request, prefix_cache with
//! Redis): Higress's upstream host list (docs/higress-abi.md §7), re-read by each worker at
//! most every [`HOST_LIST_MS`] per route cluster, as endpoint_metrics' `hostListCacheMs`
//! default does. The host serializes every host with its stored health-check body (up to
//! 64 KiB each with `store_metrics`) into the VM on each read, so a read per request costs in
//! proportion to the fleet's metrics; and a list at most 100 ms old changes no outcome: the
//! router still refuses an override to a host it holds unhealthy or no longer has, and the
//! answer from another pod is then learned as its pick's failure, its lease moved
//! (docs/redis-data-model.md §14 "Served elsewhere").

use crate::host::Host;
use crate::reason::Cause;
use crate::upstream;
use std::collections::HashMap;
use std::rc::Rc;

/// How long a worker reuses a route cluster's healthy list.
pub const HOST_LIST_MS: u64 = 100;
/// Route clusters whose list is kept before the cache is dropped wholesale (config churn).
const LISTS_LIMIT: usize = 64;

/// One read of the host list: the healthy addresses, sorted, and their fingerprint.
#[derive(Debug, Clone)]
pub struct Healthy {
    pub endpoints: Rc<Vec<String>>,
    pub fingerprint: Rc<str>,
    read_ms: u64,
}

/// Each route cluster's last read (by its Redis namespace, which names route and cluster).
#[derive(Debug, Default)]
pub struct HealthyLists {
    lists: HashMap<String, Healthy>,
}

impl HealthyLists {
    /// The healthy endpoints of `namespace`'s cluster, each pod as its `ranks` DP ranks
    /// (ranks.rs; the namespace names the route, whose config fixes `ranks`): the last read if
    /// under [`HOST_LIST_MS`] old, else a new one. A failed read or an empty healthy set is
    /// not kept.
    pub fn get(&mut self, host: &dyn Host, namespace: &str, ranks: u16) -> Result<Healthy, Cause> {
        let now = host.now_ms();
        if let Some(h) = self.lists.get(namespace) {
            if now.saturating_sub(h.read_ms) < HOST_LIST_MS {
                return Ok(h.clone());
            }
        }
        let fresh = read(host, now, ranks)?;
        if self.lists.len() >= LISTS_LIMIT {
            self.lists.clear();
        }
        self.lists.insert(namespace.to_string(), fresh.clone());
        Ok(fresh)
    }
}

/// Reads the host list now: its healthy addresses (sorted), each as its `ranks` DP ranks,
/// and their fingerprint.
pub fn read(host: &dyn Host, now: u64, ranks: u16) -> Result<Healthy, Cause> {
    let endpoints = match host.upstream_hosts().map(|b| upstream::decode_hosts(&b)) {
        Ok(Ok(list)) => list,
        _ => return Err(Cause::HostListUnavailable),
    };
    let healthy = upstream::healthy_addresses(&endpoints);
    if healthy.is_empty() {
        return Err(Cause::NoHealthyEndpoint);
    }
    let healthy = crate::ranks::expand(healthy, ranks);
    Ok(Healthy {
        fingerprint: upstream::fingerprint(&healthy).into(),
        endpoints: Rc::new(healthy),
        read_ms: now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::mock::MockHost;

    #[test]
    fn a_list_is_reused_under_its_age_then_read_again_and_a_failed_read_is_not_kept() {
        let mut host = MockHost::new().with_hosts(&[("10.0.0.1:80", "Healthy")]);
        host.now_ms = 1_000;
        let mut lists = HealthyLists::default();
        assert_eq!(
            *lists.get(&host, "a", 1).unwrap().endpoints,
            ["10.0.0.1:80"]
        );
        host = host.with_hosts(&[("10.0.0.1:80", "Healthy"), ("10.0.0.2:80", "Healthy")]);
        host.now_ms += HOST_LIST_MS - 1;
        assert_eq!(
            lists.get(&host, "a", 1).unwrap().endpoints.len(),
            1,
            "reused"
        );
        assert_eq!(
            lists.get(&host, "b", 1).unwrap().endpoints.len(),
            2,
            "per cluster"
        );
        host.now_ms += 1;
        assert_eq!(
            lists.get(&host, "a", 1).unwrap().endpoints.len(),
            2,
            "read again"
        );
        host = host.with_hosts(&[("10.0.0.1:80", "Unhealthy")]);
        host.now_ms += HOST_LIST_MS;
        assert_eq!(
            lists.get(&host, "a", 1).unwrap_err(),
            Cause::NoHealthyEndpoint
        );
        host = host.with_hosts(&[("10.0.0.3:80", "Healthy")]);
        assert_eq!(
            *lists.get(&host, "a", 1).unwrap().endpoints,
            ["10.0.0.3:80"]
        );
    }

    #[test]
    fn each_healthy_pod_is_read_as_its_data_parallel_ranks() {
        let host = MockHost::new().with_hosts(&[
            ("10.0.0.2:80", "Healthy"),
            ("10.0.0.1:80", "Healthy"),
            ("10.0.0.3:80", "Unhealthy"),
        ]);
        let one = read(&host, 0, 1).unwrap();
        let two = read(&host, 0, 2).unwrap();
        assert_eq!(
            *two.endpoints,
            [
                "10.0.0.1:80@0",
                "10.0.0.1:80@1",
                "10.0.0.2:80@0",
                "10.0.0.2:80@1"
            ]
        );
        assert_ne!(one.fingerprint, two.fingerprint, "another membership");
    }
}
