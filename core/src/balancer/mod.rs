//! The per-VM decision engine. It owns every request's state (keyed by HTTP context id) and
//! every Redis call in flight (keyed by token), because Redis replies arrive on the root
//! context and must find their request — or, when the stream is already gone, still give
//! back what the pick acquired.

use crate::config::{FailureMode, PluginConfig, Policy, RequestKeys, RouteConfig};
use crate::host::{Host, LogLevel};
use crate::redis::scripts::{
    self, AcquireArgs, AcquireReply, Keys, PrefixArgs, ReplyError, Scripts,
};
use crate::request::{AtDone, Lease, Phase};
use crate::stats::{Cause, Counter, Outcome, Stats};
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

mod calls;
mod glr;
mod local;
mod metrics;
mod prefix;
mod scrape;
mod shared;

/// What a phase callback answers the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    Pause,
}

/// One in every `RECLAIM_EVERY` acquires of a VM also reclaims up to `RECLAIM_LIMIT` expired
/// leases: enough to drain a crashed gateway's leases, cheap on the common path.
const RECLAIM_EVERY: u64 = 16;
const RECLAIM_LIMIT: u32 = 4;
/// A fallback cause is logged at warn at most this often per VM; the rest go to debug.
const WARN_INTERVAL_MS: u64 = 10_000;

struct Request {
    config: Rc<RouteConfig>,
    keys: Option<Rc<Keys>>,
    phase: Phase,
    body_bytes: usize,
}

/// A pick in flight: everything needed to finish it, or to undo it if its stream is gone.
struct Pick {
    ctx: u32,
    config: Rc<RouteConfig>,
    keys: Rc<Keys>,
    request_id: String,
    cost: u64,
    candidates: Rc<Vec<String>>,
    fingerprint: Rc<str>,
    sent_list: bool,
    by_sha: bool,
    /// prefix_cache: the prompt's prefix-chain keys (possibly empty); None = least-request.
    chain: Option<Rc<Vec<String>>>,
}

struct Release {
    config: Rc<RouteConfig>,
    keys: Rc<Keys>,
    members: Vec<String>,
    by_sha: bool,
}

enum Pending {
    Pick(Pick),
    Release(Release),
    ScriptLoad,
}

pub struct Balancer {
    config: PluginConfig,
    scripts: Scripts,
    stats: Stats,
    requests: HashMap<u32, Request>,
    pending: HashMap<u32, Pending>,
    /// Fingerprint of the endpoint set this VM last synced, per key namespace.
    synced: HashMap<String, Rc<str>>,
    /// Redis clusters whose init succeeded (init is retried lazily until it does).
    redis_ready: HashMap<String, bool>,
    vm_nonce: u64,
    next_id: u64,
    rng: u64,
    acquires: u64,
    log_level: LogLevel,
    last_warn: HashMap<&'static str, u64>,
    metrics: metrics::MetricsState,
}

impl Balancer {
    /// Builds the engine for a validated config: defines metrics, initialises each Redis
    /// target once, and preloads the scripts (EVALSHA then hits; NOSCRIPT is still handled).
    pub fn configure(
        host: &mut dyn Host,
        config: PluginConfig,
        seed: u64,
        log_level: LogLevel,
    ) -> Balancer {
        let metrics = metrics::MetricsState::new(&config, seed);
        let mut e = Balancer {
            metrics,
            stats: Stats::define(host),
            config,
            scripts: Scripts::new(),
            requests: HashMap::new(),
            pending: HashMap::new(),
            synced: HashMap::new(),
            redis_ready: HashMap::new(),
            vm_nonce: seed >> 32,
            next_id: 0,
            rng: seed | 1,
            acquires: 0,
            log_level,
            last_warn: HashMap::new(),
        };
        let targets: Vec<Rc<RouteConfig>> = e.config.all().cloned().collect();
        for cfg in targets {
            let Some(redis) = &cfg.redis else { continue };
            if e.ensure_redis(host, &cfg) {
                for script in e.scripts.all() {
                    if let Ok(token) = host.redis_call(&redis.cluster, &scripts::load(script)) {
                        e.pending.insert(token, Pending::ScriptLoad);
                    }
                }
            }
        }
        e.start_scraper(host);
        e
    }

