//! endpoint_metrics: the candidates and their metrics (Higress's host list, parsed only when a
//! host's text changes, or the scraper's shared snapshot), the in-flight correction from the
//! proxy's sent counters, selection, and publishing the choice.

use super::scrape::ScrapeState;
use super::shared::{self, SnapEntry, SENT_KEY};
use super::{Balancer, Verdict};
use crate::config::{MetricsConfig, MetricsSource, PluginConfig, RouteConfig};
use crate::host::{Host, LogLevel};
use crate::model_metrics::{
    engines, scheduler, Candidate, Decision, EndpointMetrics, RateLimitWindow, RequestInfo,
};
use crate::request::Phase;
use crate::stats::{Cause, Counter, Outcome};
use crate::upstream::{self, Health};
use std::collections::HashMap;
use std::rc::Rc;

/// Entries of the per-VM host-metrics cache before it is dropped wholesale (endpoint churn).
const HOST_CACHE_LIMIT: usize = 4096;

/// A host's last metrics text (by fingerprint) and what it parsed to.
struct HostEntry {
    fingerprint: u64,
    metrics: Option<Rc<EndpointMetrics>>,
    /// The proxy's sent counter for this host when this text was first seen.
    sent_base: u64,
}

/// Per-VM state of the policy.
pub(super) struct MetricsState {
    hosts: HashMap<String, HostEntry>,
    /// Healthy hosts per cluster and when the host list was last read (`hostListCacheMs`).
    host_lists: HashMap<String, (u64, Rc<Vec<String>>)>,
    /// Decoded scrape snapshots by namespace, with the shared-data CAS they were read at.
    snapshots: HashMap<String, (u32, Rc<HashMap<String, SnapEntry>>)>,
    /// Fingerprint of the target list this VM last published, per namespace (Higress scrape).
    targets: HashMap<String, String>,
    pub(super) scrape: ScrapeState,
}

impl MetricsState {
    pub(super) fn new(config: &PluginConfig, seed: u64) -> MetricsState {
        MetricsState {
            hosts: HashMap::new(),
            host_lists: HashMap::new(),
            snapshots: HashMap::new(),
            targets: HashMap::new(),
            scrape: ScrapeState::new(config, seed),
        }
    }
}

pub(super) fn snapshot_key(ns: &str) -> String {
    format!("ailb.snap.{ns}")
}

pub(super) fn targets_key(ns: &str) -> String {
    format!("ailb.targets.{ns}")
}

fn window_key(ns: &str) -> String {
    format!("ailb.rl.{ns}")
}

#[derive(serde::Deserialize)]
struct ModelOnly {
    #[serde(default)]
    model: Option<String>,
}

