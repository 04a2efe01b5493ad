//! Responses continuations (docs/sessions-and-queues.md "Agent sessions", docs/redis-data-model.md
//! §10 "Responses continuations"): a Responses answer's id is recorded against the pod that
//! produced it, so a later request naming it in `previous_response_id` goes to that pod, whose
//! KV cache holds the conversation (session.rs reads the request's side).
//!
//! The recording is a holding of its own, [`Continued`], wrapping what the policy holds (a
//! Redis lease, a per-proxy count, prefix_cache's verification, or nothing): at the response
//! headers of a 2xx it asks the machine to read the answer's id from the answer's head
//! (`ReadResponse::answer_id`), and records the id as soon as the machine has it
//! (`Holding::answer_id`: a stream's first event, a JSON answer's first chunk), before the
//! bytes that carry it reach the client:
//! - in Redis (`<ns>:resp:<sha1>`, the route's hash tag, `agentSessionTTL`), one `SET … EX`
//!   sent for the request (`RedisClient::bind`): the machine holds the answer's last chunk
//!   until it is answered (`Balancer::holds_response`), so the client never has a whole answer
//!   whose record is not in Redis;
//! - in this proxy's shared data ([`Table`]: plain Envoy, and endpoint_metrics without Redis),
//!   bounded as the plain-Envoy prefix index is (prefix/local_index.rs), written at once.
//!
//! Not with the lease's release, though that call is sent anyway: it goes at stream end, after
//! the client has the whole answer, and an agent that sends its next turn at once through
//! another gateway can reach Redis first (the e2e chains lost continuations so; and so did an
//! unheld `SET` on a loaded machine).

use crate::balancer::events::Decision;
use crate::balancer::holding::{Holding, Outcome, ReadResponse, Services};
use crate::balancer::shared;
use crate::config::RouteConfig;
use crate::hash;
use crate::host::{Host, HostError, LogLevel};
use crate::prefix::local_index::{self, Layout, Shard};
use crate::prefix::PrefixKey;
use crate::redis::bind::{self, Bind};
use crate::redis::scripts::Keys;
use crate::stats::Counter;
use sha1::{Digest, Sha1};
use std::rc::Rc;

/// Entries of one route config's [`Table`] per proxy: 256 records of 256, 1.25 MiB at most,
/// as the plain-Envoy prefix index's default. At `agentSessionTTL` 1800 s that keeps every
/// response of 36 a second; beyond, the oldest go first (docs/sessions-and-queues.md).
pub const TABLE_ENTRIES: usize = 65_536;

/// Where a route's responses are recorded.
#[derive(Debug, Clone)]
pub enum Store {
    /// The route's Redis (its keys' namespace).
    Redis {
        config: Rc<RouteConfig>,
        keys: Rc<Keys>,
    },
    /// This proxy's shared data.
    Local(Rc<Table>),
}

/// How a request's answer id is recorded: where, and for how long.
#[derive(Debug, Clone)]
pub struct Record {
    pub store: Store,
    pub ttl_s: u64,
}

/// A routed request whose answer's id is recorded against the pod it was placed on.
#[derive(Debug)]
pub struct Continued {
    inner: Option<Box<dyn Holding>>,
    endpoint: String,
    record: Record,
    /// The answer is a 2xx: its id is read.
    read: bool,
}

impl Continued {
    pub fn new(inner: Option<Box<dyn Holding>>, endpoint: String, record: Record) -> Continued {
        Continued {
            inner,
            endpoint,
            record,
            read: false,
        }
    }

    /// Records `id` → this request's pod.
    fn record(&self, svc: &mut Services, id: &str) {
        match &self.record.store {
            Store::Redis { config, keys } => {
                let bind = Bind {
                    key: bind::response_key(&keys.namespace, id.as_bytes()),
                    value: self.endpoint.clone(),
                    ttl_s: self.record.ttl_s,
                };
                if !svc.redis.bind(svc.host, svc.tel, (config, svc.ctx), &bind) {
                    return; // not sent (counted as a Redis error): the next turn is placed anew
                }
            }
            Store::Local(table) => {
                let now = svc.host.now_ms();
                let ttl_ms = self.record.ttl_s.saturating_mul(1000);
                if let Err(e) = table.record(svc.host, id.as_bytes(), &self.endpoint, now, ttl_ms) {
                    let msg = format_args!("{e}: response {id:.64} not recorded");
                    svc.tel.log(svc.host, LogLevel::Debug, svc.ctx, msg);
                    return;
                }
            }
        }
        svc.tel.inc(svc.host, Counter::ResponseRecorded);
    }
}

