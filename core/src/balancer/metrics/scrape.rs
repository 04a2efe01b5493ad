//! The scraper: on each tick, the VM holding the shared-data lease of a scrape target (one per
//! proxy process) sends one `GET /metrics` callout per pod from the root context; each answer
//! is parsed once, here, and the snapshot is written to shared data for every worker VM.

use super::report::{Report, Source};
use super::snapshot::{self, snapshot_key, targets_key, SnapEntry, SENT_KEY};
use crate::balancer::shared;
use crate::balancer::telemetry::Telemetry;
use crate::config::{MetricsConfig, MetricsSource, PluginConfig};
use crate::host::{Host, LogLevel};
use crate::model_metrics::engines;
use crate::stats::Counter;
use std::collections::HashMap;
use std::rc::Rc;

/// Largest scrape body read (the parser is bounded too; this bounds the copy). A body this long
/// is read as cut there (`engines::scrape_page`).
const MAX_SCRAPE_BYTES: usize = 4 << 20;

/// One scrape target (pods × path × cluster), shared by every route that scrapes it the same way.
struct ScrapeJob {
    ns: String,
    config: Rc<MetricsConfig>,
    /// Plain Envoy: the configured pods. Empty: the pods the workers published (Higress).
    endpoints: Rc<Vec<String>>,
    next_due: u64,
    leader: bool,
    /// The snapshot this VM writes while it holds the lease.
    snapshot: HashMap<String, SnapEntry>,
    /// Pods with a callout in flight: token and start time.
    in_flight: HashMap<String, (u32, u64)>,
    /// Answers received since the snapshot was last published.
    dirty: bool,
    /// The current round (one per due tick) and how many of its callouts are unanswered.
    round: u64,
    round_left: usize,
}

struct PendingScrape {
    job: usize,
    addr: String,
    sent_base: u64,
    round: u64,
}

pub struct Scraper {
    jobs: Vec<ScrapeJob>,
    pending: HashMap<u32, PendingScrape>,
    vm_id: String,
    tick_ms: u32,
    report: Report,
}

impl Scraper {
    pub fn new(config: &PluginConfig, seed: u64) -> Scraper {
        let mut jobs: Vec<ScrapeJob> = Vec::new();
        for c in config.all() {
            let Some(mc) = c.policy.metrics() else {
                continue;
            };
            if mc.source != MetricsSource::Scrape {
                continue;
            }
            let Some(ns) = mc.scrape_namespace(&c.pods) else {
                continue;
            };
            if jobs.iter().any(|j| j.ns == ns) {
                continue;
            }
            jobs.push(ScrapeJob {
                ns,
                config: mc.clone(),
                endpoints: c.pods.clone(),
                next_due: 0,
                leader: false,
                snapshot: HashMap::new(),
                in_flight: HashMap::new(),
                dirty: false,
                round: 0,
                round_left: 0,
            });
        }
        let tick_ms = jobs
            .iter()
            .filter_map(|j| j.config.scrape.as_ref().map(|s| s.interval_ms))
            .min()
            .unwrap_or(0);
        Scraper {
            jobs,
            pending: HashMap::new(),
            vm_id: format!("{seed:016x}"),
            tick_ms,
            report: Report::default(),
        }
    }

    /// The root tick period the scraper needs (its shortest interval), 0 when nothing is
    /// scraped. A shorter tick is fine: a target is scraped only when due.
    pub fn tick_ms(&self) -> u32 {
        self.tick_ms
    }

    /// Root context tick: for each due target whose lease this VM holds, scrape every pod.
    pub fn on_tick(&mut self, host: &mut dyn Host, tel: &Telemetry) {
        let now = host.now_ms();
        for i in 0..self.jobs.len() {
            self.tick_job(host, tel, i, now);
        }
    }

