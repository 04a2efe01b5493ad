//! Inspection of the plugin's keys in the test Redis (an `ailb_testkit::RedisServer`), through
//! the plugin's own key names.

use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::{Keys, EJECTED_MARK};
use ailb_testkit::try_cmd;
use std::collections::BTreeMap;

/// In-flight load per endpoint, the number of live leases and of tenants holding a count, of
/// one (route, cluster) in the Redis on `port`, or None while that Redis is unreachable.
pub fn try_counts(port: u16, route: &str, cluster: &str) -> Option<Counts> {
    let keys = Keys::new("ailb", route, cluster);
    let mut load = BTreeMap::new();
    let Value::Array(Some(items)) =
        try_cmd(port, &["ZRANGE", &keys.load, "0", "-1", "WITHSCORES"])?
    else {
        return None;
    };
    for pair in items.chunks(2) {
        if let [m, s] = pair {
            // An ejected endpoint's score carries failure memory's mark on top of its load.
            load.insert(
                m.as_str().unwrap_or_default().to_string(),
                s.as_f64().unwrap_or(f64::NAN) % EJECTED_MARK,
            );
        }
    }
    let leases = try_cmd(port, &["ZCARD", &keys.leases])?.as_i64()?;
    let tenants = try_cmd(port, &["HLEN", &keys.tenants])?.as_i64()?;
    let bookings = try_cmd(port, &["HLEN", &keys.booked])?.as_i64()?;
    let Value::Array(Some(items)) =
        try_cmd(port, &["ZRANGE", &keys.prefill, "0", "-1", "WITHSCORES"])?
    else {
        return None;
    };
    let prefill = items
        .chunks(2)
        .filter_map(|p| p.get(1).and_then(Value::as_f64))
        .sum();
    Some(Counts {
        load,
        leases,
        tenants,
        bookings,
        prefill,
    })
}

/// [`try_counts`] for a Redis that must be up.
pub fn counts(port: u16, route: &str, cluster: &str) -> Counts {
    try_counts(port, route, cluster).expect("redis unreachable")
}

#[derive(Debug, Clone, PartialEq)]
pub struct Counts {
    pub load: BTreeMap<String, f64>,
    pub leases: i64,
    /// Tenants with a non-zero in-flight count (tenant fairness; a count at 0 is deleted).
    pub tenants: i64,
    /// prefix_cache: prefill bookings not given back, and the tokens booked over every
    /// endpoint (docs/redis-data-model.md §13).
    pub bookings: i64,
    pub prefill: f64,
}

impl Counts {
    pub fn total(&self) -> f64 {
        self.load.values().sum()
    }

    pub fn is_zero(&self) -> bool {
        self.leases == 0
            && self.tenants == 0
            && self.bookings == 0
            && self.prefill == 0.0
            && self.load.values().all(|&v| v == 0.0)
    }

    pub fn any_negative(&self) -> bool {
        self.load.values().any(|&v| v < 0.0) || self.prefill < 0.0
    }
}
