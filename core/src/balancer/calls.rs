//! The engine's Redis I/O: lazy init, dispatch, releases and their replies.

use super::{Balancer, Pending, Pick, Release};
use crate::config::RouteConfig;
use crate::host::{Host, HostErrorKind, LogLevel};
use crate::redis::scripts::{self, Keys, ReplyError};
use crate::stats::{Cause, Counter};
use std::rc::Rc;

impl Balancer {
    /// Initialises the config's Redis cluster once per VM. An unknown cluster (status 2) is
    /// normal while Envoy is still receiving clusters, so init is retried before later calls.
    pub(super) fn ensure_redis(&mut self, host: &mut dyn Host, config: &RouteConfig) -> bool {
        let Some(r) = &config.redis else {
            return false;
        };
        if self
            .redis_ready
            .get(&r.init_cluster)
            .copied()
            .unwrap_or(false)
        {
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
                self.log(
                    host,
                    LogLevel::Warn,
                    0,
                    format_args!("redis init of {}: {e}; will retry", r.cluster),
                );
                false
            }
        };
        self.redis_ready.insert(r.init_cluster.clone(), ok);
        ok
    }

    pub(super) fn redis_call(
        &mut self,
        host: &mut dyn Host,
        config: &RouteConfig,
        query: &[u8],
    ) -> Result<u32, Cause> {
        if !self.ensure_redis(host, config) {
            return Err(Cause::RedisUnavailable);
        }
        let Some(redis) = &config.redis else {
            return Err(Cause::RedisUnavailable);
        };
        self.stats.inc(host, Counter::RedisCalls);
        host.redis_call(&redis.cluster, query).map_err(|e| {
            self.stats.inc(host, Counter::RedisErrors);
            if e.kind == HostErrorKind::BadArgument {
                self.redis_ready.insert(redis.init_cluster.clone(), false);
            }
            self.log(host, LogLevel::Debug, 0, format_args!("{e}"));
            Cause::RedisUnavailable
        })
    }

    /// Fire-and-forget release of the first present lease among `members`. If it cannot even
    /// be sent, the lease expires on its own (leaseTTL) and a later acquire reclaims it.
    pub(super) fn release(
        &mut self,
        host: &mut dyn Host,
        config: &Rc<RouteConfig>,
        keys: Rc<Keys>,
        members: Vec<String>,
    ) {
        let rel = Release {
            config: config.clone(),
            keys,
            members,
            by_sha: true,
        };
        self.send_release(host, rel);
    }

    fn send_release(&mut self, host: &mut dyn Host, rel: Release) {
        let query = scripts::release_call(&self.scripts, rel.by_sha, &rel.keys, &rel.members);
        match self.redis_call(host, &rel.config, &query) {
            Ok(token) => {
                self.stats.inc(host, Counter::Releases);
                self.pending.insert(token, Pending::Release(rel));
            }
            Err(_) => self.stats.inc(host, Counter::ReleaseFailures),
        }
    }

    /// After a lost reply we do not know which endpoint the script chose (if it ran): offer
    /// Redis every possible lease member. Rare path, so O(endpoints) is fine.
    pub(super) fn release_any(&mut self, host: &mut dyn Host, pick: &Pick) {
        let members = pick
            .candidates
            .iter()
            .map(|ep| scripts::lease_member(&pick.request_id, ep, pick.cost))
            .collect();
        self.release(host, &pick.config, pick.keys.clone(), members);
    }

    pub(super) fn on_release_reply(
        &mut self,
        host: &mut dyn Host,
        mut rel: Release,
        reply: Result<Vec<u8>, Cause>,
    ) {
        let parsed = reply.map(|bytes| scripts::parse_release(&bytes));
        match parsed {
            Ok(Ok(_)) => {}
            Ok(Err(ReplyError::NoScript)) if rel.by_sha => {
                self.stats.inc(host, Counter::RedisNoScript);
                rel.by_sha = false;
                self.send_release(host, rel);
            }
            Ok(Err(e)) => {
                self.stats.inc(host, Counter::ReleaseFailures);
                self.log(
                    host,
                    LogLevel::Warn,
                    0,
                    format_args!("release failed: {e}; the lease expires on its own"),
                );
            }
            Err(_) => self.stats.inc(host, Counter::ReleaseFailures),
        }
    }

    /// Maps a bad acquire reply to a fallback cause, logging what Redis said.
    pub(super) fn reply_cause(&mut self, host: &mut dyn Host, ctx: u32, e: &ReplyError) -> Cause {
        self.stats.inc(host, Counter::RedisErrors);
        self.log(host, LogLevel::Debug, ctx, format_args!("{e}"));
        match e {
            ReplyError::Malformed(_) => Cause::BadReply,
            ReplyError::Redis(_) | ReplyError::NoScript => Cause::RedisError,
        }
    }
}