    pub fn on_request_headers(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        end_of_stream: bool,
    ) -> Verdict {
        let route = text_property(host, "route_name");
        let cluster = text_property(host, "cluster_name");
        let authority = host.request_header(":authority").ok().flatten();
        let keys = RequestKeys {
            route: route.as_deref(),
            cluster: cluster.as_deref(),
            authority: authority.as_deref(),
        };
        // Plain Envoy: a client must never steer override_host (no-op for Higress configs).
        self.strip_destination_headers(host);
        let Some(config) = self.config.select(&keys).cloned() else {
            return Verdict::Continue; // no rule and no global config: the plugin is off here
        };
        let keys = match (&route, &cluster) {
            (Some(r), Some(c)) if !r.is_empty() && !c.is_empty() => {
                Some(Rc::new(Keys::new(&config.key_prefix, r, c)))
            }
            _ => None,
        };
        // Only the Redis keys need the route and cluster names.
        let missing_route = keys.is_none() && config.redis.is_some();
        let decide_now = end_of_stream || config.decide_at_headers;
        self.requests.insert(
            ctx,
            Request {
                config,
                keys,
                phase: Phase::AwaitingBody,
                body_bytes: 0,
            },
        );
        if missing_route {
            return self.fail(host, ctx, Cause::NoRoute, false);
        }
        if decide_now {
            self.decide(host, ctx)
        } else {
            // Under ABI 0_2_100 this is StopIteration: headers held, body still delivered.
            Verdict::Pause
        }
    }

    pub fn on_request_body(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        body_size: usize,
        end_of_stream: bool,
    ) -> Verdict {
        let Some(req) = self.requests.get_mut(&ctx) else {
            return Verdict::Continue;
        };
        if req.phase != Phase::AwaitingBody {
            return Verdict::Continue;
        }
        req.body_bytes = body_size;
        if body_size > req.config.max_body_bytes {
            // Do not hold a huge body: balance by load alone, right now.
            self.stats.inc(host, Counter::Fallback(Cause::BodyTooLarge));
            return self.start_pick(host, ctx, None);
        }
        if !end_of_stream {
            return Verdict::Pause; // keep buffering until the whole body is here
        }
        self.decide(host, ctx)
    }

    pub fn on_response_headers(&mut self, host: &mut dyn Host, ctx: u32) {
        let Some(req) = self.requests.get(&ctx) else {
            return;
        };
        if let Some(name) = &req.config.debug_header {
            let (endpoint, reason) = req.phase.describe();
            let value = format!("endpoint={}; reason={reason}", endpoint.unwrap_or("-"));
            let _ = host.add_response_header(name, &value);
        }
    }

    /// Stream end, whatever ended it: give back what was acquired, exactly once.
    pub fn on_done(&mut self, host: &mut dyn Host, ctx: u32) {
        let Some(req) = self.requests.remove(&ctx) else {
            return;
        };
        match req.phase.at_done() {
            AtDone::Release(lease) => {
                self.release(host, &req.config, lease.keys, vec![lease.member])
            }
            AtDone::ReleaseLocal(lease) => self.release_local(host, lease),
            // The pick's reply will find no request and release what it acquired.
            AtDone::Orphan { token } => self.log(
                host,
                LogLevel::Debug,
                ctx,
                format_args!("stream ended before pick {token} returned"),
            ),
            AtDone::Nothing => {}
        }
    }

