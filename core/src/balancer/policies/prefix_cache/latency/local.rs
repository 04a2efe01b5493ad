//! prefix_cache's latency-aware placement in the plain-Envoy build (docs/latency-model.md §5,
//! docs/plain-envoy.md "Latency-aware placement"). There is no Redis: each worker keeps its
//! route config's models ([`Book`]) and places by them inside the local pick
//! (prefix_cache/local.rs), with the rule the Redis build's script applies
//! (core/src/latency/choose.rs), over this proxy's counts and prefill bookings. On the root
//! tick each worker adds its samples since its last merge to the proxy's one shared-data record
//! of the route config and reads every worker's back (core/src/latency/record.rs), so the
//! proxy's workers predict with each other's answers; another replica learns on its own.

use super::super::index::{Known, LocalPrefix};
use super::objectives::Objectives;
use super::shared::{self, Shared};
use super::trust::Trust;
use crate::balancer::shared as shared_data;
use crate::balancer::telemetry::Telemetry;
use crate::config::latency::LatencySettings;
use crate::config::{Class, RouteConfig};
use crate::hash::{fnv1a, FNV_OFFSET};
use crate::host::Host;
use crate::latency::record::Fleet;
use crate::latency::{choose, Book, Candidate, Choice, Features, Prediction, Rule};
use crate::latency::{TPOT_K, TTFT_K};
use crate::prefix::PromptTokens;
use crate::reason::Reason;
use std::rc::Rc;

/// One route config's models in one worker, and where the proxy's workers merge them.
#[derive(Debug)]
pub struct LocalLatency {
    trust: Trust,
    pub shared: Shared,
    /// The shared-data record the proxy's workers merge into (`ailb.lat.<hash>`).
    key: String,
    endpoints: Rc<Vec<String>>,
    /// Each endpoint's coefficients (by position) as this worker last solved them, at its
    /// last merge: the pick reads them as the script reads Redis's.
    coefficients: Vec<[f64; TTFT_K + TPOT_K]>,
    next_merge_ms: u64,
}

/// What the pick knows of one request and the endpoints when the models place it.
struct View<'a> {
    /// Each endpoint's load and booked prefill tokens before this request, by position.
    loads: &'a [u64],
    booked: &'a [u64],
    prompt_tokens: u64,
    /// The endpoint holding the request's prefix, and how many of its tokens it holds.
    warm: Option<(usize, u64)>,
}

impl LocalLatency {
    /// `position`: the config's place among the plugin's route configs, which names its
    /// record (as the prefix index's, prefix_cache/index.rs); `start_rate`: the token gate's
    /// starting prefill rate, the models' prior.
    pub fn new(
        position: usize,
        config: &RouteConfig,
        settings: LatencySettings,
        start_rate: u64,
    ) -> LocalLatency {
        let identity = format!("{position}\n{}", config.common.key_prefix);
        let mut l = LocalLatency {
            trust: Trust::new(settings),
            // No outbox: a merge here is one compare-and-swap update, done or not.
            shared: Shared::new(
                Book::new(shared::prior(&settings, start_rate)),
                String::new(),
            ),
            key: format!("ailb.lat.{:016x}", fnv1a(FNV_OFFSET, identity.as_bytes())),
            endpoints: config.endpoints.clone(),
            coefficients: Vec::new(),
            next_merge_ms: 0,
        };
        l.solve();
        l
    }

    /// The request's objectives when this worker's models place it (counted); None: the
    /// token gate does (`maxMAPE`, counted).
    pub fn objectives(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        ctx: u32,
    ) -> Option<Objectives> {
        let mape = self
            .shared
            .book
            .try_borrow()
            .ok()
            .and_then(|b| b.ttft_mape());
        self.trust.objectives(host, tel, ctx, mape)
    }

    /// The rule's answer for a request with `view`, among the endpoints `eligible` says may
    /// take it. The features are the ones its answer is learnt with (prefix_cache/local.rs).
    fn place(&self, view: &View, eligible: impl Fn(usize) -> bool, rule: &Rule) -> Option<Choice> {
        let candidates: Vec<Candidate> = (0..view.loads.len())
            .map(|at| Candidate {
                at,
                predicted: self.predict(at, view),
                load: view.loads.get(at).copied().unwrap_or(0),
                eligible: eligible(at),
            })
            .collect();
        choose(&candidates, view.warm.map(|(w, _)| w), rule)
    }

    /// What endpoint `at` is predicted to do with the request of `view`.
    fn predict(&self, at: usize, view: &View) -> Prediction {
        let features = features(at, view);
        match self.coefficients.get(at) {
            Some(c) => Prediction::from_coefficients(c, &features),
            None => Prediction {
                ttft_ms: 0.0,
                tpot_ms: 0.0,
            },
        }
    }