impl Holding for Continued {
    fn wants_first_bytes(&self) -> bool {
        self.inner.as_ref().is_some_and(|h| h.wants_first_bytes())
    }

    fn first_bytes(&mut self, svc: &mut Services, outcome: &Outcome) {
        if let Some(h) = self.inner.as_mut() {
            h.first_bytes(svc, outcome);
        }
    }

    /// The id of a 2xx answer only: an error names no response to continue.
    fn read_response(&mut self, svc: &mut Services, outcome: &Outcome) -> Option<ReadResponse> {
        let inner = self
            .inner
            .as_mut()
            .and_then(|h| h.read_response(svc, outcome));
        self.read = outcome.status.is_some_and(|s| (200..300).contains(&s));
        let own = self.read.then_some(ReadResponse {
            usage: false,
            take_usage_event: false,
            answer_id: true,
        });
        ReadResponse::and(inner, own)
    }

    /// As soon as the answer's id is read: recorded now, before the client has it.
    fn answer_id(&mut self, svc: &mut Services, outcome: &Outcome) {
        if let Some(h) = self.inner.as_mut() {
            h.answer_id(svc, outcome);
        }
        if let Some(id) = outcome.answer_id.as_deref().filter(|_| self.read) {
            self.record(svc, id);
        }
    }

    fn give_back(self: Box<Self>, svc: &mut Services, outcome: Option<&Outcome>) {
        if let Some(h) = self.inner {
            h.give_back(svc, outcome);
        }
    }

    fn counted(&self) -> Option<&str> {
        self.inner.as_ref().and_then(|h| h.counted())
    }

    /// The pod that answered holds the conversation: the answer's id is recorded against it.
    fn served_elsewhere(&mut self, svc: &mut Services, served: &str) {
        self.endpoint = served.to_string();
        if let Some(h) = self.inner.as_mut() {
            h.served_elsewhere(svc, served);
        }
    }

