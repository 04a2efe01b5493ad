//! endpoint_metrics (GPU-aware): the candidates and their model-server metrics — Higress's host
//! list ([`host_list`]) or this proxy's own scraper ([`scrape`], published to every worker
//! through shared data, [`snapshot`]) — corrected by the requests this proxy sent since the
//! metrics were taken, then the scheduler's choice (docs/model-server-metrics.md). A request
//! naming a session goes to its pod ahead of the scheduler while that pod is not saturated: its
//! consistent-hash pod ([`EndpointMetrics::session_home`]), or with Redis (Higress build) the pod
//! one script call keeps it bound to (`pick::SessionPick`; docs/redis-data-model.md §10).

mod host_list;
mod report;
mod scrape;
mod snapshot;

use super::input::{priority_class, Env, Input};
use crate::balancer::pick::{Pick, SessionPick};
use crate::balancer::request::{Decision, Rejection};
use crate::balancer::shared;
use crate::balancer::telemetry::Telemetry;
use crate::config::{MetricsConfig, MetricsSource, PluginConfig, RouteConfig};
use crate::host::{self, Host};
use crate::model_metrics::{
    scheduler, Candidate, Decision as Choice, RateLimitWindow, RequestInfo,
};
use crate::prefix::chwbl::Ring;
use crate::reason::{Cause, Reason};
use crate::redis::scripts;
use crate::stats::Counter;
use crate::upstream;
use host_list::HostList;
use scrape::Scraper;
use snapshot::{SnapEntry, SENT_KEY};
use std::collections::HashMap;
use std::rc::Rc;

#[derive(serde::Deserialize)]
struct ModelOnly {
    #[serde(default)]
    model: Option<String>,
}

/// Per-VM state of the policy.
pub struct EndpointMetrics {
    host_list: HostList,
    /// Decoded scrape snapshots by namespace, with the shared-data CAS they were read at.
    snapshots: HashMap<String, (u32, Rc<HashMap<String, SnapEntry>>)>,
    /// Fingerprint of the target list this VM last published, per namespace (Higress scrape).
    targets: HashMap<String, String>,
    scraper: Scraper,
    /// Sessions: the ring of the last candidate list seen, with that list's fingerprint (the
    /// healthy set changes rarely; the ring is rebuilt only then).
    ring: Option<(String, Rc<Ring>)>,
}

impl EndpointMetrics {
    pub fn new(config: &PluginConfig, seed: u64) -> EndpointMetrics {
        EndpointMetrics {
            host_list: HostList::default(),
            snapshots: HashMap::new(),
            targets: HashMap::new(),
            scraper: Scraper::new(config, seed),
            ring: None,
        }
    }

    pub fn tick_ms(&self) -> u32 {
        self.scraper.tick_ms()
    }

    pub fn on_tick(&mut self, host: &mut dyn Host, tel: &Telemetry) {
        self.scraper.on_tick(host, tel);
    }

    pub fn on_http_response(
        &mut self,
        host: &mut dyn Host,
        tel: &Telemetry,
        token: u32,
        body_size: usize,
    ) {
        self.scraper.on_http_response(host, tel, token, body_size);
    }

