//! The VM's one view of its endpoints' model-server metrics, shared by every route that reads
//! them (endpoint_metrics, and a plain-Envoy prefix_cache's saturation guard): Higress's host
//! list, the scraper (one per VM, fed by the root tick and its callouts) and the snapshots it
//! publishes to every worker, and the ring sessions are hashed onto. The dispatcher owns it and
//! lends it to each decision (`Env::metrics`).

pub(crate) mod host_list;
mod report;
mod scrape;
pub mod snapshot;

use crate::balancer::policies::session;
use crate::balancer::telemetry::Telemetry;
use crate::config::{MetricsConfig, MetricsSource, PluginConfig, RouteConfig};
use crate::host::{self, Host};
use crate::model_metrics::{scheduler, Candidate};
use crate::prefix::chwbl::Ring;
use crate::reason::Cause;
use crate::upstream;
use host_list::HostList;
use scrape::Scraper;
use snapshot::SnapEntry;
use std::collections::HashMap;
use std::rc::Rc;

/// Higress's host list's ring members for sessions, when it has them.
pub type RingMembers = Option<Rc<Vec<String>>>;

/// The VM's endpoint metrics.
pub struct Metrics {
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

impl Metrics {
    pub fn new(config: &PluginConfig, seed: u64) -> Metrics {
        Metrics {
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

    /// The candidates of a request of `config` and their metrics, corrected by `sent`; with
    /// Higress's host list also the ring members of sessions (every listed pod whatever its
    /// health, and those that left recently).
    pub fn candidates(
        &mut self,
        host: &mut dyn Host,
        tel: &Telemetry,
        config: &RouteConfig,
        mc: &MetricsConfig,
        sent: &HashMap<String, u64>,
    ) -> (Result<Vec<Candidate>, Cause>, RingMembers) {
        match mc.source {
            MetricsSource::Host => {
                let cluster = host::text_property(host, "cluster_name").unwrap_or_default();
                let c = self
                    .host_list
                    .candidates(host, tel, cluster.clone(), mc, sent);
                (c, self.host_list.ring_members(&cluster))
            }
            MetricsSource::Scrape => (self.scraped_candidates(host, config, mc, sent), None),
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
    pub fn session_home(
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
        for e in ring.walk(session::ring_key(id)) {
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

    /// A plain-Envoy prefix_cache's metrics guard: for each of `config.endpoints`, whether its pod's
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
                // A rank endpoint reads its pod's page: the guard is per pod (docs/plain-envoy.md).
                let pod = crate::ranks::pod(addr);
                candidates
                    .iter()
                    .find(|c| c.addr == pod)
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
        let endpoints: Rc<Vec<String>> = if config.pods.is_empty() {
            let buf = host
                .upstream_hosts()
                .map_err(|_| Cause::HostListUnavailable)?;
            let list = upstream::decode_hosts(&buf).map_err(|_| Cause::HostListUnavailable)?;
            Rc::new(upstream::healthy_addresses(&list))
        } else {
            config.pods.clone()
        };
        let Some(ns) = mc.scrape_namespace(&config.pods) else {
            return Err(Cause::NoMetrics);
        };
        if config.pods.is_empty() {
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

/// A session's place on the consistent-hash ring ([`Metrics::session_home`]).
#[derive(Clone, Copy)]
pub struct Home {
    /// The first candidate of its walk (by position in the candidates).
    pub at: Option<usize>,
    /// Its home (the walk's first address) is not a candidate: unhealthy or gone.
    pub away: bool,
}