    pub fn on_redis_reply(&mut self, host: &mut dyn Host, token: u32, status: u32, size: usize) {
        let Some(pending) = self.pending.remove(&token) else {
            return;
        };
        let reply = if status == 0 {
            host.redis_reply(size).map_err(|_| Cause::BadReply)
        } else {
            self.stats.inc(host, Counter::RedisTimeouts);
            Err(Cause::RedisTimeout)
        };
        match pending {
            Pending::Pick(pick) => self.on_pick_reply(host, token, pick, reply),
            Pending::Release(rel) => self.on_release_reply(host, rel, reply),
            Pending::ScriptLoad => {
                if reply.is_err() {
                    self.stats.inc(host, Counter::RedisErrors);
                }
            }
        }
    }

    /// How many requests and Redis calls this VM is tracking (tests and leak checks).
    pub fn tracked(&self) -> (usize, usize) {
        (self.requests.len(), self.pending.len())
    }

    /// The end of the request is here (body complete, or no body): let the route's policy pick.
    fn decide(&mut self, host: &mut dyn Host, ctx: u32) -> Verdict {
        let Some((policy, redis)) = self
            .requests
            .get(&ctx)
            .map(|r| (r.config.policy.kind(), r.config.redis.is_some()))
        else {
            return Verdict::Continue;
        };
        match policy {
            Policy::GlobalLeastRequest if redis => self.decide_least_request(host, ctx),
            // Plain Envoy: per-proxy counts in shared data.
            Policy::GlobalLeastRequest => self.decide_local_least_request(host, ctx),
            Policy::PrefixCache => self.decide_prefix(host, ctx),
            Policy::EndpointMetrics => self.decide_metrics(host, ctx),
        }
    }

    fn dispatch_pick(&mut self, host: &mut dyn Host, pick: Pick) -> Result<u32, Cause> {
        self.acquires += 1;
        let args = AcquireArgs {
            now_ms: host.now_ms(),
            lease_ttl_ms: pick.config.lease_ttl_ms,
            request_id: &pick.request_id,
            cost: pick.cost,
            cap: pick.config.max_load,
            random: (self.random() >> 32) as u32,
            fingerprint: &pick.fingerprint,
            reclaim: if self.acquires.is_multiple_of(RECLAIM_EVERY) {
                RECLAIM_LIMIT
            } else {
                0
            },
            endpoints: pick.sent_list.then_some(pick.candidates.as_slice()),
        };
        let settings = match &pick.config.policy {
            crate::config::PolicyConfig::PrefixCache(p) => Some(p),
            _ => None,
        };
        let prefix = match (&pick.chain, settings) {
            (Some(chain), Some(p)) => Some(PrefixArgs {
                chain,
                ttl_s: p.ttl_s,
                max_imbalance: p.max_imbalance,
                max_imbalance_ratio: p.max_imbalance_ratio,
            }),
            _ => None,
        };
        let query = scripts::pick_call(
            &self.scripts,
            pick.by_sha,
            &pick.keys,
            &args,
            prefix.as_ref(),
        );
        let token = self.redis_call(host, &pick.config, &query)?;
        self.pending.insert(token, Pending::Pick(pick));
        Ok(token)
    }