    /// Decides now, from metrics already parsed (never parsed per request).
    pub fn decide(
        &mut self,
        host: &mut dyn Host,
        env: Env,
        input: &Input,
        mc: &MetricsConfig,
    ) -> Decision {
        let config = input.config;
        let sent = sent_counts(host);
        // Higress's host list also names the pods that are not healthy (and this VM remembers
        // those that left): a session's home is taken among them too, so that its leaving
        // counts as a rebound (docs/redis-data-model.md §10).
        let (candidates, members) = match mc.source {
            MetricsSource::Host => {
                let cluster = host::text_property(host, "cluster_name").unwrap_or_default();
                let c = self
                    .host_list
                    .candidates(host, env.tel, cluster.clone(), mc, &sent);
                (c, self.host_list.ring_members(&cluster))
            }
            MetricsSource::Scrape => (self.scraped_candidates(host, config, mc, &sent), None),
        };
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
        let class_shed = priority_class(host, env.tel, config).is_some_and(|c| {
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
            .scrape_namespace(&config.endpoints)
            .unwrap_or_else(|| "host".to_string());
        // A session's pod wins while it has metrics that do not say saturated: the pod Redis
        // binds it to (Higress build, a route with Redis), else its consistent-hash pod.
        let session = config.session.as_ref().and_then(|s| {
            let id =
                super::session::session_id(&*host, s, input.read_body.then_some(input.body_bytes))?;
            Some((s, id))
        });
        let bind = match (&session, input.keys, &config.redis) {
            (Some((s, id)), Some(keys), Some(_)) => {
                Some((scripts::session_key(&keys.namespace, id), s.ttl_s))
            }
            _ => None,
        };
        let home = match (&session, &bind) {
            (Some((_, id)), None) => Some(self.session_home(&candidates, members.as_deref(), id)),
            _ => None,
        };
        if let Some(Home { at: Some(h), away }) = home {
            if let Some(c) = candidates.get(h).filter(|c| keeps_session(c, mc)) {
                // Its home unhealthy or gone: the walk's next pod takes it, counted as moved.
                let (counter, reason) = if away {
                    (Counter::SessionRebound, Reason::SessionRebound)
                } else {
                    (Counter::SessionHit, Reason::Session)
                };
                env.tel.inc(host, counter);
                count_sent(host, &c.addr);
                return Decision::Route {
                    endpoint: c.addr.clone(),
                    fallbacks: fallback_order(&candidates, h),
                    reason,
                    hold: None,
                };
            }
        }
        let mut window = (mc.scheduler.rate_limit < 1.0).then(|| {
            let h = host
                .shared_get(&snapshot::window_key(&ns))
                .ok()
                .flatten()
                .map(|(v, _)| snapshot::decode_window(&v))
                .unwrap_or_default();
            RateLimitWindow::from_hashes(&h)
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
                    let bytes = snapshot::encode_window(&w.hashes());
                    let _ = host.shared_set(&snapshot::window_key(&ns), &bytes, 0);
                }
                if rate_limited {
                    env.tel.inc(host, Counter::MetricsRateLimited);
                }
                if let Some((key, ttl_s)) = bind {
                    // One script call keeps or binds the session; the reply routes.
                    let keep = candidates
                        .iter()
                        .filter(|c| keeps_session(c, mc))
                        .map(|c| c.addr.clone())
                        .collect();
                    return Decision::Acquire(Box::new(Pick::Session(SessionPick {
                        config: config.clone(),
                        key: key.into(),
                        ttl_s,
                        choice: chosen.addr.clone(),
                        keep,
                        by_sha: true,
                    })));
                }
                count_sent(host, &chosen.addr);
                // With a session: its pod was passed by (or the scheduler took it anyway, every
                // pod being as saturated).
                let reason = match home {
                    Some(Home { at, away: false }) if at == Some(index) => {
                        env.tel.inc(host, Counter::SessionHit);
                        Reason::Session
                    }
                    Some(_) => {
                        env.tel.inc(host, Counter::SessionRebound);
                        Reason::SessionRebound
                    }
                    None => Reason::Metrics,
                };
                Decision::Route {
                    endpoint: chosen.addr.clone(),
                    fallbacks: fallback_order(&candidates, index),
                    reason,
                    hold: None,
                }
            }
            Choice::Shed if class_shed => Decision::Reject(Rejection::ShedPriority),
            Choice::Shed => Decision::Reject(Rejection::Shed),
            Choice::NoMetrics => Decision::Fallback(Cause::NoMetrics),
            Choice::NoCandidates => Decision::Fallback(Cause::NoHealthyEndpoint),
        }
    }

    /// The session's pod among `candidates`: its id's walk over the CHWBL ring of the ring
    /// members (`session::ring_key`, the rule plain-Envoy global_least_request uses), where
    /// `members` (Higress's host list: every listed pod whatever its health, and those that
    /// left recently, `host_list::DEPARTED_KEEP_MS`) joins the candidates. The walk's first
    /// address is the session's home; when that is not a candidate (unhealthy or gone) the
    /// walk's first candidate takes it and the session counts as rebound. An address keeps its
    /// points whatever else joins or leaves, so every worker and every gateway that sees the
    /// same healthy set puts a session on the same pod without storing a binding, whether or
    /// not it remembers a departed pod, and only the sessions of a departed pod move
    /// (docs/redis-data-model.md §10).
    fn session_home(
        &mut self,
        candidates: &[Candidate],
        members: Option<&Vec<String>>,
        id: &[u8],
    ) -> Home {
        // The members (sorted) already hold every listed pod, the healthy candidates among
        // them: taken as they are, with no per-request copy, unless a candidate is missing.
        let covered =
            members.filter(|m| candidates.iter().all(|c| m.binary_search(&c.addr).is_ok()));
        let merged: Vec<String>;
        let addrs: &[String] = match covered {
            Some(m) => m,
            None => {
                let mut a: Vec<String> = candidates.iter().map(|c| c.addr.clone()).collect();
                if let Some(m) = members {
                    a.extend(m.iter().cloned());
                    a.sort_unstable();
                    a.dedup();
                }
                merged = a;
                &merged
            }
        };
        let fp = upstream::fingerprint(addrs);
        let ring = match &self.ring {
            Some((f, ring)) if *f == fp => ring.clone(),
            _ => {
                let ring = Rc::new(Ring::new(addrs));
                self.ring = Some((fp, ring.clone()));
                ring
            }
        };
        // The walk's first step is usually a candidate: a scan per step, no index built.
        let mut away = false;
        for e in ring.walk(super::session::ring_key(id)) {
            let Some(addr) = addrs.get(e) else {
                break;
            };
            match candidates.iter().position(|c| c.addr == *addr) {
                Some(at) => return Home { at: Some(at), away },
                None => away = true,
            }
        }
        Home { at: None, away }
    }

    /// A plain-Envoy prefix_cache's metrics guard: for each of `config.endpoints`, whether its
    /// scraped metrics say it is saturated ([`scheduler::is_saturated`]); unknown or stale
    /// metrics never are (fail open). Read as scraped, without the sent-since-scrape
    /// correction: the guard's other half is this proxy's in-flight load already, and the
    /// correction (every request sent since the scrape queues, unless `maxRunningHint` says
    /// there is room) would call a busy but healthy pod saturated between two scrapes.
    pub fn saturated(
        &mut self,
        host: &mut dyn Host,
        config: &RouteConfig,
        mc: &MetricsConfig,
    ) -> Vec<bool> {
        let candidates = self
            .scraped_candidates(host, config, mc, &HashMap::new())
            .unwrap_or_default();
        config
            .endpoints
            .iter()
            .map(|addr| {
                candidates
                    .iter()
                    .find(|c| c.addr == *addr)
                    .and_then(|c| scheduler::is_saturated(c, &mc.scheduler))
                    .unwrap_or(false)
            })
            .collect()
    }

    /// The scraper's snapshot (decoded again only when its CAS moved); stale entries unknown.
    fn scraped_candidates(
        &mut self,
        host: &mut dyn Host,
        config: &RouteConfig,
        mc: &MetricsConfig,
        sent: &HashMap<String, u64>,
    ) -> Result<Vec<Candidate>, Cause> {
        let endpoints: Rc<Vec<String>> = if config.endpoints.is_empty() {
            let buf = host
                .upstream_hosts()
                .map_err(|_| Cause::HostListUnavailable)?;
            let list = upstream::decode_hosts(&buf).map_err(|_| Cause::HostListUnavailable)?;
            Rc::new(upstream::healthy_addresses(&list))
        } else {
            config.endpoints.clone()
        };
        let Some(ns) = mc.scrape_namespace(&config.endpoints) else {
            return Err(Cause::NoMetrics);
        };
        if config.endpoints.is_empty() {
            self.publish_targets(host, &ns, &endpoints);
        }
        let snap = self.snapshot(host, &ns);
        let max_age = mc.scrape.as_ref().map_or(0, |s| s.max_age_ms);
        let now = host.now_ms();
        Ok(endpoints
            .iter()
            .map(|addr| {
                let entry = snap
                    .get(addr)
                    .filter(|e| now.saturating_sub(e.at_ms) <= max_age);
                let now_sent = sent.get(addr).copied().unwrap_or(0);
                Candidate {
                    addr: addr.clone(),
                    metrics: entry.and_then(|e| e.metrics.clone()),
                    in_flight_since_scrape: snapshot::clamp_u32(
                        now_sent.saturating_sub(entry.map_or(now_sent, |e| e.sent_base)),
                    ),
                }
            })
            .collect())
    }

    /// Higress scrape mode: the scraper learns the pods from the requests' host lists.
    fn publish_targets(&mut self, host: &mut dyn Host, ns: &str, endpoints: &[String]) {
        let fp = upstream::fingerprint(endpoints);
        if self.targets.get(ns) == Some(&fp) {
            return;
        }
        let value = endpoints.join("\n");
        if host
            .shared_set(&snapshot::targets_key(ns), value.as_bytes(), 0)
            .is_ok()
        {
            self.targets.insert(ns.to_string(), fp);
        }
    }

    fn snapshot(&mut self, host: &mut dyn Host, ns: &str) -> Rc<HashMap<String, SnapEntry>> {
        let Ok(Some((bytes, cas))) = host.shared_get(&snapshot::snapshot_key(ns)) else {
            return Rc::new(HashMap::new());
        };
        if let Some((c, snap)) = self.snapshots.get(ns) {
            if *c == cas {
                return snap.clone();
            }
        }
        let snap = Rc::new(snapshot::decode_snapshot(&bytes));
        self.snapshots.insert(ns.to_string(), (cas, snap.clone()));
        snap
    }
}

/// A session's place on the consistent-hash ring ([`EndpointMetrics::session_home`]).
#[derive(Clone, Copy)]
struct Home {
    /// The first candidate of its walk (by position in the candidates).
    at: Option<usize>,
    /// Its home (the walk's first address) is not a candidate: unhealthy or gone.
    away: bool,
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