impl Balancer {
    /// endpoint_metrics: decide now, from metrics already parsed (never parsed per request).
    pub(super) fn decide_metrics(&mut self, host: &mut dyn Host, ctx: u32) -> Verdict {
        let Some(req) = self.requests.get(&ctx) else {
            return Verdict::Continue;
        };
        let (config, body_bytes) = (req.config.clone(), req.body_bytes);
        let Some(mc) = config.policy.metrics().cloned() else {
            return self.fail(host, ctx, Cause::NoMetrics, false);
        };
        let sent = host
            .shared_get(SENT_KEY)
            .ok()
            .flatten()
            .map(|(v, _)| shared::decode_counts(&v))
            .unwrap_or_default();
        let candidates = match mc.source {
            MetricsSource::Host => self.host_candidates(host, &mc, &sent),
            MetricsSource::Scrape => self.scraped_candidates(host, &config, &mc, &sent),
        };
        let candidates = match candidates {
            Ok(c) if c.is_empty() => return self.fail(host, ctx, Cause::NoHealthyEndpoint, false),
            Ok(c) => c,
            Err(cause) => return self.fail(host, ctx, cause, false),
        };
        let model = self.request_model(host, &mc, &candidates, body_bytes);
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
        let info = RequestInfo {
            model: model.as_deref().unwrap_or(""),
            lora_adapter,
            sheddable: header_shed || model_shed,
        };
        let ns = mc
            .scrape_namespace(&config.endpoints)
            .unwrap_or_else(|| "host".to_string());
        let mut window = (mc.scheduler.rate_limit < 1.0).then(|| {
            let h = host
                .shared_get(&window_key(&ns))
                .ok()
                .flatten()
                .map(|(v, _)| shared::decode_window(&v))
                .unwrap_or_default();
            RateLimitWindow::from_hashes(&h)
        });
        let mut rng = || self.random();
        let decision =
            scheduler::select(&candidates, &info, &mc.scheduler, window.as_mut(), &mut rng);
        match decision {
            Decision::Pick {
                index,
                rate_limited,
            } => {
                let Some(chosen) = candidates.get(index) else {
                    return self.fail(host, ctx, Cause::NoMetrics, false);
                };
                if let Some(w) = &window {
                    // Last writer wins: a lost update only forgets one decision.
                    let _ =
                        host.shared_set(&window_key(&ns), &shared::encode_window(&w.hashes()), 0);
                }
                if rate_limited {
                    self.stats.inc(host, Counter::MetricsRateLimited);
                }
                let fallbacks = fallback_order(&candidates, index);
                self.routed_locally(
                    host,
                    ctx,
                    &config,
                    &chosen.addr,
                    &fallbacks,
                    "metrics",
                    None,
                )
            }
            Decision::Shed => {
                self.count(host, config.policy.kind(), Outcome::Rejected429);
                self.set_phase(ctx, Phase::Settled { reason: "shed_429" });
                let body =
                    b"Every endpoint is saturated: sheddable request rejected by ai-load-balancer.";
                let _ = host.send_local_response(429, "ai_lb_shed", body);
                Verdict::Pause
            }
            Decision::NoMetrics => self.fail(host, ctx, Cause::NoMetrics, false),
            Decision::NoCandidates => self.fail(host, ctx, Cause::NoHealthyEndpoint, false),
        }
    }

    /// Higress's host list: healthy hosts, each with its metrics text parsed once per change.
    fn host_candidates(
        &mut self,
        host: &mut dyn Host,
        mc: &MetricsConfig,
        sent: &HashMap<String, u64>,
    ) -> Result<Vec<Candidate>, Cause> {
        let cluster = super::text_property(host, "cluster_name").unwrap_or_default();
        let now = host.now_ms();
        let ttl = mc.host_list_cache_ms;
        let cached = self
            .metrics
            .host_lists
            .get(&cluster)
            .filter(|(at, _)| ttl > 0 && now.saturating_sub(*at) < ttl)
            .map(|(_, l)| l.clone());
        let list = match cached {
            Some(l) => l,
            None => {
                let l = Rc::new(self.read_host_list(host, mc, sent)?);
                if self.metrics.host_lists.len() > 64 {
                    self.metrics.host_lists.clear();
                }
                self.metrics.host_lists.insert(cluster, (now, l.clone()));
                l
            }
        };
        let mut out = Vec::with_capacity(list.len());
        for addr in list.iter() {
            let Some(e) = self.metrics.hosts.get(addr) else {
                continue;
            };
            let now_sent = sent.get(addr).copied().unwrap_or(0);
            out.push(Candidate {
                addr: addr.clone(),
                metrics: e.metrics.as_deref().cloned(),
                in_flight_since_scrape: clamp_u32(now_sent.saturating_sub(e.sent_base)),
            });
        }
        Ok(out)
    }