    fn on_pick_reply(
        &mut self,
        host: &mut dyn Host,
        token: u32,
        mut pick: Pick,
        reply: Result<Vec<u8>, Cause>,
    ) {
        let outcome = match reply {
            Ok(bytes) => match scripts::parse_acquire(&bytes) {
                Ok(r) => PickOutcome::Reply(r),
                Err(ReplyError::NoScript) => PickOutcome::NoScript,
                Err(e) => PickOutcome::Failed(self.reply_cause(host, pick.ctx, &e)),
            },
            Err(cause) => PickOutcome::Failed(cause),
        };
        let alive = self
            .requests
            .get(&pick.ctx)
            .is_some_and(|r| r.phase.awaits(token))
            && host.set_effective_context(pick.ctx).is_ok();
        if !alive {
            self.undo_orphan(host, &pick, &outcome);
            return;
        }
        let ctx = pick.ctx;
        match outcome {
            PickOutcome::Reply(AcquireReply::Picked {
                endpoint,
                depth,
                spilled,
            }) => {
                let reason = match (&pick.chain, depth, spilled) {
                    (None, _, _) => "least_request",
                    (Some(_), _, true) => "prefix_spill",
                    (Some(_), 0, _) => "prefix_miss",
                    (Some(_), _, false) => "prefix_hit",
                };
                self.route(host, pick, endpoint, reason)
            }
            PickOutcome::Reply(AcquireReply::Sync | AcquireReply::Empty) if !pick.sent_list => {
                // Redis lost or never had our endpoint set (restart, another gateway's view):
                // resend the pick with the full list, once.
                self.stats.inc(host, Counter::RedisResync);
                self.synced.remove(&pick.keys.namespace);
                pick.sent_list = true;
                self.redispatch(host, pick);
            }
            PickOutcome::Reply(AcquireReply::Sync | AcquireReply::Empty) => {
                self.synced.remove(&pick.keys.namespace);
                self.fail(host, ctx, Cause::BadReply, true);
            }
            PickOutcome::Reply(AcquireReply::Full) => {
                self.count(host, pick.config.policy.kind(), Outcome::Rejected429);
                self.set_phase(
                    ctx,
                    Phase::Settled {
                        reason: "rejected_429",
                    },
                );
                let body = b"Exceeded maximum request limit from ai-load-balancer.";
                let _ = host.send_local_response(429, "ai_lb_max_request_count", body);
            }
            PickOutcome::NoScript if pick.by_sha => {
                // Redis restarted or flushed its script cache: EVAL reloads it.
                self.stats.inc(host, Counter::RedisNoScript);
                pick.by_sha = false;
                self.redispatch(host, pick);
            }
            PickOutcome::NoScript => {
                self.fail(host, ctx, Cause::RedisError, true);
            }
            PickOutcome::Failed(cause) => {
                if cause == Cause::RedisTimeout {
                    // The script may have run before the reply was lost.
                    self.release_any(host, &pick);
                }
                self.fail(host, ctx, cause, true);
            }
        }
    }

    /// The pick succeeded: point the router at the endpoint and let the request go.
    fn route(&mut self, host: &mut dyn Host, pick: Pick, endpoint: String, reason: &'static str) {
        let ctx = pick.ctx;
        let lease = Lease {
            keys: pick.keys.clone(),
            member: scripts::lease_member(&pick.request_id, &endpoint, pick.cost),
        };
        if !pick.candidates.contains(&endpoint) {
            // Only possible if two endpoint sets share a fingerprint: resync next time.
            self.synced.remove(&pick.keys.namespace);
            self.release(host, &pick.config, lease.keys, vec![lease.member]);
            self.fail(host, ctx, Cause::BadReply, true);
            return;
        }
        if let Err(e) = host.set_upstream_override_host(&endpoint) {
            self.log(host, LogLevel::Warn, ctx, format_args!("{e}"));
            self.release(host, &pick.config, lease.keys, vec![lease.member]);
            self.fail(host, ctx, Cause::OverrideFailed, true);
            return;
        }
        self.synced
            .insert(pick.keys.namespace.clone(), pick.fingerprint.clone());
        if pick.config.detail_log && self.log_level as u32 <= LogLevel::Debug as u32 {
            self.log(
                host,
                LogLevel::Debug,
                ctx,
                format_args!(
                    "routed to {endpoint} ({reason}, cost {}, {} candidates)",
                    pick.cost,
                    pick.candidates.len()
                ),
            );
        }
        match reason {
            "prefix_hit" => self.stats.inc(host, Counter::PrefixHit),
            "prefix_spill" => self.stats.inc(host, Counter::PrefixSpill),
            _ => {}
        }
        self.set_phase(
            ctx,
            Phase::Routed {
                endpoint,
                lease,
                reason,
            },
        );
        self.count(host, pick.config.policy.kind(), Outcome::Routed);
        if let Err(e) = host.resume_request() {
            self.log(host, LogLevel::Warn, ctx, format_args!("{e}"));
        }
    }

