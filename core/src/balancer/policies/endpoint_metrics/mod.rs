//! endpoint_metrics (GPU-aware): the candidates and their model-server metrics — Higress's host
//! list or this proxy's own scraper, published to every worker through shared data — corrected
//! by the requests this proxy sent since the metrics were taken, then the scheduler's choice
//! (docs/model-server-metrics.md). A request naming a session goes to its pod ahead of the
//! scheduler while that pod is not saturated: its consistent-hash pod (`Metrics::session_home`),
//! or with Redis (Higress build) the pod one script call keeps it bound to
//! (`pick::SessionPick`, [`reply`]; docs/redis-data-model.md §10). What is read lives in the
//! VM's one `Metrics` (balancer/metrics/), which the dispatcher owns and every route shares.

pub mod pick;
pub mod reply;
mod sessions;

use super::continuation::{self, Table};
use super::policy::{priority_class, Env, Input, Policy};
use super::session::{self, Body};
use crate::balancer::events::{Decision, Placement, Rejection};
use crate::balancer::metrics::snapshot::{self, SENT_KEY};
use crate::balancer::metrics::Home;
use crate::balancer::shared;
use crate::config::{MetricsConfig, RouteConfig};
use crate::host::Host;
use crate::model_metrics::{
    scheduler, Candidate, Decision as Choice, RateLimitWindow, RequestInfo,
};
use crate::reason::{Cause, Reason};
use crate::stats::Counter;
use pick::SessionPick;
use std::collections::HashMap;
use std::rc::Rc;

#[derive(serde::Deserialize)]
struct ModelOnly {
    #[serde(default)]
    model: Option<String>,
}

/// An endpoint_metrics route: its metrics settings, and with agent sessions and no Redis this
/// proxy's table of responses (continuation.rs). What it reads lives in the VM's one
/// [`Metrics`] (`Env::metrics`).
pub struct EndpointMetrics {
    config: Rc<MetricsConfig>,
    table: Option<Rc<Table>>,
}

impl EndpointMetrics {
    /// `position`: the config's place among the plugin's route configs (its table's name).
    pub fn new(position: usize, route: &RouteConfig, config: &Rc<MetricsConfig>) -> Self {
        EndpointMetrics {
            config: config.clone(),
            table: (route.agents.is_some() && route.redis.is_none())
                .then(|| Rc::new(Table::new(position, route))),
        }
    }
}

