//! Releases: the fire-and-forget script calls that give back what a pick acquired (a lease,
//! a cluster route's global in-flight count) or a prefix_cache request's booked prefill tokens
//! (its first bytes, batched in first_bytes.rs). Here: which call a release is, and what its
//! reply comes to; the Redis client sends it. A release that cannot be sent, or fails, costs
//! nothing lasting: its lease expires on its own (leaseTTL) and a later acquire reclaims it
//! (docs/redis-data-model.md).

use crate::config::RouteConfig;
use crate::reason::Cause;
use crate::redis::inflight::{self, InflightKeys};
use crate::redis::scripts::release::Learned;
use crate::redis::scripts::{self, Keys, Released, ReplyError, Scripts};
use crate::stats::Counter;
use std::rc::Rc;

/// Which keys a lease lives in: an endpoint route's, or a cluster route's global in-flight
/// count.
#[derive(Debug, Clone)]
pub enum LeaseKeys {
    /// `booked`: prefix_cache, whose leases may carry a prefill booking; `learned`: what the
    /// request's outcome teaches about the endpoint at `now_ms` (failure memory).
    Endpoint {
        keys: Rc<Keys>,
        booked: bool,
        learned: Learned,
        now_ms: u64,
    },
    /// A lease the host's retry answered from `to`: moved there, its endpoint's failure
    /// learned at `now_ms` (moved.lua); the moved lease expires at `expiry_ms`.
    Moved {
        keys: Rc<Keys>,
        booked: bool,
        to: String,
        now_ms: u64,
        expiry_ms: u64,
    },
    Service(Rc<InflightKeys>),
    /// prefix_cache's first bytes: (lease id, endpoint, rate sample) triples, not lease members.
    FirstBytes(Rc<Keys>),
}

/// A release to send, or in flight (sent by script hash first; once more with EVAL on
/// NOSCRIPT).
pub struct Release {
    /// The route whose Redis target the release goes to.
    pub config: Rc<RouteConfig>,
    keys: LeaseKeys,
    members: Vec<String>,
    by_sha: bool,
}

/// What a release's reply comes to.
pub enum Outcome {
    /// Done; what failure memory did, when it did something worth counting.
    Done(Option<Counter>),
    /// The script cache was flushed: send it again with EVAL (counted as NOSCRIPT).
    Resend(Release),
    /// Not released; the error to log, when Redis said why (None: no reply at all).
    Failed(Option<ReplyError>),
}

impl Release {
    pub fn new(config: Rc<RouteConfig>, keys: LeaseKeys, members: Vec<String>) -> Release {
        Release {
            config,
            keys,
            members,
            by_sha: true,
        }
    }

    /// Its script call.
    pub fn query(&self, scripts: &Scripts) -> Vec<u8> {
        match &self.keys {
            LeaseKeys::Endpoint {
                keys,
                booked,
                learned,
                now_ms,
            } => {
                let learn = (*learned, *now_ms, &self.config.common.ejection);
                let script = (scripts, self.by_sha);
                scripts::release::release_call(script, keys, &self.members, *booked, learn)
            }
            LeaseKeys::Moved {
                keys,
                booked,
                to,
                now_ms,
                expiry_ms,
            } => {
                let member = self.members.first().map_or("", String::as_str);
                let learn = (*now_ms, *expiry_ms, &self.config.common.ejection);
                scripts::release::moved_call(keys, (member, to), *booked, learn)
            }
            LeaseKeys::FirstBytes(k) => {
                scripts::release::prefill_done_call(scripts, self.by_sha, k, &self.members)
            }
            LeaseKeys::Service(k) => inflight::release_call(scripts, self.by_sha, k, &self.members),
        }
    }

    /// What its sending counts.
    pub fn sent_counter(&self) -> Counter {
        match self.keys {
            LeaseKeys::FirstBytes(_) => Counter::FirstBytesSent,
            _ => Counter::Releases,
        }
    }

    /// What `reply` to it comes to.
    pub fn outcome(mut self, reply: Result<Vec<u8>, Cause>) -> Outcome {
        match reply.map(|bytes| scripts::parse_release(&bytes)) {
            Ok(Ok(Released::Ejected)) => Outcome::Done(Some(Counter::Ejected)),
            Ok(Ok(Released::EjectionRefused)) => Outcome::Done(Some(Counter::EjectionRefused)),
            Ok(Ok(_)) => Outcome::Done(None),
            Ok(Err(ReplyError::NoScript)) if self.by_sha => {
                self.by_sha = false;
                Outcome::Resend(self)
            }
            Ok(Err(e)) => Outcome::Failed(Some(e)),
            Err(_) => Outcome::Failed(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PluginConfig;
    use crate::redis::resp;

    fn release() -> Release {
        let json = br#"{"lb_policy":"global_least_request","lb_config":{"serviceFQDN":"redis.static","servicePort":6379}}"#;
        let config = PluginConfig::parse(json).unwrap().global.unwrap();
        let keys = Rc::new(Keys::new("ailb", "chat", "outbound|80||llm"));
        let members = vec!["rid|10.0.0.1:80|1".to_string()];
        Release::new(
            config,
            LeaseKeys::Endpoint {
                keys,
                booked: false,
                learned: Learned::Nothing,
                now_ms: 0,
            },
            members,
        )
    }

    /// The command word of a query (EVALSHA or EVAL).
    fn verb(query: &[u8]) -> String {
        match resp::decode_exact(query).unwrap() {
            resp::Value::Array(Some(words)) => words[0].as_str().unwrap().to_string(),
            other => panic!("not a command: {other:?}"),
        }
    }

    #[test]
    fn noscript_sends_once_more_by_eval_then_gives_up() {
        let scripts = Scripts::new();
        let rel = release();
        assert_eq!(verb(&rel.query(&scripts)), "EVALSHA");
        let noscript = || Ok(b"-NOSCRIPT No matching script.\r\n".to_vec());
        let Outcome::Resend(rel) = rel.outcome(noscript()) else {
            panic!("NOSCRIPT by hash is sent again");
        };
        assert_eq!(verb(&rel.query(&scripts)), "EVAL");
        assert!(matches!(
            rel.outcome(noscript()),
            Outcome::Failed(Some(ReplyError::NoScript))
        ));
    }

    #[test]
    fn a_reply_releases_or_fails() {
        assert!(matches!(
            release().outcome(Ok(b":1\r\n".to_vec())),
            Outcome::Done(None)
        ));
        assert!(matches!(
            release().outcome(Ok(b":0\r\n".to_vec())),
            Outcome::Done(None)
        ));
        assert!(matches!(
            release().outcome(Ok(b":2\r\n".to_vec())),
            Outcome::Done(Some(Counter::Ejected))
        ));
        assert!(matches!(
            release().outcome(Ok(b":3\r\n".to_vec())),
            Outcome::Done(Some(Counter::EjectionRefused))
        ));
        assert!(matches!(
            release().outcome(Ok(b"+OK\r\n".to_vec())),
            Outcome::Failed(Some(ReplyError::Malformed(_)))
        ));
        assert!(matches!(
            release().outcome(Err(Cause::RedisUnavailable)),
            Outcome::Failed(None)
        ));
        assert_eq!(release().sent_counter(), Counter::Releases);
    }
}