    #[cfg(test)]
    fn ledger(&self) -> Vec<String> {
        self.inner.as_ref().map(|h| h.ledger()).unwrap_or_default()
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// `decision` with its holding wrapped in [`Continued`] when the request's answer is to be
/// recorded (`record`); any other decision as it is.
pub fn hold(decision: Decision, record: Option<Record>) -> Decision {
    match (decision, record) {
        (
            Decision::Route {
                place,
                reason,
                hold,
            },
            Some(record),
        ) => {
            let endpoint = place.to.endpoint.clone();
            Decision::Route {
                hold: Some(Box::new(Continued::new(hold, endpoint, record))),
                place,
                reason,
            }
        }
        (decision, _) => decision,
    }
}

/// One route config's responses in this proxy's shared data: response id → the tag of the pod
/// that produced it (`local_index::endpoint_tag`), each entry until its expiry, a full record
/// evicting the entry that expires first ([`Shard`]).
#[derive(Debug)]
pub struct Table {
    base: String,
    layout: Layout,
}

impl Table {
    /// `position`: the config's place among the plugin's route configs, so each route keeps
    /// its own table.
    pub fn new(position: usize, config: &RouteConfig) -> Table {
        let layout = Layout::new(TABLE_ENTRIES);
        let identity = format!(
            "{position}\n{}\n{}",
            config.common.key_prefix,
            layout.shards()
        );
        Table {
            base: format!(
                "ailb.resp.{:016x}",
                hash::fnv1a(hash::FNV_OFFSET, identity.as_bytes())
            ),
            layout,
        }
    }

    /// The tag of the pod that produced response `id`, while its entry lives. A record that
    /// cannot be read or decoded knows nothing.
    pub fn lookup(&self, host: &dyn Host, id: &[u8], now_ms: u64) -> Option<u32> {
        let key = key_of(id);
        let name = local_index::shard_key(&self.base, self.layout.shard_of(&key));
        let (bytes, _) = host.shared_get(&name).ok().flatten()?;
        Shard::lookup(&bytes, &key, now_ms).ok().flatten()
    }

    /// Records response `id` → `endpoint` until `now_ms + ttl_ms` (one CAS update; a corrupt
    /// record is started afresh).
    pub fn record(
        &self,
        host: &mut dyn Host,
        id: &[u8],
        endpoint: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<(), HostError> {
        let key = key_of(id);
        let name = local_index::shard_key(&self.base, self.layout.shard_of(&key));
        let tag = local_index::endpoint_tag(endpoint);
        shared::update(host, &name, |cur| {
            let mut shard = Shard::decode(cur.as_deref()).unwrap_or_default();
            shard.put(&key, tag, now_ms.saturating_add(ttl_ms));
            (shard.into_bytes(), ())
        })
    }
}

/// The position among `addresses` of the pod whose tag is `tag`, if it is one of them.
pub fn resolve<'a>(tag: u32, addresses: impl IntoIterator<Item = &'a String>) -> Option<usize> {
    addresses
        .into_iter()
        .position(|a| local_index::endpoint_tag(a) == tag)
}

/// A response id's table key: the first 8 bytes of its SHA-1 (ids of any length or bytes).
fn key_of(id: &[u8]) -> PrefixKey {
    let digest = Sha1::digest(id);
    let mut key = [0u8; 8];
    key.copy_from_slice(digest.get(..8).unwrap_or(&[0; 8]));
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PluginConfig;
    use crate::host::mock::MockHost;

    fn route() -> RouteConfig {
        let json =
            br#"{"lb_policy":"global_least_request","lb_config":{"endpoints":["10.0.0.1:80"]}}"#;
        let parsed = PluginConfig::parse_for(json, crate::config::Build::Envoy).unwrap();
        parsed.global.unwrap().as_ref().clone()
    }

    #[test]
    fn a_table_keeps_each_response_until_it_expires() {
        let mut host = MockHost::new();
        let t = Table::new(0, &route());
        assert_eq!(t.lookup(&host, b"resp_1", 0), None);
        t.record(&mut host, b"resp_1", "10.0.0.2:80", 1_000, 60_000)
            .unwrap();
        let tag = t.lookup(&host, b"resp_1", 2_000).unwrap();
        let eps = ["10.0.0.1:80".to_string(), "10.0.0.2:80".to_string()];
        assert_eq!(resolve(tag, &eps), Some(1));
        assert_eq!(resolve(tag, &eps[..1]), None, "a pod no longer listed");
        assert_eq!(t.lookup(&host, b"resp_1", 61_000), None, "expired");
        assert_eq!(t.lookup(&host, b"resp_2", 2_000), None);
        // Another route's table is another name.
        assert_eq!(
            Table::new(1, &route()).lookup(&host, b"resp_1", 2_000),
            None
        );
        // Ids of any length or bytes.
        let huge = vec![0xffu8; 100_000];
        t.record(&mut host, &huge, "10.0.0.1:80", 1_000, 60_000)
            .unwrap();
        assert_eq!(
            resolve(t.lookup(&host, &huge, 2_000).unwrap(), &eps),
            Some(0)
        );
    }

    #[test]
    fn a_corrupt_record_knows_nothing_and_is_started_afresh() {
        let mut host = MockHost::new();
        let t = Table::new(0, &route());
        let key = key_of(b"resp_1");
        let name = local_index::shard_key(&t.base, t.layout.shard_of(&key));
        host.shared_set(&name, b"garbage", 0).unwrap();
        assert_eq!(t.lookup(&host, b"resp_1", 0), None);
        t.record(&mut host, b"resp_1", "10.0.0.1:80", 0, 1_000)
            .unwrap();
        assert!(t.lookup(&host, b"resp_1", 0).is_some());
    }
}
