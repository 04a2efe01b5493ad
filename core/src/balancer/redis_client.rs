//! The one Redis client of a VM: lazy `proxy_redis_init` per target, the script cache
//! (`SCRIPT LOAD` at configure, `EVALSHA` with a fall-back to `EVAL` on `NOSCRIPT`), the calls in
//! flight by token, reply decoding, and which endpoint sets Redis already holds
//! (docs/redis-data-model.md). Replies arrive on the root context (docs/higress-abi.md §6);
//! a pick's reply is handed back to the balancer, releases and script loads end here.

pub mod calls;
pub use calls::{Answered, CallStatus, Decode, PickAnswer};
mod first_bytes;
mod own;
mod release;

pub use first_bytes::tick_ms as first_bytes_tick_ms;
#[cfg(test)]
pub use first_bytes::MAX_WAIT_MS;
pub use own::OnReply;
pub use release::LeaseKeys;
use release::{Outcome, Release};

use super::pick::PickReply;
use super::telemetry::Telemetry;
use crate::config::{Policy, RouteConfig};
use crate::host::{Host, HostErrorKind, LogLevel};
use crate::id_map::IdMap;
use crate::reason::Cause;
use crate::redis::bind::{self, Bind};
use crate::redis::scripts::{self, Keys, Scripts};
use crate::stats::Counter;
use std::collections::HashMap;
use std::rc::Rc;

enum Op {
    /// A pick for request `ctx`, its reply read by `decode` (the pick's own).
    Pick {
        ctx: u32,
        decode: Decode,
    },
    Release(Release),
    ScriptLoad,
    /// A waiting-queue entry written or removed (fire-and-forget).
    Waiter,
    /// A pod's prefix generation bumped (fire-and-forget, prefix_forget.lua).
    Forget,
    /// A policy's own call, its reply handed back ([`RedisClient::send_own`]).
    Own(Box<dyn OnReply>),
    /// A write for request `ctx` (a Responses answer's pod, `SET … EX`): its response's end
    /// waits for it ([`RedisClient::writing`]).
    Bind {
        ctx: u32,
    },
}

#[derive(Default)]
pub struct RedisClient {
    scripts: Scripts,
    /// Targets whose init succeeded (init is retried lazily until it does).
    ready: HashMap<String, bool>,
    pending: IdMap<Op>,
    /// Fingerprint of the endpoint set this VM last synced, per key namespace.
    synced: HashMap<String, Rc<str>>,
    /// prefix_cache first bytes not yet sent, per route (first_bytes.rs).
    batches: first_bytes::Batches,
    /// Writes in flight per request (`bind`).
    writes: HashMap<u32, u32>,
}

