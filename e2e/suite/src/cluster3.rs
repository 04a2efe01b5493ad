//! The Redis Cluster bed's fleet: emulator gateways (2 workers each) whose Redis cluster is
//! the `redis_proxy` of a [`crate::redis_cluster::RedisCluster`], fake pods, and many routes
//! under three policies: `global_least_request`, `prefix_cache`, and `cluster_metrics`
//! AdaptiveScore with `global_inflight_enabled`.
//!
//! Routes: the emulator matches routes by path, so route `glr-017` is the prefix
//! `/glr-017/` (the fake pods serve `/<anything>/v1/chat/completions`). One plugin instance
//! serves them all: its config holds one `_rules_` entry per policy whose `_match_route_` lists
//! that policy's route names, as Higress hands route-level configs to one VM; the plugin names
//! its Redis keys by the `route_name` property (docs/redis-data-model.md §1, §8), so each route
//! has its own hash tag and the routes spread over every shard. That is the cheapest faithful
//! setup: one VM per worker as in Higress, not one plugin per route.
//!
//! Here: the failure drill. Steady load through every gateway while a fault runs (a master
//! killed, the proxy restarted, ...), then probes until Redis's counts are back to the truth,
//! and what was lost, fell back, went negative or leaked on the way. The routes are in
//! `routes`, the pods, cluster and gateways in `fleet`.

mod fleet;
mod routes;

use crate::gateway::Gateway;
pub use fleet::{decisions, send, Fleet};
pub use routes::{
    counts_via, route_counts, route_name, Route, RouteCounts, INFLIGHT_PREFIX, POLICIES, SERVICES,
};

/// What a drill saw.
#[derive(Clone, Debug, Default)]
pub struct Drill {
    /// Requests sent during the drill, and those not answered 200.
    pub requests: usize,
    pub lost: usize,
    /// Plugin decisions during the drill, and how many of them fell back.
    pub decisions: i64,
    pub fallbacks: i64,
    /// Route counts seen negative at any moment (through the proxy).
    pub negative: Vec<(String, RouteCounts)>,
    /// What the fault took to heal (the closure's own measure, e.g. failover time).
    pub fault_ms: u128,
    /// Counts and leases left once the probes stopped (must be 0).
    pub leaked: f64,
    /// The routes whose counts were not back to zero, as last read.
    pub left: Vec<(String, Option<RouteCounts>)>,
    /// From the end of the load until every count was back to the truth (0 in flight).
    pub heal_ms: u128,
    /// Probe rounds sent while healing (one request per route each).
    pub probe_rounds: usize,
}

impl Drill {
    pub fn fallback_share(&self) -> f64 {
        if self.decisions == 0 {
            0.0
        } else {
            self.fallbacks as f64 / self.decisions as f64
        }
    }
}

/// The prompt of request `k` on a route: a few conversations per route repeat, so prefix
/// routes have prefixes to find.
pub fn prompt(route: &Route, k: usize) -> String {
    format!(
        "{} conversation {}: {}",
        route.name,
        k % 3,
        "tell me about redis cluster failover and hash slots. ".repeat(12)
    )
}

/// Steady load over `routes` through `urls` from `threads` clients while `fault` runs on
/// the fleet, `settle` of load after it; then probes (short requests over every route) until
/// every count is back to zero or `heal_within` passes.
pub fn drill(
    fleet: &mut Fleet,
    gateways: &[Gateway],
    routes: &[Route],
    threads: usize,
    settle: std::time::Duration,
    heal_within: std::time::Duration,
    fault: impl FnOnce(&mut Fleet) -> std::time::Duration,
) -> Drill {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let urls: Vec<String> = gateways.iter().map(|g| g.url.clone()).collect();
    let (decisions0, fallbacks0) = decisions(gateways);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..threads)
        .map(|t| {
            let (urls, routes, stop) = (urls.clone(), routes.to_vec(), stop.clone());
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                let mut k = t;
                while !stop.load(Ordering::Relaxed) {
                    let r = &routes[k % routes.len()];
                    statuses
                        .push(send(&urls[k % urls.len()], r, &prompt(r, k / routes.len()), 2).0);
                    k += threads;
                }
                statuses
            })
        })
        .collect();
    let watcher = {
        let (port, routes, stop) = (fleet.redis.proxy.port, routes.to_vec(), stop.clone());
        std::thread::spawn(move || {
            let mut negative = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for r in &routes {
                    if let Some(c) = counts_via(port, r) {
                        if c.any_negative() {
                            negative.push((r.name.clone(), c));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            negative
        })
    };
    std::thread::sleep(Duration::from_millis(800));
    let fault_took = fault(fleet);
    std::thread::sleep(settle);
    stop.store(true, Ordering::Relaxed);
    let statuses: Vec<u16> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap_or_default())
        .collect();
    let negative = watcher.join().unwrap_or_default();
    let (decisions1, fallbacks1) = decisions(gateways);
    let ended = Instant::now();
    // Probes: each pick may reclaim expired leases (docs/redis-data-model.md §6), which is how
    // what the fault lost heals.
    let port = fleet.redis.proxy.port;
    let left = |routes: &[Route]| -> f64 {
        routes
            .iter()
            .map(|r| match counts_via(port, r) {
                Some(c) => c.total().abs() + c.leases as f64,
                None => f64::INFINITY,
            })
            .sum()
    };
    // In a shuffled order, so no route is always probed through the same gateway and worker.
    let mut rng = ailb_core::hash::SplitMix64(0x5eed);
    let mut order: Vec<&Route> = routes.iter().collect();
    let mut k = 0;
    let mut leaked = left(routes);
    while leaked != 0.0 && ended.elapsed() < heal_within {
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        for r in &order {
            let g = (rng.next_u64() % urls.len() as u64) as usize;
            send(&urls[g], r, &prompt(r, k), 1);
        }
        k += 1;
        leaked = left(routes);
    }
    let left_routes = routes
        .iter()
        .map(|r| (r.name.clone(), counts_via(port, r)))
        .filter(|(_, c)| !c.as_ref().is_some_and(RouteCounts::is_zero))
        .collect();
    Drill {
        left: left_routes,
        requests: statuses.len(),
        lost: statuses.iter().filter(|&&s| s != 200).count(),
        decisions: decisions1 - decisions0,
        fallbacks: fallbacks1 - fallbacks0,
        negative,
        fault_ms: fault_took.as_millis(),
        leaked,
        heal_ms: ended.elapsed().as_millis(),
        probe_rounds: k,
    }
}