impl Policy for EndpointMetrics {
    /// Decides now, from metrics already parsed (never parsed per request).
    fn decide(&mut self, host: &mut dyn Host, mut env: Env, input: &Input) -> Decision {
        let mc = &*self.config;
        let config = input.config;
        let sent = sent_counts(host);
        // Higress's host list also names the pods that are not healthy (and this VM remembers
        // those that left): a session's home is taken among them too, so that its leaving
        // counts as a rebound (docs/redis-data-model.md §10).
        let (candidates, members) = env.metrics.candidates(host, env.tel, config, mc, &sent);
        let candidates = match candidates {
            Ok(c) if c.is_empty() => return Decision::Fallback(Cause::NoHealthyEndpoint),
            Ok(c) => c,
            Err(cause) => return Decision::Fallback(cause),
        };
        let body_bytes = if input.read_body { input.body_bytes } else { 0 };
        let model = request_model(host, mc, &candidates, body_bytes);
        let lora_adapter = model.as_deref().filter(|m| {
            candidates.iter().any(|c| {
                c.metrics
                    .as_ref()
                    .and_then(|x| x.lora.as_ref())
                    .is_some_and(|l| l.is_running(m) || l.is_waiting(m))
            })
        });
        let header_shed = host
            .request_header(&mc.criticality_header)
            .ok()
            .flatten()
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("sheddable"));
        let model_shed = model
            .as_deref()
            .is_some_and(|m| mc.sheddable_models.iter().any(|s| s == m));
        // Priority classes: the lowest class is sheddable by the engine metrics too (README
        // "Priority classes"); its 429 carries Retry-After and counts as a priority shed.
        let class_shed = priority_class(host, env.tel, input.ctx, config).is_some_and(|c| {
            config
                .common
                .priority
                .as_ref()
                .is_some_and(|p| p.is_lowest(c.rank))
        });
        let info = RequestInfo {
            model: model.as_deref().unwrap_or(""),
            lora_adapter,
            sheddable: header_shed || model_shed || class_shed,
        };
        let ns = mc
            .scrape_namespace(&config.pods)
            .unwrap_or_else(|| "host".to_string());
        // A session's pod wins while it has metrics that do not say saturated: the pod Redis
        // binds it to (Higress build, a route with Redis), else its consistent-hash pod, or a
        // continuation's recorded pod (sessions.rs).
        let body = Body::of(input.read_body, input.body_bytes);
        let who = session::identify(host, env.tel, config, body);
        let record = sessions::record(config, input.keys, self.table.as_ref(), who.answer);
        let bind = sessions::bind(config, input.keys, who.sticky.as_ref());
        let home = match (&who.sticky, &bind) {
            (Some(sticky), None) => {
                let table = self.table.as_ref();
                sessions::home(
                    host,
                    &mut env,
                    (&candidates, members.as_deref()),
                    sticky,
                    table,
                )
            }
            _ => None,
        };
        let kept = who.sticky.as_ref().map_or(Reason::Session, |s| s.kept());
        if let Some(Home { at: Some(h), away }) = home {
            if let Some(c) = candidates.get(h).filter(|c| keeps_session(c, mc)) {
                // Its home unhealthy or gone: the walk's next pod takes it, counted as moved.
                let (counter, reason) = if away {
                    (Counter::SessionRebound, Reason::SessionRebound)
                } else {
                    (Counter::SessionHit, kept)
                };
                env.tel.inc(host, counter);
                count_sent(host, &c.addr);
                let decision = Decision::Route {
                    place: Placement::on(c.addr.clone())
                        .with_fallbacks(fallback_order(&candidates, h)),
                    reason,
                    hold: None,
                };
                return continuation::hold(decision, record);
            }
        }
        let mut window = (mc.scheduler.rate_limit < 1.0).then(|| {
            let entries = host
                .shared_get(&snapshot::window_key(&ns))
                .ok()
                .flatten()
                .map(|(v, _)| snapshot::decode_window(&v))
                .unwrap_or_default();
            let s = &mc.scheduler;
            RateLimitWindow::restore(&entries, s.rate_window, s.rate_window_ms, host.now_ms())
        });
        let mut rng = || env.rng.next_u64();
        match scheduler::select(&candidates, &info, &mc.scheduler, window.as_mut(), &mut rng) {
            Choice::Pick {
                index,
                rate_limited,
            } => {
                let Some(chosen) = candidates.get(index) else {
                    return Decision::Fallback(Cause::NoMetrics);
                };
                if let Some(w) = &window {
                    // Last writer wins: a lost update only forgets one decision.
                    let bytes = snapshot::encode_window(&w.entries());
                    let _ = host.shared_set(&snapshot::window_key(&ns), &bytes, 0);
                }
                if rate_limited {
                    env.tel.inc(host, Counter::MetricsRateLimited);
                }
                if let Some((key, ttl_s, kind)) = bind {
                    // One script call keeps or binds the session; the reply routes.
                    let keep = candidates
                        .iter()
                        .filter(|c| keeps_session(c, mc))
                        .map(|c| c.addr.clone())
                        .collect();
                    return Decision::Acquire(Box::new(SessionPick {
                        config: config.clone(),
                        key: key.into(),
                        ttl_s,
                        kind,
                        choice: chosen.addr.clone(),
                        keep,
                        by_sha: true,
                        record,
                    }));
                }
                count_sent(host, &chosen.addr);
                // With a session: its pod was passed by (or the scheduler took it anyway, every
                // pod being as saturated).
                let reason = match home {
                    Some(Home { at, away: false }) if at == Some(index) => {
                        env.tel.inc(host, Counter::SessionHit);
                        kept
                    }
                    Some(_) => {
                        env.tel.inc(host, Counter::SessionRebound);
                        Reason::SessionRebound
                    }
                    None => Reason::Metrics,
                };
                let decision = Decision::Route {
                    place: Placement::on(chosen.addr.clone())
                        .with_fallbacks(fallback_order(&candidates, index)),
                    reason,
                    hold: None,
                };
                continuation::hold(decision, record)
            }
            Choice::Shed if class_shed => Decision::Reject(Rejection::ShedPriority),
            Choice::Shed => Decision::Reject(Rejection::Shed),
            Choice::NoMetrics => Decision::Fallback(Cause::NoMetrics),
            Choice::NoCandidates => Decision::Fallback(Cause::NoHealthyEndpoint),
        }
    }
}

