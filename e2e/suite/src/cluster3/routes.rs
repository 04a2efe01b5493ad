//! The bed's routes (named by policy and number) and what Redis says about each: its load per
//! endpoint or count per service, and its leases, read through the proxy or on a master.

use crate::gateway::CLUSTER;
use crate::redis_cluster::{auth_cmd, PASSWORD, USER};
use ailb_core::redis::inflight::InflightKeys;
use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::Keys;
use std::collections::BTreeMap;

/// The route prefixes of the three policies.
pub const POLICIES: [&str; 3] = ["glr", "px", "cm"];
/// cluster_metrics' services: one cluster per pod 0, 1, 2.
pub const SERVICES: [&str; 3] = ["llm-a", "llm-b", "llm-c"];
pub const INFLIGHT_PREFIX: &str = "higress:adaptive_score_inflight";

pub fn route_name(policy: &str, i: usize) -> String {
    format!("{policy}-{i:03}")
}

/// A route of the bed: its policy and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Route {
    pub policy: &'static str,
    pub name: String,
}

impl Route {
    pub fn path(&self) -> String {
        format!("/{}/v1/chat/completions", self.name)
    }

    /// The key whose slot holds all of this route's keys.
    pub fn anchor_key(&self) -> String {
        match self.policy {
            "cm" => InflightKeys::new(INFLIGHT_PREFIX, &self.name).leases,
            _ => Keys::new("ailb", &self.name, CLUSTER).load,
        }
    }
}

/// What Redis says about one route: load per endpoint / count per service, and leases.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteCounts {
    pub counts: BTreeMap<String, f64>,
    pub leases: i64,
}

impl RouteCounts {
    pub fn total(&self) -> f64 {
        self.counts.values().sum()
    }
    pub fn any_negative(&self) -> bool {
        self.counts.values().any(|&v| v < 0.0)
    }
    pub fn is_zero(&self) -> bool {
        self.leases == 0 && self.counts.values().all(|&v| v == 0.0)
    }
}

/// Reads a route's counts with `cmd` (the proxy, or a master directly); None when unreachable
/// or answered with an error.
pub fn route_counts(route: &Route, cmd: &dyn Fn(&[&str]) -> Option<Value>) -> Option<RouteCounts> {
    let (read, leases) = match route.policy {
        "cm" => {
            let k = InflightKeys::new(INFLIGHT_PREFIX, &route.name);
            (vec!["HGETALL".to_string(), k.counts], k.leases)
        }
        _ => {
            let k = Keys::new("ailb", &route.name, CLUSTER);
            (
                ["ZRANGE", &k.load, "0", "-1", "WITHSCORES"]
                    .map(str::to_string)
                    .to_vec(),
                k.leases,
            )
        }
    };
    let args: Vec<&str> = read.iter().map(String::as_str).collect();
    let Value::Array(Some(items)) = cmd(&args)? else {
        return None;
    };
    let mut counts = BTreeMap::new();
    for pair in items.chunks(2) {
        if let [m, s] = pair {
            let v = s.as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
            counts.insert(m.as_str().unwrap_or_default().to_string(), v);
        }
    }
    let leases = cmd(&["ZCARD", &leases])?.as_i64()?;
    Some(RouteCounts { counts, leases })
}

/// Counts through the proxy on `port` (usable from a watcher thread).
pub fn counts_via(port: u16, route: &Route) -> Option<RouteCounts> {
    route_counts(route, &|a| auth_cmd(port, USER, PASSWORD, a))
}