    fn tick_job(&mut self, host: &mut dyn Host, tel: &Telemetry, i: usize, now: u64) {
        // Backstop: answers of a round whose last callout is still pending are published now.
        self.publish_snapshot(host, i);
        let vm_id = self.vm_id.clone();
        let Some(job) = self.jobs.get_mut(i) else {
            return;
        };
        let Some(sc) = job.config.scrape.clone() else {
            return;
        };
        // A quarter interval of slack: ticks are not exact.
        if now + u64::from(sc.interval_ms / 4) < job.next_due {
            return;
        }
        job.next_due = now + u64::from(sc.interval_ms);
        // Callouts the host never answered (it always should) stop blocking their pod.
        let limit = u64::from(sc.timeout_ms) + 2 * u64::from(sc.interval_ms);
        let lost: Vec<u32> = job
            .in_flight
            .values()
            .filter(|(_, t)| now.saturating_sub(*t) > limit)
            .map(|(tok, _)| *tok)
            .collect();
        job.in_flight
            .retain(|_, (_, t)| now.saturating_sub(*t) <= limit);
        for tok in lost {
            self.pending.remove(&tok);
        }
        let ns = job.ns.clone();
        let ttl = 3 * u64::from(sc.interval_ms);
        let leader = take_lease(host, &lease_key(&ns), &vm_id, now, ttl);
        let was_leader = job.leader;
        job.leader = leader;
        if !leader {
            return;
        }
        if !was_leader {
            // Continue from the previous leader's snapshot rather than an empty one.
            job.snapshot = host
                .shared_get(&snapshot_key(&ns))
                .ok()
                .flatten()
                .map(|(v, _)| snapshot::decode_snapshot(&v))
                .unwrap_or_default();
        }
        let targets: Vec<String> = if job.endpoints.is_empty() {
            host.shared_get(&targets_key(&ns))
                .ok()
                .flatten()
                .map(|(v, _)| {
                    String::from_utf8_lossy(&v)
                        .lines()
                        .filter(|l| !l.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        } else {
            job.endpoints.to_vec()
        };
        job.snapshot.retain(|a, _| targets.contains(a));
        let sent = host
            .shared_get(SENT_KEY)
            .ok()
            .flatten()
            .map(|(v, _)| shared::decode_counts(&v))
            .unwrap_or_default();
        let mut failed: Vec<String> = Vec::new();
        job.round += 1;
        job.round_left = 0;
        for addr in targets {
            if job.in_flight.contains_key(&addr) {
                continue;
            }
            let authority = match sc.port {
                Some(p) => match addr.rsplit_once(':') {
                    Some((h, _)) => format!("{h}:{p}"),
                    None => continue,
                },
                None => addr.clone(),
            };
            let headers = [
                (":method", "GET"),
                (":path", sc.path.as_str()),
                (":authority", authority.as_str()),
                (sc.host_header.as_str(), authority.as_str()),
                ("accept", "text/plain"),
            ];
            match host.http_call(&sc.cluster, &headers, sc.timeout_ms) {
                Ok(token) => {
                    job.in_flight.insert(addr.clone(), (token, now));
                    job.round_left += 1;
                    let sent_base = sent.get(&addr).copied().unwrap_or(0);
                    self.pending.insert(
                        token,
                        PendingScrape {
                            job: i,
                            addr,
                            sent_base,
                            round: job.round,
                        },
                    );
                }
                Err(e) => {
                    job.snapshot.insert(
                        addr.clone(),
                        SnapEntry {
                            at_ms: now,
                            sent_base: sent.get(&addr).copied().unwrap_or(0),
                            metrics: None,
                        },
                    );
                    failed.push(format!("{addr}: {e}"));
                }
            }
        }
        if !failed.is_empty() {
            let bytes = snapshot::encode_snapshot(&job.snapshot);
            let _ = host.shared_set(&snapshot_key(&ns), &bytes, 0);
            for f in &failed {
                tel.inc(host, Counter::ScrapeFailed);
                tel.log(host, LogLevel::Debug, 0, format_args!("scrape {f}"));
            }
        }
    }

    /// A scrape answered (or failed: no status, non-2xx, timeout): parse once, publish.
    pub fn on_http_response(
        &mut self,
        host: &mut dyn Host,
        tel: &Telemetry,
        token: u32,
        body_size: usize,
    ) {
        let Some(p) = self.pending.remove(&token) else {
            return;
        };
        let now = host.now_ms();
        let Some(job) = self.jobs.get_mut(p.job) else {
            return;
        };
        job.in_flight.remove(&p.addr);
        let status = host.http_call_status().ok().flatten();
        let metrics = match status {
            Some(200..=299) => {
                let body = host
                    .http_call_body(body_size.min(MAX_SCRAPE_BYTES))
                    .unwrap_or_default();
                let out = engines::scrape_page(&body, MAX_SCRAPE_BYTES, job.config.extra.as_ref());
                let path = job.config.scrape.as_ref().map_or("", |s| s.path.as_str());
                let source = Source::Scrape {
                    path,
                    bytes: body_size,
                };
                self.report.text(host, tel, &p.addr, source, &out);
                out.result.ok()
            }
            _ => None,
        };
        let ok = metrics.is_some();
        job.snapshot.insert(
            p.addr.clone(),
            SnapEntry {
                at_ms: now,
                sent_base: p.sent_base,
                metrics,
            },
        );
        job.dirty = true;
        if p.round == job.round {
            job.round_left = job.round_left.saturating_sub(1);
        }
        // Publish once per round, when its last callout has answered: every publish makes each
        // worker re-read the snapshot, so per-answer publishing costs O(pods²) per round. A
        // failure is published at once: traffic must leave a pod that stopped answering. Late
        // answers of an earlier round wait for this round's publish (or the next tick).
        let publish = job.round_left == 0 || !ok;
        if status.is_some_and(|s| (200..300).contains(&s)) {
            tel.inc(host, Counter::MetricsParsed);
        }
        tel.inc(
            host,
            if ok {
                Counter::ScrapeOk
            } else {
                Counter::ScrapeFailed
            },
        );
        if !ok {
            tel.log(
                host,
                LogLevel::Debug,
                0,
                format_args!(
                    "scrape of {} failed (status {status:?}): endpoint unknown until the next one",
                    p.addr
                ),
            );
        }
        if publish {
            self.publish_snapshot(host, p.job);
        }
    }

    /// Writes a scrape target's snapshot to shared data if answers arrived since the last write.
    fn publish_snapshot(&mut self, host: &mut dyn Host, i: usize) {
        let Some(job) = self.jobs.get_mut(i) else {
            return;
        };
        if !job.dirty {
            return;
        }
        job.dirty = false;
        let bytes = snapshot::encode_snapshot(&job.snapshot);
        let _ = host.shared_set(&snapshot_key(&job.ns), &bytes, 0);
    }
}

fn lease_key(ns: &str) -> String {
    format!("ailb.lease.{ns}")
}

/// One scraper per proxy: the lease `"<vm> <expiry ms>"` is taken when free, expired or ours,
/// with CAS so two VMs cannot both take it from the same state.
fn take_lease(host: &mut dyn Host, key: &str, vm_id: &str, now: u64, ttl: u64) -> bool {
    let mine = format!("{vm_id} {}", now + ttl);
    match host.shared_get(key) {
        Ok(None) => {
            // Hosts insert a missing key whatever the CAS: write, then check who won.
            if host.shared_set(key, mine.as_bytes(), 0).is_err() {
                return false;
            }
            matches!(host.shared_get(key), Ok(Some((v, _))) if v == mine.as_bytes())
        }
        Ok(Some((v, cas))) => {
            let text = String::from_utf8_lossy(&v);
            let mut parts = text.split(' ');
            let holder = parts.next().unwrap_or("");
            let expiry: u64 = parts.next().and_then(|x| x.parse().ok()).unwrap_or(0);
            if holder == vm_id || expiry <= now {
                host.shared_set(key, mine.as_bytes(), cas).is_ok()
            } else {
                false
            }
        }
        Err(_) => false,
    }
}
