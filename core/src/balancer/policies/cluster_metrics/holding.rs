//! What a cluster_metrics request holds until its stream ends: the chosen service's in-flight
//! count in the route's shared statistics (recorded at the first byte and at stream end with
//! the latency and the success test), and its count in Redis when the route counts globally
//! (`global_inflight_enabled`, docs/higress-cluster-policies.md §3.6); and the one-off work a
//! global pick's reply asks for ([`Start`], [`Local`]).

use super::stats::SharedStats;
use super::writes::{write, Change};
use crate::balancer::holding::{Act, Holding, Outcome, Services};
use crate::balancer::redis_client::LeaseKeys;
use crate::balancer::telemetry::Telemetry;
use crate::config::RouteConfig;
use crate::host::Host;
use crate::reason::Cause;
use crate::redis::inflight::InflightKeys;
use crate::stats::Counter;
use std::rc::Rc;

/// cluster_metrics: the service a request was sent to, recorded at first byte and stream end
/// in the route's shared statistics (its in-flight count was taken at the decision, or by
/// [`Start`] after a global pick), and its count in Redis when the route counts globally.
#[derive(Debug, Clone)]
pub struct ServiceLease {
    pub stats: Rc<SharedStats>,
    /// The service, as its index among the statistics' distinct names (an index, so that
    /// neither the decision nor the stream end copies or compares a name; one out of range is
    /// a service the statistics do not know, which every update ignores).
    pub service: usize,
    /// Decision time (host clock, ms): TTFT and total latency are measured from here.
    pub start_ms: u64,
    pub global: Option<GlobalLease>,
    /// Whether its time to the first byte is recorded (once).
    pub first_byte: bool,
}

impl ServiceLease {
    /// The service's name ("" for one the statistics do not know).
    pub fn name(&self) -> &str {
        self.stats
            .fresh
            .names()
            .get(self.service)
            .map_or("", String::as_str)
    }
}

impl Holding for ServiceLease {
    fn wants_first_bytes(&self) -> bool {
        !self.first_byte
    }

    fn first_bytes(&mut self, svc: &mut Services, outcome: &Outcome) {
        self.first_byte = true;
        let now = outcome.first_byte_us.map_or(self.start_ms, |us| us / 1000);
        first_byte(svc.host, svc.tel, self, now, outcome.success());
    }

    /// The in-flight counts back; the total latency and the error bookkeeping only when the
    /// request got an answer through this choice (`outcome`).
    fn give_back(self: Box<Self>, svc: &mut Services, outcome: Option<&Outcome>) {
        let lease = *self;
        if let Some(global) = lease.global.clone() {
            Box::new(global).give_back(svc, None);
        }
        let now = match outcome.and_then(|o| o.end_ms) {
            Some(ms) => ms,
            None => svc.host.now_ms(),
        };
        done(svc.host, svc.tel, lease, now, outcome.map(Outcome::success));
    }

    #[cfg(test)]
    fn ledger(&self) -> Vec<String> {
        let mut held = vec!["local|service".to_string()];
        held.extend(self.global.iter().map(|g| g.member.clone()));
        held
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A service's global in-flight count taken in Redis (`global_inflight_enabled`).
#[derive(Debug, Clone)]
pub struct GlobalLease {
    pub config: Rc<RouteConfig>,
    pub keys: Rc<InflightKeys>,
    pub member: String,
}

impl Holding for GlobalLease {
    fn give_back(self: Box<Self>, svc: &mut Services, _outcome: Option<&Outcome>) {
        let keys = LeaseKeys::Service(self.keys);
        svc.redis
            .release(svc.host, svc.tel, &self.config, keys, vec![self.member]);
    }

    #[cfg(test)]
    fn ledger(&self) -> Vec<String> {
        vec![self.member.clone()]
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A global pick was answered (or fell to the local path): count the service in this proxy's
/// statistics, as the local path does at its decision.
#[derive(Debug)]
pub struct Start(pub ServiceLease);

impl Act for Start {
    fn run(self: Box<Self>, svc: &mut Services) {
        start(svc.host, svc.tel, &self.0);
    }

    #[cfg(test)]
    fn ledger(&self) -> Vec<String> {
        vec!["local|service".to_string()]
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Redis could not choose; the local path did: counted, logged rate-limited.
#[derive(Debug)]
pub struct Local(pub Cause);

impl Act for Local {
    fn run(self: Box<Self>, svc: &mut Services) {
        svc.tel.inflight_local(svc.host, svc.ctx, self.0);
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A global pick was answered (or fell to the local path): count the service in this proxy,
/// as the local path does at its decision.
pub(super) fn start(host: &mut dyn Host, tel: &Telemetry, lease: &ServiceLease) {
    let result = write(host, &lease.stats, Change::Start(lease.service));
    if result.is_err() {
        tel.inc(host, Counter::ClusterStatsFailed);
    }
}

/// The first response-body chunk at `now` (host clock, ms): a TTFT sample (Higress measures at
/// the first streamed chunk), written with this worker's next update of the record
/// (`SharedStats::pending`).
fn first_byte(host: &mut dyn Host, tel: &Telemetry, lease: &ServiceLease, now: u64, success: bool) {
    let elapsed = elapsed_ms(now, lease);
    if !lease
        .stats
        .defer_first_byte(lease.service, elapsed, success)
    {
        return;
    }
    if write(host, &lease.stats, Change::Flush).is_err() {
        tel.inc(host, Counter::ClusterStatsFailed);
    }
}

/// Stream end at `now` (host clock, ms): the in-flight count back and, when the request got
/// this far (`outcome`: success?), the total latency and the error bookkeeping (cooldown).
/// One instant for both: the sample and the cooldown deadline.
fn done(
    host: &mut dyn Host,
    tel: &Telemetry,
    lease: ServiceLease,
    now: u64,
    outcome: Option<bool>,
) {
    let elapsed = elapsed_ms(now, &lease);
    let now_ms = i64::try_from(now).unwrap_or(i64::MAX);
    let end = Change::End {
        service: lease.service,
        elapsed_ms: outcome.map(|_| elapsed),
        success: outcome.unwrap_or(true),
        now_ms,
    };
    let result = write(host, &lease.stats, end);
    if result.is_err() {
        tel.inc(host, Counter::ReleaseFailures);
    }
}

fn elapsed_ms(now: u64, lease: &ServiceLease) -> i64 {
    i64::try_from(now.saturating_sub(lease.start_ms)).unwrap_or(i64::MAX)
}