    fn redispatch(&mut self, host: &mut dyn Host, pick: Pick) {
        let ctx = pick.ctx;
        match self.dispatch_pick(host, pick) {
            Ok(token) => self.set_phase(ctx, Phase::Picking { token }),
            Err(cause) => {
                self.fail(host, ctx, cause, true);
            }
        }
    }

    /// The stream ended while its pick was in flight: give back whatever the pick acquired.
    fn undo_orphan(&mut self, host: &mut dyn Host, pick: &Pick, outcome: &PickOutcome) {
        self.stats.inc(host, Counter::ReleasesOrphaned);
        match outcome {
            PickOutcome::Reply(AcquireReply::Picked { endpoint, .. }) => {
                let member = scripts::lease_member(&pick.request_id, endpoint, pick.cost);
                self.release(host, &pick.config, pick.keys.clone(), vec![member]);
            }
            PickOutcome::Failed(Cause::RedisTimeout) => self.release_any(host, pick),
            _ => {}
        }
    }

    /// Fallback (or 503 under `failureMode: deny`). `paused`: we are in a callback and the
    /// request is held, so it must be resumed; otherwise the phase callback returns Continue.
    fn fail(&mut self, host: &mut dyn Host, ctx: u32, cause: Cause, paused: bool) -> Verdict {
        let policy = self.requests.get(&ctx).map(|r| r.config.policy.kind());
        if let Some(p) = policy {
            self.count(host, p, Outcome::FellBack);
        }
        self.stats.inc(host, Counter::Fallback(cause));
        let now = host.now_ms();
        let last = self.last_warn.get(cause.name()).copied();
        let level = if last.is_none_or(|t| now.saturating_sub(t) >= WARN_INTERVAL_MS) {
            self.last_warn.insert(cause.name(), now);
            LogLevel::Warn
        } else {
            LogLevel::Debug
        };
        let deny = self
            .requests
            .get(&ctx)
            .is_some_and(|r| r.config.failure_mode == FailureMode::Deny);
        let action = if deny {
            "503 (failureMode deny)"
        } else {
            "cluster load balancing"
        };
        self.log(
            host,
            level,
            ctx,
            format_args!("fallback to {action}: {}", cause.name()),
        );
        self.set_phase(
            ctx,
            Phase::Settled {
                reason: cause.name(),
            },
        );
        if deny {
            if let Some(p) = policy {
                self.count(host, p, Outcome::Denied);
            }
            let _ = host.send_local_response(
                503,
                "ai_lb_failure",
                b"ai-load-balancer could not pick an endpoint",
            );
            return Verdict::Pause;
        }
        if paused {
            if let Err(e) = host.resume_request() {
                self.log(host, LogLevel::Warn, ctx, format_args!("{e}"));
            }
        }
        Verdict::Continue
    }

    fn count(&self, host: &mut dyn Host, policy: Policy, outcome: Outcome) {
        self.stats.inc(host, Counter::Decision(policy, outcome));
    }

    fn set_phase(&mut self, ctx: u32, phase: Phase) {
        if let Some(req) = self.requests.get_mut(&ctx) {
            req.phase = phase;
        }
    }

    fn random(&mut self) -> u64 {
        // splitmix64: per-VM stream seeded from the host's entropy at configure.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn log(&self, host: &dyn Host, level: LogLevel, ctx: u32, msg: fmt::Arguments) {
        if level as u32 >= self.log_level as u32 {
            host.log(level, &format!("[ai-load-balancer] #{ctx} {msg}"));
        }
    }
}

/// What a pick's reply turned out to be.
enum PickOutcome {
    Reply(AcquireReply),
    NoScript,
    Failed(Cause),
}

pub(super) fn cost_of(config: &RouteConfig, body_bytes: usize) -> u64 {
    match config.cost {
        crate::config::CostMode::Requests => 1,
        crate::config::CostMode::Bytes => (body_bytes as u64).max(1),
        crate::config::CostMode::Tokens => (body_bytes as u64 / 4).max(1),
    }
}

fn text_property(host: &dyn Host, name: &str) -> Option<String> {
    host.property(&[name])
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
}

#[cfg(test)]
mod tests;