impl RedisClient {
    /// Initialises every Redis target once and preloads the scripts, so EVALSHA hits.
    pub fn preload<'a>(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        configs: impl Iterator<Item = &'a Rc<RouteConfig>>,
    ) {
        for cfg in configs {
            let Some(redis) = &cfg.redis else { continue };
            if self.ensure_ready(host, tel, cfg) {
                // endpoint_metrics keeps only session bindings in Redis.
                let scripts = match cfg.policy.kind() {
                    Policy::EndpointMetrics => vec![&self.scripts.session_bind],
                    _ => self
                        .scripts
                        .for_route(cfg.policy.is_cluster(), cfg.prefix().is_some()),
                };
                for script in scripts {
                    if let Ok(token) = host.redis_call(&redis.cluster, &scripts::load(script)) {
                        self.pending.insert(token, Op::ScriptLoad);
                    }
                }
            }
        }
    }

    /// Calls in flight (tests and leak checks).
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    pub fn synced(&self, namespace: &str) -> Option<&Rc<str>> {
        self.synced.get(namespace)
    }

    pub fn set_synced(&mut self, namespace: String, fingerprint: Rc<str>) {
        self.synced.insert(namespace, fingerprint);
    }

    pub fn unsync(&mut self, namespace: &str) {
        self.synced.remove(namespace);
    }

    /// The scripts, for a pick's call (`events::Pick::query`).
    pub fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    /// Sends a pick's script call `query` for request `ctx` to `config`'s Redis; its reply
    /// will be read by `decode`.
    pub fn send_pick(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        ctx: u32,
        (config, query, decode): (&RouteConfig, &[u8], Decode),
    ) -> Result<u32, Cause> {
        let token = self.call(host, tel, config, query)?;
        self.pending.insert(token, Op::Pick { ctx, decode });
        Ok(token)
    }

    /// Fire-and-forget release of the first present lease among `members`. If it cannot even
    /// be sent, the lease expires on its own (leaseTTL) and a later acquire reclaims it.
    pub fn release(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        config: &Rc<RouteConfig>,
        keys: LeaseKeys,
        members: Vec<String>,
    ) {
        self.send_release(host, tel, Release::new(config.clone(), keys, members));
    }

    /// Writes `bind` for request `ctx` (`SET … EX`: a Responses answer's pod); whether it was
    /// sent. Nothing waits for it but the end of `ctx`'s response ([`Self::writing`]).
    pub fn bind(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        (config, ctx): (&RouteConfig, u32),
        bind: &Bind,
    ) -> bool {
        let sent = self.call(host, tel, config, &bind::bind_call(bind));
        if let Ok(token) = sent {
            self.pending.insert(token, Op::Bind { ctx });
            *self.writes.entry(ctx).or_insert(0) += 1;
        }
        sent.is_ok()
    }

    /// Whether request `ctx` has writes in flight.
    pub fn writing(&self, ctx: u32) -> bool {
        self.writes.contains_key(&ctx)
    }

    /// Waiting queue: adds (`score` Some) or removes this waiter in the route's wait set
    /// (docs/redis-data-model.md §12). Fire-and-forget: an entry never written only loses
    /// its class's precedence on other gateways; one never removed expires at its deadline.
    pub fn waiter(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        (config, keys, member): (&Rc<RouteConfig>, &Keys, &str),
        score: Option<u64>,
    ) {
        let query = crate::redis::waiters::call(keys, member, score);
        if let Ok(token) = self.call(host, tel, config, &query) {
            self.pending.insert(token, Op::Waiter);
        }
    }

    /// prefix_cache, when `endpoint` was emptied (a restart, or a flush found across unrelated
    /// conversations): bump its generation and re-write `chain` at the new one
    /// (docs/redis-data-model.md §5). Fire-and-forget: one that cannot
    /// be sent (counted as a Redis error) leaves the index as it was; one sent counts a
    /// generation bump.
    pub fn forget(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        config: &Rc<RouteConfig>,
        keys: &Keys,
        chain: &[String],
        endpoint: &str,
    ) {
        let Some(settings) = config.prefix() else {
            return;
        };
        let query =
            scripts::release::forget_call(keys, chain, endpoint, settings.ttl_s, host.now_ms());
        if let Ok(token) = self.call(host, tel, config, &query) {
            self.pending.insert(token, Op::Forget);
            tel.inc(host, Counter::PrefixGenerationBump);
        }
    }

    /// Sends a policy's own call `query` to `config`'s Redis; `then` is told its reply. One
    /// that cannot be sent is told at once.
    pub fn send_own(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        config: &RouteConfig,
        query: &[u8],
        then: Box<dyn OnReply>,
    ) {
        match self.call(host, tel, config, query) {
            Ok(token) => drop(self.pending.insert(token, Op::Own(then))),
            Err(cause) => then.reply(host, tel, Err(cause)),
        }
    }

    /// A callback arrived: a pick's answer, or a request's last write done, is returned;
    /// releases and script loads end here.
    pub fn on_reply(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        token: u32,
        status: CallStatus,
        size: usize,
    ) -> Option<Answered> {
        let op = self.pending.remove(&token)?;
        let reply = match status {
            CallStatus::Ok => host.redis_reply(size).map_err(|_| Cause::BadReply),
            CallStatus::Failed => {
                tel.inc(host, Counter::RedisTimeouts);
                Err(Cause::RedisTimeout)
            }
        };
        match op {
            Op::Pick { ctx, decode } => {
                let reply = match reply {
                    Ok(bytes) => decode(host, tel, ctx, &bytes),
                    Err(cause) => PickReply::Failed(cause),
                };
                Some(Answered::Pick(PickAnswer { ctx, token, reply }))
            }
            Op::Release(rel) => {
                self.on_release_reply(host, tel, rel, reply);
                None
            }
            Op::Bind { ctx } => {
                if reply.is_err() {
                    tel.inc(host, Counter::RedisErrors);
                }
                let left = self.writes.get_mut(&ctx).map(|n| {
                    *n = n.saturating_sub(1);
                    *n
                });
                (left == Some(0)).then(|| {
                    self.writes.remove(&ctx);
                    Answered::Written(ctx)
                })
            }
            Op::Own(then) => {
                then.reply(host, tel, reply);
                None
            }
            Op::ScriptLoad | Op::Waiter | Op::Forget => {
                if reply.is_err() {
                    tel.inc(host, Counter::RedisErrors);
                }
                None
            }
        }
    }

    /// Initialises the config's Redis target once per VM. An unknown cluster is normal while
    /// Envoy is still receiving clusters, so init is retried before later calls.
    fn ensure_ready(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        config: &RouteConfig,
    ) -> bool {
        let Some(r) = &config.redis else {
            return false;
        };
        if self.ready.get(&r.init_cluster).copied().unwrap_or(false) {
            return true;
        }
        let ok = match host.redis_init(
            &r.init_cluster,
            &r.username,
            r.password.expose(),
            r.timeout_ms,
        ) {
            Ok(()) => true,
            Err(e) => {
                tel.log(
                    host,
                    LogLevel::Warn,
                    0,
                    format_args!("redis init of {}: {e}; will retry", r.cluster),
                );
                false
            }
        };
        self.ready.insert(r.init_cluster.clone(), ok);
        ok
    }

    fn call(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        config: &RouteConfig,
        query: &[u8],
    ) -> Result<u32, Cause> {
        if !self.ensure_ready(host, tel, config) {
            return Err(Cause::RedisUnavailable);
        }
        let Some(redis) = &config.redis else {
            return Err(Cause::RedisUnavailable);
        };
        tel.inc(host, Counter::RedisCalls);
        host.redis_call(&redis.cluster, query).map_err(|e| {
            tel.inc(host, Counter::RedisErrors);
            if e.kind == HostErrorKind::BadArgument {
                // The cluster went away (or never came): init again before the next call.
                self.ready.insert(redis.init_cluster.clone(), false);
            }
            tel.log(host, LogLevel::Debug, 0, format_args!("{e}"));
            Cause::RedisUnavailable
        })
    }

    /// Queues a prefix_cache request's first bytes, and sends the batches that are due.
    pub fn first_bytes(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        lease: &super::pick::Lease,
        booking: super::pick::Booking,
    ) {
        self.batches.add(lease, booking, host.now_ms());
        self.flush_first_bytes(host, tel);
    }

    /// Sends every first-bytes batch that is full or has waited long enough.
    pub fn flush_first_bytes(&mut self, host: &mut dyn Host, tel: &mut Telemetry) {
        if !self.batches.waiting() {
            return; // every stream end calls here: most routes never batch
        }
        for b in self.batches.due(host.now_ms()) {
            let rel = Release::new(b.config, LeaseKeys::FirstBytes(b.keys), b.done);
            self.send_release(host, tel, rel);
        }
    }

    fn send_release(&mut self, host: &mut dyn Host, tel: &mut Telemetry, rel: Release) {
        let query = rel.query(&self.scripts);
        match self.call(host, tel, &rel.config, &query) {
            Ok(token) => {
                tel.inc(host, rel.sent_counter());
                self.pending.insert(token, Op::Release(rel));
            }
            Err(_) => tel.inc(host, Counter::ReleaseFailures),
        }
    }

    fn on_release_reply(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        rel: Release,
        reply: Result<Vec<u8>, Cause>,
    ) {
        match rel.outcome(reply) {
            Outcome::Done(None) => {}
            Outcome::Done(Some(counter)) => tel.inc(host, counter),
            Outcome::Resend(rel) => {
                tel.inc(host, Counter::RedisNoScript);
                self.send_release(host, tel, rel);
            }
            Outcome::Failed(e) => {
                tel.inc(host, Counter::ReleaseFailures);
                if let Some(e) = e {
                    tel.log(
                        host,
                        LogLevel::Warn,
                        0,
                        format_args!("release failed: {e}; the lease expires on its own"),
                    );
                }
            }
        }
    }
}
