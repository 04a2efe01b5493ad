//! prefix_cache's latency-aware placement, `latencyModel` (docs/latency-model.md §5), Higress
//! build. Each route keeps per-pod models of TTFT and TPOT ([`Book`], core/src/latency/):
//! every streamed answer is a sample ([`timed`]), and on a timer each gateway adds its samples
//! to the fleet's records in Redis and reads the fleet's back ([`merge`]), so every gateway
//! predicts with every gateway's answers. The pick script reads the coefficients and places by
//! them (prefix_acquire.lua); this module tells it the request's objectives, and whether the
//! model predicts well enough to be trusted.

mod merge;
pub mod objectives;
mod shared;
mod timed;

use crate::balancer::redis_client::RedisClient;
use crate::balancer::telemetry::Telemetry;
use crate::config::latency::LatencySettings;
use crate::config::RouteConfig;
use crate::host::{Host, LogLevel};
use crate::latency::{Book, Prior};
use crate::redis::scripts::{Keys, LatencyArgs};
use crate::stats::Counter;
pub use shared::Shared;
use std::rc::Rc;
pub use timed::LatencyWrap;

/// How many samples' weight the prior carries (docs/latency-model.md §3): a pod's own fit takes
/// over within its first few dozen answers.
const PRIOR_STRENGTH: f64 = 8.0;

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
    settings: LatencySettings,
    prior: Prior,
    namespaces: Vec<Namespace>,
    /// Whether the model was trusted at the last pick (a change is logged once).
    trusted: bool,
    /// A bad objective header was logged (once per VM and route).
    warned_objective: bool,
}

impl Latency {
    pub fn new(settings: LatencySettings, start_rate: u64) -> Latency {
        Latency {
            settings,
            prior: Prior::from_rates(start_rate as f64, settings.prior_tpot_ms, PRIOR_STRENGTH),
            namespaces: Vec::new(),
            trusted: true,
            warned_objective: false,
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
        ctx: u32,
        (config, keys): (&Rc<RouteConfig>, &Rc<Keys>),
    ) -> Option<(Option<LatencyArgs>, Shared)> {
        let known = |n: &Namespace| n.keys.namespace == keys.namespace;
        if !self.namespaces.iter().any(known) {
            if self.namespaces.len() >= MAX_NAMESPACES {
                return None;
            }
            let ns = Namespace {
                shared: Shared::new(Book::new(self.prior)),
                config: config.clone(),
                keys: keys.clone(),
                next_merge_ms: 0,
            };
            self.namespaces.push(ns);
        }
        let shared = self.namespaces.iter().find(|n| known(n))?.shared.clone();
        let mape = shared.book.try_borrow().ok().and_then(|b| b.ttft_mape());
        let trusted = mape.is_none_or(|m| m <= self.settings.max_mape);
        if trusted != self.trusted {
            self.trusted = trusted;
            let (level, what) = match trusted {
                true => (
                    LogLevel::Info,
                    "predicts within maxMAPE again: placing by it",
                ),
                false => (
                    LogLevel::Warn,
                    "predicts past maxMAPE: the token gate places until it recovers",
                ),
            };
            tel.log(
                host,
                level,
                ctx,
                format_args!(
                    "latency model (TTFT error {:.0} %) {what} (counted in ai_lb.latency.fallback)",
                    mape.unwrap_or(0.0) * 100.0
                ),
            );
        }
        if !trusted {
            tel.inc(host, Counter::LatencyFallback);
            return Some((None, shared));
        }
        let header = |name: &str| host.request_header(name).ok().flatten();
        let (ttft, tpot) = (
            header(objectives::TTFT_HEADER),
            header(objectives::TPOT_HEADER),
        );
        let o = objectives::of(&self.settings, ttft.as_deref(), tpot.as_deref());
        if o.refused {
            tel.inc(host, Counter::LatencyBadObjective);
            if !self.warned_objective {
                self.warned_objective = true;
                tel.log(
                    host,
                    LogLevel::Warn,
                    ctx,
                    format_args!(
                        "an {} / {} header is not a number of ms in range: the route's objective \
                         is used (counted in ai_lb.latency.bad_objective; logged once)",
                        objectives::TTFT_HEADER,
                        objectives::TPOT_HEADER
                    ),
                );
            }
        }
        tel.inc(host, Counter::LatencyPlaced);
        let args = LatencyArgs {
            slo_ttft_ms: o.ttft_ms,
            slo_tpot_ms: o.tpot_ms,
            sheddable: false,
        };
        Some((Some(args), shared))
    }

    /// The root tick: each namespace whose interval has passed, with samples to send or
    /// coefficients to refresh and no merge out, merges with the fleet's records.
    pub fn tick(&mut self, host: &mut dyn Host, tel: &mut Telemetry, redis: &mut RedisClient) {
        let now = host.now_ms();
        for ns in self.namespaces.iter_mut() {
            if now < ns.next_merge_ms || ns.shared.merging() {
                continue;
            }
            ns.next_merge_ms = now.saturating_add(self.settings.merge_interval_ms);
            let config = ns.config.clone();
            merge::send(
                host,
                tel,
                redis,
                (&config, &ns.keys),
                &ns.shared,
                &self.settings,
            );
        }
    }
}
