//! Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing
//! with Bounded Loads", SODA 2018; what Envoy's ring hash, HAProxy's `hash-balance-factor` and
//! the Gateway API Inference Extension use). A key is hashed onto a ring of virtual nodes and
//! walks clockwise to the first endpoint whose load, with this request, stays within the bound.
//! Pure and deterministic given (endpoints, key, loads): proxies that share nothing but the
//! endpoint list send the same key to the same endpoint while it is within the bound
//! (docs/redis-data-model.md §9).

use crate::hash::{self, SplitMix64};

/// Virtual nodes per endpoint (ketama's 160): each endpoint's share of the keys is within about
/// ±10% of 1/N.
pub const VNODES: usize = 160;
/// Large lists get fewer virtual nodes each (at least [`MIN_VNODES`]), so a VM's ring stays
/// under this many points (1 MiB).
pub const MAX_POINTS: usize = 1 << 16;
pub const MIN_VNODES: usize = 16;

/// The ring of one endpoint list.
#[derive(Debug, Clone)]
pub struct Ring {
    /// (point, endpoint position), sorted.
    points: Vec<(u64, u32)>,
    endpoints: usize,
}

impl Ring {
    /// Each endpoint's points depend only on its address, so the same address keeps its keys
    /// whatever else joins or leaves the list.
    pub fn new<S: AsRef<str>>(endpoints: &[S]) -> Ring {
        let vnodes = (MAX_POINTS / endpoints.len().max(1)).clamp(MIN_VNODES, VNODES);
        let mut points = Vec::with_capacity(endpoints.len() * vnodes);
        for (i, e) in endpoints.iter().enumerate() {
            let mut g = SplitMix64(hash::fnv1a(hash::FNV_OFFSET, e.as_ref().as_bytes()));
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            points.extend((0..vnodes).map(|_| (g.next_u64(), i)));
        }
        points.sort_unstable();
        Ring {
            points,
            endpoints: endpoints.len(),
        }
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.endpoints
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints == 0
    }

    /// Endpoint positions in the order a clockwise walk from `key` meets them, each once.
    pub fn walk(&self, key: u64) -> Walk<'_> {
        Walk {
            ring: self,
            at: self.points.partition_point(|&(p, _)| p < key),
            steps: 0,
            seen: vec![false; self.endpoints],
            left: self.endpoints,
        }
    }
}

/// A clockwise walk over the ring ([`Ring::walk`]).
pub struct Walk<'a> {
    ring: &'a Ring,
    at: usize,
    steps: usize,
    seen: Vec<bool>,
    left: usize,
}

impl Iterator for Walk<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let n = self.ring.points.len();
        while self.left > 0 && self.steps < n {
            let (_, e) = self.ring.points.get(self.at % n).copied()?;
            self.at += 1;
            self.steps += 1;
            let e = e as usize;
            if let Some(seen) = self.seen.get_mut(e).filter(|s| !**s) {
                *seen = true;
                self.left -= 1;
                return Some(e);
            }
        }
        None
    }
}

/// The load bound: an endpoint may take a request only if its load then stays within
/// `max(⌈factor × avg⌉, ⌈avg⌉ + slack)`, where avg = (in flight + this request) / endpoints,
/// loads and slack in `costMode` units (1 per request by default). `factor` is
/// the paper's c (≥ 1); `slack` keeps the bound from biting at small loads, where ⌈c × avg⌉ is
/// barely above the average and would move keys on every burst.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    pub factor: f64,
    pub slack: u64,
}

impl Bound {
    /// The most load an endpoint may have after taking a request of `cost`, with `total` in
    /// flight over `n` endpoints. Never below ⌈avg⌉, so with unit costs some endpoint is
    /// always within it.
    pub fn limit(&self, total: u64, n: usize, cost: u64) -> u64 {
        let n = n.max(1) as u64;
        let balls = total.saturating_add(cost);
        let even = balls.div_ceil(n);
        let factor = if self.factor.is_finite() {
            self.factor.max(1.0)
        } else {
            1.0
        };
        let scaled = (factor * balls as f64 / n as f64).ceil() as u64;
        scaled.max(even.saturating_add(self.slack))
    }
}

