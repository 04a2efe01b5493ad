//! endpoint_metrics with Higress's host list as the source: the healthy hosts, each with the
//! metrics body of its health check, parsed only when that text changes (never per request);
//! the list itself is re-read at most every `hostListCacheMs`.

use super::report::{Report, Source};
use super::snapshot::clamp_u32;
use crate::balancer::telemetry::Telemetry;
use crate::config::MetricsConfig;
use crate::host::Host;
use crate::model_metrics::{engines, Candidate, EndpointMetrics};
use crate::reason::Cause;
use crate::stats::Counter;
use crate::upstream::{self, Health};
use std::collections::HashMap;
use std::rc::Rc;

/// Entries of the per-VM host-metrics cache before it is dropped wholesale (endpoint churn).
const HOST_CACHE_LIMIT: usize = 4096;
/// Clusters whose host list is cached before the cache is dropped wholesale.
const LIST_CACHE_LIMIT: usize = 64;
/// How long a pod that left the host list keeps its place on the sessions' ring, so that its
/// sessions count as rebound instead of as kept on the ring's next pod: the `sessionTTL`
/// default, after which no such session would have been kept anyway (docs/redis-data-model.md
/// §10, "endpoint_metrics without Redis").
pub const DEPARTED_KEEP_MS: u64 = 1_800_000;
/// Addresses remembered per cluster for the sessions' ring (present and departed); beyond it
/// the longest-gone are forgotten first.
pub const RING_MEMBERS_LIMIT: usize = 1024;

/// A host's last metrics text (by fingerprint) and what it parsed to.
struct HostEntry {
    fingerprint: u64,
    metrics: Option<Rc<EndpointMetrics>>,
    /// The proxy's sent counter for this host when this text was first seen.
    sent_base: u64,
}

#[derive(Default)]
pub struct HostList {
    hosts: HashMap<String, HostEntry>,
    /// Healthy hosts per cluster and when the host list was last read (`hostListCacheMs`).
    lists: HashMap<String, (u64, Rc<Vec<String>>)>,
    /// Per cluster, every address of its host list whatever its health, with when it was last
    /// listed: the sessions' ring members ([`HostList::ring_members`]).
    seen: HashMap<String, HashMap<String, u64>>,
    /// The ring members per cluster as of the last read (sorted).
    members: HashMap<String, Rc<Vec<String>>>,
    report: Report,
}

impl HostList {
    /// The healthy hosts of `cluster` with their metrics and the requests sent since.
    pub fn candidates(
        &mut self,
        host: &mut dyn Host,
        tel: &Telemetry,
        cluster: String,
        mc: &MetricsConfig,
        sent: &HashMap<String, u64>,
    ) -> Result<Vec<Candidate>, Cause> {
        let now = host.now_ms();
        let ttl = mc.host_list_cache_ms;
        let cached = self
            .lists
            .get(&cluster)
            .filter(|(at, _)| ttl > 0 && now.saturating_sub(*at) < ttl)
            .map(|(_, l)| l.clone());
        let list = match cached {
            Some(l) => l,
            None => {
                let l = Rc::new(self.read(host, tel, mc, sent, &cluster)?);
                if self.lists.len() > LIST_CACHE_LIMIT {
                    self.lists.clear();
                }
                self.lists.insert(cluster, (now, l.clone()));
                l
            }
        };
        let mut out = Vec::with_capacity(list.len());
        for addr in list.iter() {
            let Some(e) = self.hosts.get(addr) else {
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

    /// The addresses a session's home is taken among on `cluster` (sorted): its hosts as last
    /// read whatever their health, and those that left the list less than [`DEPARTED_KEEP_MS`]
    /// ago. A session whose home is among them but not healthy is rebound; since an address
    /// keeps its ring points whatever else joins or leaves, a VM that never saw a departed pod
    /// still sends that pod's sessions to the same next pod (docs/redis-data-model.md §10).
    pub fn ring_members(&self, cluster: &str) -> Option<Rc<Vec<String>>> {
        self.members.get(cluster).cloned()
    }

    /// Remembers the addresses listed now (any health) and forgets those gone too long.
    fn remember(&mut self, cluster: &str, now: u64, listed: &[&str]) {
        if self.seen.len() > LIST_CACHE_LIMIT && !self.seen.contains_key(cluster) {
            self.seen.clear();
            self.members.clear();
        }
        let seen = self.seen.entry(cluster.to_string()).or_default();
        for a in listed {
            seen.insert((*a).to_string(), now);
        }
        seen.retain(|_, at| now.saturating_sub(*at) < DEPARTED_KEEP_MS);
        if seen.len() > RING_MEMBERS_LIMIT {
            let mut gone: Vec<(u64, String)> = seen
                .iter()
                .filter(|(_, &at)| at != now)
                .map(|(a, &at)| (at, a.clone()))
                .collect();
            gone.sort_unstable();
            let excess = seen.len() - RING_MEMBERS_LIMIT;
            for (_, a) in gone.into_iter().take(excess) {
                seen.remove(&a);
            }
        }
        let mut members: Vec<String> = seen.keys().cloned().collect();
        members.sort_unstable();
        self.members.insert(cluster.to_string(), Rc::new(members));
    }

    /// Reads Higress's host list: the healthy addresses (sorted), each host's text parsed only
    /// when its fingerprint changed; remembers every listed address for the sessions' ring.
    fn read(
        &mut self,
        host: &mut dyn Host,
        tel: &Telemetry,
        mc: &MetricsConfig,
        sent: &HashMap<String, u64>,
        cluster: &str,
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
        if self.hosts.len() > HOST_CACHE_LIMIT {
            self.hosts.clear();
        }
        let listed: Vec<&str> = hosts.iter().map(|h| h.address).collect();
        self.remember(cluster, host.now_ms(), &listed);
        let mut out = Vec::with_capacity(hosts.len());
        for h in hosts.iter().filter(|h| h.health == Health::Healthy) {
            let now_sent = sent.get(h.address).copied().unwrap_or(0);
            let fp = upstream::quick_hash(h.raw_metrics) ^ extra_hash;
            let fresh = self
                .hosts
                .get(h.address)
                .is_some_and(|e| e.fingerprint == fp);
            if !fresh {
                let metrics = if h.raw_metrics.is_empty() {
                    None
                } else {
                    tel.inc(host, Counter::MetricsParsed);
                    upstream::unescape_json_string(h.raw_metrics).and_then(|text| {
                        let limit = upstream::HOST_METRICS_LIMIT;
                        let out = engines::scrape_page(text.as_bytes(), limit, mc.extra.as_ref());
                        let source = Source::HealthCheck { bytes: text.len() };
                        self.report.text(host, tel, h.address, source, &out);
                        out.result.ok().map(Rc::new)
                    })
                };
                self.hosts.insert(
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
}