/// Whether a session stays on candidate `c`: it has metrics (a pod never scraped, failed, stale
/// or of an unknown engine is not kept) and they do not say saturated by the scheduler's rule
/// ([`scheduler::is_saturated`]: waiting over `queueThresholdCritical`, KV use over
/// `kvCacheThreshold`). Read as scraped, without the sent-since-scrape correction: that
/// correction counts every request sent since the scrape as queued (it never learns they
/// finished), so one session's quick turns would read as a queue and move it between two
/// scrapes; a real queue shows in the next scrape (the plain-Envoy prefix guard reads the
/// metrics the same way).
fn keeps_session(c: &Candidate, mc: &MetricsConfig) -> bool {
    let scraped = Candidate {
        addr: String::new(),
        metrics: c.metrics.clone(),
        in_flight_since_scrape: 0,
    };
    scheduler::is_saturated(&scraped, &mc.scheduler) == Some(false)
}

/// Requests this proxy sent to each endpoint since it started (the in-flight correction's base).
fn sent_counts(host: &dyn Host) -> HashMap<String, u64> {
    host.shared_get(SENT_KEY)
        .ok()
        .flatten()
        .map(|(v, _)| shared::decode_counts(&v))
        .unwrap_or_default()
}

/// The choice is made in this proxy: count it as sent (the in-flight correction).
pub fn count_sent(host: &mut dyn Host, endpoint: &str) {
    let _ = shared::update(host, SENT_KEY, |cur| {
        let mut m = cur
            .as_deref()
            .map(shared::decode_counts)
            .unwrap_or_default();
        *m.entry(endpoint.to_string()).or_insert(0) += 1;
        (shared::encode_counts(&m), ())
    });
}

/// The request's `model`, read from the body only when something needs it (sheddable models,
/// LoRA affinity) and the body is visible.
fn request_model(
    host: &dyn Host,
    mc: &MetricsConfig,
    candidates: &[Candidate],
    body_bytes: usize,
) -> Option<String> {
    let needs = !mc.sheddable_models.is_empty()
        || candidates
            .iter()
            .any(|c| c.metrics.as_ref().is_some_and(|m| m.lora.is_some()));
    if !needs || body_bytes == 0 {
        return None;
    }
    let body = host.request_body(0, body_bytes).ok()?;
    serde_json::from_slice::<ModelOnly>(&body).ok()?.model
}

/// The other endpoints with metrics, least loaded first: the override list's fallbacks.
fn fallback_order(candidates: &[Candidate], chosen: usize) -> Vec<String> {
    let mut rest: Vec<(f64, f64, &str)> = candidates
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != chosen)
        .filter_map(|(_, c)| {
            let m = c.metrics.as_ref()?;
            let (waiting, running) = scheduler::effective_load(m, c.in_flight_since_scrape, None);
            Some((
                waiting,
                running + m.kv_usage.unwrap_or(0.0),
                c.addr.as_str(),
            ))
        })
        .collect();
    rest.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then(a.1.total_cmp(&b.1))
            .then(a.2.cmp(b.2))
    });
    rest.into_iter().map(|(_, _, a)| a.to_string()).collect()
}

#[cfg(test)]
pub(crate) mod tests;