    /// Reads Higress's host list: the healthy addresses (sorted), each host's text parsed only
    /// when its fingerprint changed.
    fn read_host_list(
        &mut self,
        host: &mut dyn Host,
        mc: &MetricsConfig,
        sent: &HashMap<String, u64>,
    ) -> Result<Vec<String>, Cause> {
        let buf = host
            .upstream_hosts()
            .map_err(|_| Cause::HostListUnavailable)?;
        let hosts =
            upstream::decode_hosts_with_metrics(&buf).map_err(|_| Cause::HostListUnavailable)?;
        let extra_hash = mc
            .extra
            .as_ref()
            .map_or(0, |x| upstream::quick_hash(x.name.as_bytes()));
        if self.metrics.hosts.len() > HOST_CACHE_LIMIT {
            self.metrics.hosts.clear();
        }
        let mut out = Vec::with_capacity(hosts.len());
        for h in hosts.iter().filter(|h| h.health == Health::Healthy) {
            let now_sent = sent.get(h.address).copied().unwrap_or(0);
            let fp = upstream::quick_hash(h.raw_metrics) ^ extra_hash;
            let fresh = self
                .metrics
                .hosts
                .get(h.address)
                .is_some_and(|e| e.fingerprint == fp);
            if !fresh {
                let metrics = if h.raw_metrics.is_empty() {
                    None
                } else {
                    self.stats.inc(host, Counter::MetricsParsed);
                    upstream::unescape_json_string(h.raw_metrics)
                        .and_then(|text| engines::scrape(text.as_bytes(), mc.extra.as_ref()).0.ok())
                        .map(Rc::new)
                };
                self.metrics.hosts.insert(
                    h.address.to_string(),
                    HostEntry {
                        fingerprint: fp,
                        metrics,
                        sent_base: now_sent,
                    },
                );
            }
            out.push(h.address.to_string());
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
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
                    in_flight_since_scrape: clamp_u32(
                        now_sent.saturating_sub(entry.map_or(now_sent, |e| e.sent_base)),
                    ),
                }
            })
            .collect())
    }

    /// Higress scrape mode: the scraper learns the pods from the requests' host lists.
    fn publish_targets(&mut self, host: &mut dyn Host, ns: &str, endpoints: &[String]) {
        let fp = upstream::fingerprint(endpoints);
        if self.metrics.targets.get(ns) == Some(&fp) {
            return;
        }
        let value = endpoints.join("\n");
        if host
            .shared_set(&targets_key(ns), value.as_bytes(), 0)
            .is_ok()
        {
            self.metrics.targets.insert(ns.to_string(), fp);
        }
    }

    pub(super) fn snapshot(
        &mut self,
        host: &mut dyn Host,
        ns: &str,
    ) -> Rc<HashMap<String, SnapEntry>> {
        let Ok(Some((bytes, cas))) = host.shared_get(&snapshot_key(ns)) else {
            return Rc::new(HashMap::new());
        };
        if let Some((c, snap)) = self.metrics.snapshots.get(ns) {
            if *c == cas {
                return snap.clone();
            }
        }
        let snap = Rc::new(shared::decode_snapshot(&bytes));
        self.metrics
            .snapshots
            .insert(ns.to_string(), (cas, snap.clone()));
        snap
    }

    /// The request's `model`, read from the body only when something needs it (sheddable
    /// models, LoRA affinity) and the body is visible (Higress build).
    fn request_model(
        &self,
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

    /// The choice is made in this proxy: count it as sent (in-flight correction), publish it,
    /// and let the request go.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn routed_locally(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        config: &Rc<RouteConfig>,
        endpoint: &str,
        fallbacks: &[&str],
        reason: &'static str,
        local: Option<crate::request::LocalLease>,
    ) -> Verdict {
        if config.policy.metrics().is_some() {
            let ep = endpoint.to_string();
            let _ = shared::update(host, SENT_KEY, |cur| {
                let mut m = cur.map(shared::decode_counts).unwrap_or_default();
                *m.entry(ep.clone()).or_insert(0) += 1;
                (shared::encode_counts(&m), ())
            });
        }
        if let Err(cause) = self.publish(host, ctx, config, endpoint, fallbacks) {
            if let Some(l) = local {
                self.release_local(host, l);
            }
            return self.fail(host, ctx, cause, false);
        }
        if config.detail_log && self.log_level as u32 <= LogLevel::Debug as u32 {
            self.log(
                host,
                LogLevel::Debug,
                ctx,
                format_args!("routed to {endpoint} ({reason})"),
            );
        }
        self.set_phase(
            ctx,
            Phase::Picked {
                endpoint: endpoint.to_string(),
                reason,
                local,
            },
        );
        self.count(host, config.policy.kind(), Outcome::Routed);
        Verdict::Continue
    }
}

/// The other endpoints with metrics, least loaded first: the override list's fallbacks.
fn fallback_order(candidates: &[Candidate], chosen: usize) -> Vec<&str> {
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
    rest.into_iter().map(|(_, _, a)| a).collect()
}

fn clamp_u32(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
