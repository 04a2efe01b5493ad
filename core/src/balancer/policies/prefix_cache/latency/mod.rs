//! prefix_cache's latency-aware placement, `latencyModel` (docs/latency-model.md §5). Each
//! route keeps per-pod models of TTFT and TPOT ([`Book`], core/src/latency/): every streamed
//! answer is a sample ([`timed`], either build's holding), and on a timer each worker merges
//! its samples with the fleet's and reads the fleet's back, so every worker predicts with every
//! other's answers. Which request is placed by the models and with what objectives is decided
//! alike in both builds ([`trust`]).
//! - Higress ([`Latency`]): the records are in Redis ([`merge`]); the pick script reads the
//!   coefficients and places by them (prefix_acquire.lua).
//! - Plain Envoy ([`local`]): the records are in the proxy's shared data; the local pick
//!   places by the same rule (core/src/latency/choose.rs).

pub mod local;
#[cfg(test)]
mod local_tests;
mod merge;
pub mod objectives;
mod shared;
mod timed;
mod trust;

use crate::balancer::redis_client::RedisClient;
use crate::balancer::rng::VmRng;
use crate::balancer::telemetry::Telemetry;
use crate::config::latency::LatencySettings;
use crate::config::RouteConfig;
use crate::host::Host;
use crate::latency::{Book, Prior};
use crate::redis::scripts::{Keys, LatencyArgs};
pub use shared::Shared;
use std::rc::Rc;
pub use timed::{LatencyWrap, Timed};
use trust::Trust;

/// The models of one key namespace, and where they merge.
#[derive(Debug)]
struct Namespace {
    shared: Shared,
    config: Rc<RouteConfig>,
    keys: Rc<Keys>,
    next_merge_ms: u64,
}

/// At most this many key namespaces keep models per route config and VM: a global config
/// serving many routes must not grow without bound. Past it, a new namespace's requests are
/// placed by the token gate.
const MAX_NAMESPACES: usize = 64;

/// One route config's latency-aware placement.
#[derive(Debug)]
pub struct Latency {
    trust: Trust,
    prior: Prior,
    namespaces: Vec<Namespace>,
}

impl Latency {
    pub fn new(settings: LatencySettings, start_rate: u64) -> Latency {
        Latency {
            trust: Trust::new(settings),
            prior: shared::prior(&settings, start_rate),
            namespaces: Vec::new(),
        }
    }

    /// The models the request's answer is learnt into, and its pick arguments: None when this
    /// gateway's model predicts too badly to place by (`maxMAPE`), so the token gate decides
    /// (counted) while the models go on learning until they predict well again. None at all
    /// past [`MAX_NAMESPACES`]. The class is applied later (`EndpointPick::with_class`: only
    /// the lowest class is sheddable).
    pub fn args(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        (ctx, rng): (u32, &mut VmRng),
        (config, keys): (&Rc<RouteConfig>, &Rc<Keys>),
    ) -> Option<(Option<LatencyArgs>, Shared)> {
        let known = |n: &Namespace| n.keys.namespace == keys.namespace;
        if !self.namespaces.iter().any(known) {
            if self.namespaces.len() >= MAX_NAMESPACES {
                return None;
            }
            let ns = Namespace {
                shared: Shared::new(Book::new(self.prior), rng.request_id()),
                config: config.clone(),
                keys: keys.clone(),
                next_merge_ms: 0,
            };
            self.namespaces.push(ns);
        }
        let shared = self.namespaces.iter().find(|n| known(n))?.shared.clone();
        let mape = shared.book.try_borrow().ok().and_then(|b| b.ttft_mape());
        let args = self
            .trust
            .objectives(host, tel, ctx, mape)
            .map(|o| LatencyArgs {
                slo_ttft_ms: o.ttft_ms,
                slo_tpot_ms: o.tpot_ms,
                sheddable: false,
            });
        Some((args, shared))
    }

    /// The root tick: each namespace whose interval has passed, with samples to send or
    /// coefficients to refresh and no merge out, merges with the fleet's records.
    pub fn tick(&mut self, host: &mut dyn Host, tel: &mut Telemetry, redis: &mut RedisClient) {
        let now = host.now_ms();
        for ns in self.namespaces.iter_mut() {
            if now < ns.next_merge_ms || ns.shared.merging() {
                continue;
            }
            ns.next_merge_ms = now.saturating_add(self.trust.settings.merge_interval_ms);
            let config = ns.config.clone();
            merge::send(
                host,
                tel,
                redis,
                (&config, &ns.keys),
                &ns.shared,
                &self.trust.settings,
            );
        }
    }
}