/// The first endpoint of the walk from `key` that `allowed` accepts and whose load plus `cost`
/// is within the bound, or that is idle: an idle endpoint always takes a request, even one
/// costlier than the bound (as the cap, docs/redis-data-model.md §4), so a large body still
/// goes where its key hashes. With every endpoint allowed there always is one (the least loaded
/// is within the bound, or idle, when costs are units).
pub fn pick(
    ring: &Ring,
    key: u64,
    loads: &[u64],
    cost: u64,
    bound: Bound,
    allowed: impl Fn(usize) -> bool,
) -> Option<usize> {
    let total: u64 = loads.iter().sum();
    let limit = bound.limit(total, ring.len(), cost);
    ring.walk(key).find(|&e| {
        let load = loads.get(e).copied().unwrap_or(0);
        allowed(e) && (load == 0 || load.saturating_add(cost) <= limit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLASSIC: Bound = Bound {
        factor: 1.25,
        slack: 0,
    };
    const UNBOUNDED: Bound = Bound {
        factor: 1.0,
        slack: u64::MAX / 2,
    };

    fn endpoints(n: usize) -> Vec<String> {
        (1..=n)
            .map(|i| format!("10.0.{}.{}:8000", i / 200, i))
            .collect()
    }

    fn keys(count: u64) -> impl Iterator<Item = u64> {
        (0..count).map(|n| SplitMix64(n).next_u64())
    }

    fn owner(ring: &Ring, list: &[String], key: u64) -> String {
        let loads = vec![0; ring.len()];
        let e = pick(ring, key, &loads, 1, UNBOUNDED, |_| true).unwrap();
        list[e].clone()
    }

    #[test]
    fn the_same_key_goes_to_the_same_endpoint() {
        let list = endpoints(16);
        let (a, b) = (Ring::new(&list), Ring::new(&list));
        let loads = vec![3; 16];
        for k in keys(1_000) {
            assert_eq!(
                pick(&a, k, &loads, 1, CLASSIC, |_| true),
                pick(&b, k, &loads, 1, CLASSIC, |_| true)
            );
        }
        // Every endpoint gets its share of the keys (within ±25% of 1/16).
        let mut per = [0u32; 16];
        for k in keys(16_000) {
            per[pick(&a, k, &[0; 16], 1, CLASSIC, |_| true).unwrap()] += 1;
        }
        assert!(per.iter().all(|&c| (750..1250).contains(&c)), "{per:?}");
    }

    #[test]
    fn removing_or_adding_one_of_n_endpoints_moves_about_one_nth_of_the_keys() {
        let list = endpoints(10);
        let ring = Ring::new(&list);
        let fewer: Vec<String> = list.iter().filter(|e| *e != &list[3]).cloned().collect();
        let more: Vec<String> = endpoints(11);
        let (ring_fewer, ring_more) = (Ring::new(&fewer), Ring::new(&more));
        let (mut moved_out, mut moved_in) = (0, 0);
        let n = 20_000;
        for k in keys(n) {
            let before = owner(&ring, &list, k);
            let after = owner(&ring_fewer, &fewer, k);
            if before != after {
                assert_eq!(before, list[3], "only the removed endpoint's keys move");
                moved_out += 1;
            }
            let grown = owner(&ring_more, &more, k);
            if before != grown {
                assert_eq!(grown, more[10], "moved keys go to the new endpoint");
                moved_in += 1;
            }
        }
        let (out, inn) = (moved_out as f64 / n as f64, moved_in as f64 / n as f64);
        assert!((0.07..0.13).contains(&out), "removal moved {out}");
        assert!((0.065..0.12).contains(&inn), "addition moved {inn}");
    }

    #[test]
    fn a_hot_key_spills_along_the_ring_when_its_endpoint_is_over_the_bound() {
        let list = endpoints(8);
        let ring = Ring::new(&list);
        let key = 0xdead_beef;
        let order: Vec<usize> = ring.walk(key).collect();
        assert_eq!(order.len(), 8, "the walk meets every endpoint once");
        let mut loads = vec![2u64; 8];
        assert_eq!(
            pick(&ring, key, &loads, 1, CLASSIC, |_| true),
            Some(order[0])
        );
        // 16 + 1 in flight over 8: the bound is ⌈1.25 × 17/8⌉ = 3; the home endpoint at 3 is full.
        loads[order[0]] = 3;
        assert_eq!(CLASSIC.limit(17, 8, 1), 3);
        assert_eq!(
            pick(&ring, key, &loads, 1, CLASSIC, |_| true),
            Some(order[1])
        );
        loads[order[1]] = 3;
        assert_eq!(
            pick(&ring, key, &loads, 1, CLASSIC, |_| true),
            Some(order[2])
        );
        // Slack: the same loads are within ⌈avg⌉ + 2, so the key stays home.
        let slack = Bound {
            factor: 1.25,
            slack: 2,
        };
        assert_eq!(pick(&ring, key, &loads, 1, slack, |_| true), Some(order[0]));
        // A refused endpoint is walked past.
        let skip = order[0];
        assert_eq!(
            pick(&ring, key, &[0; 8], 1, CLASSIC, |e| e != skip),
            Some(order[1])
        );
        assert_eq!(pick(&ring, key, &[0; 8], 1, CLASSIC, |_| false), None);
    }

    #[test]
    fn no_endpoint_ever_gets_more_than_the_bound() {
        let list = endpoints(12);
        let ring = Ring::new(&list);
        for bound in [
            CLASSIC,
            Bound {
                factor: 1.5,
                slack: 3,
            },
        ] {
            let mut loads = vec![0u64; 12];
            let mut rng = SplitMix64(11);
            let mut live: Vec<usize> = Vec::new();
            for step in 0..20_000 {
                // Mostly one hot key, the rest random; now and then a request ends.
                let r = rng.next_u64();
                let key = if r.is_multiple_of(4) { r } else { 42 };
                let total: u64 = loads.iter().sum();
                let limit = bound.limit(total, 12, 1);
                let e = pick(&ring, key, &loads, 1, bound, |_| true).unwrap();
                loads[e] += 1;
                live.push(e);
                assert!(loads[e] <= limit, "step {step}: {loads:?} over {limit}");
                if r.is_multiple_of(3) && !live.is_empty() {
                    let done = live.swap_remove((r >> 8) as usize % live.len());
                    loads[done] -= 1;
                }
            }
        }
    }

    #[test]
    fn the_limit_is_never_below_the_even_share() {
        for n in 1..20 {
            for total in 0..200 {
                let l = CLASSIC.limit(total, n, 1);
                assert!(l >= (total + 1).div_ceil(n as u64));
            }
        }
        assert_eq!(CLASSIC.limit(0, 4, 1), 1);
        assert_eq!(
            Bound {
                factor: f64::NAN,
                slack: 0
            }
            .limit(7, 4, 1),
            2
        );
        assert!(Ring::new::<&str>(&[]).walk(1).next().is_none());
        // A large list stays under the point budget and still meets every endpoint.
        let big = Ring::new(&endpoints(5_000));
        assert!(big.points.len() <= MAX_POINTS.max(5_000 * MIN_VNODES));
        assert_eq!(big.walk(7).count(), 5_000);
    }

    #[test]
    fn costs_count_in_the_bound_and_an_idle_endpoint_takes_any_cost() {
        let list = endpoints(4);
        let ring = Ring::new(&list);
        let key = 0xfeed;
        let order: Vec<usize> = ring.walk(key).collect();
        let bound = Bound {
            factor: 1.5,
            slack: 100,
        };
        // Idle: a request costlier than the bound still goes to its key's endpoint.
        assert!(bound.limit(0, 4, 5_000) < 5_000);
        assert_eq!(
            pick(&ring, key, &[0; 4], 5_000, bound, |_| true),
            Some(order[0])
        );
        // 1000 in flight there: (1000 + 1000) / 4 = 500 avg, limit max(750, 600) = 750 < 2000.
        let mut loads = vec![0u64; 4];
        loads[order[0]] = 1_000;
        assert_eq!(bound.limit(1_000, 4, 1_000), 750);
        assert_eq!(
            pick(&ring, key, &loads, 1_000, bound, |_| true),
            Some(order[1])
        );
        // The slack is in the same units: 1500 of it keeps the key home (500 avg + 1500 = 2000).
        let wide = Bound {
            factor: 1.5,
            slack: 1_500,
        };
        assert_eq!(wide.limit(1_000, 4, 1_000), 2_000);
        assert_eq!(
            pick(&ring, key, &loads, 1_000, wide, |_| true),
            Some(order[0])
        );
    }
}