    /// The root tick: once per `mergeIntervalMs`, this worker's samples since its last merge
    /// go into the proxy's record in one compare-and-swap update (faded once per record by
    /// the half-life), the record's every pod comes back as this worker's models, and the
    /// coefficients the picks read are solved again. An update the host refuses (a CAS lost
    /// every time, a host error) keeps the samples for the next merge (counted).
    pub fn tick(&mut self, host: &mut dyn Host, tel: &mut Telemetry) {
        let now = host.now_ms();
        if now < self.next_merge_ms {
            return;
        }
        let settings = self.trust.settings;
        self.next_merge_ms = now.saturating_add(settings.merge_interval_ms);
        let Ok(mut book) = self.shared.book.try_borrow_mut() else {
            return;
        };
        let sent = book.take_unsent();
        drop(book);
        let merged = shared_data::update(host, &self.key, |cur| {
            let mut fleet = cur.as_deref().map(Fleet::parse).unwrap_or_default();
            fleet.merge(&sent, now, settings.half_life_ms);
            (fleet.encode(), fleet.pods)
        });
        let merged = merged.map_err(|e| e.to_string());
        if merged.is_err() {
            // Not merged: the samples go with the next merge.
            if let Ok(mut book) = self.shared.book.try_borrow_mut() {
                book.restore(&sent);
            }
        }
        self.shared.settle(host, tel, merged);
        self.solve();
    }

    /// Every endpoint's coefficients from the models as they are now (the fleet's prior for
    /// one without samples).
    fn solve(&mut self) {
        let Ok(book) = self.shared.book.try_borrow() else {
            return;
        };
        let all = book.coefficients();
        let fleet = all.last().map(|(_, c)| *c).unwrap_or_default();
        self.coefficients = self
            .endpoints
            .iter()
            .map(|e| all.iter().find(|(p, _)| p == e).map_or(fleet, |(_, c)| *c))
            .collect();
    }
}

/// The features of the request of `view` on endpoint `at`: the tokens booked there ahead of
/// it, its own uncached ones (the whole prompt but on the warm endpoint), the endpoint's load,
/// the prompt's tokens.
fn features(at: usize, view: &View) -> Features {
    let cached = match view.warm {
        Some((w, cached)) if w == at => cached,
        _ => 0,
    };
    Features {
        ahead_tokens: view.booked.get(at).copied().unwrap_or(0) as f64,
        uncached_tokens: view.prompt_tokens.saturating_sub(cached) as f64,
        running: view.loads.get(at).copied().unwrap_or(0) as f64,
        prompt_tokens: view.prompt_tokens as f64,
    }
}

/// Whether a request of `class` may be shed for a predicted miss: only the lowest of two or
/// more priority classes.
pub fn sheddable(config: &RouteConfig, class: Option<Class>) -> bool {
    match (&config.common.priority, class) {
        (Some(p), Some(c)) => p.sheddable(c.rank),
        _ => false,
    }
}

/// The latency models' choice for a request its session does not keep on its pod (a kept
/// session wins, as in the script): among the endpoints with room under `cap`, the saturated
/// and ejected ones (`hot`) left while another with room is not. None: the session keeps it,
/// or no endpoint may take it; the pick then goes on as without the models.
pub fn by_latency(
    l: &LocalLatency,
    rule: &Rule,
    state: &LocalPrefix,
    (loads, booked, hot, cap): (&[u64], &[u64], &[bool], u64),
    (known, session, tokens): (Option<Known>, Option<usize>, &PromptTokens),
) -> Option<Choice> {
    if session.is_some_and(|s| state.keeps(loads, cap, hot, s)) {
        return None;
    }
    let room = |e: usize| cap == 0 || loads.get(e).is_some_and(|&l| l < cap);
    let saturated = |e: usize| hot.get(e).copied().unwrap_or(false);
    let steer = (0..loads.len()).any(|e| room(e) && !saturated(e));
    let view = View {
        loads,
        booked,
        prompt_tokens: tokens.total,
        warm: known.map(|k| (k.endpoint, tokens.through(k.depth))),
    };
    l.place(&view, |e| room(e) && !(steer && saturated(e)), rule)
}

/// The reason of a request the models placed on `e`: a session that moved (or came back to
/// its pod), a prefix kept or left, or none known.
pub fn placed(e: usize, known: Option<Known>, session: Option<usize>) -> Reason {
    match (session, known) {
        (Some(s), _) if s == e => Reason::Session,
        (Some(_), _) => Reason::SessionRebound,
        (None, Some(k)) if k.endpoint == e => Reason::PrefixHit,
        (None, Some(_)) => Reason::PrefixSpill,
        (None, None) => Reason::PrefixMiss,
    }
}
