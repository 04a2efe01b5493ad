//! The Lua scripts, their SHA-1s, the Redis keys they touch, and the typed form of their
//! arguments and replies. Every key a script touches is passed in KEYS and all of them share
//! one hash tag, so each call stays in one slot (Redis Cluster proxies accept it).

use super::resp;
use sha1::{Digest, Sha1};
use std::sync::Arc;

pub mod latency;
mod prefix;
pub mod release;
mod reply;
pub use prefix::{lease_id, LatencyArgs, PrefixArgs, PrefixChain};
pub(super) use reply::decode;
pub use reply::{
    parse_acquire, parse_release, AcquireReply, Booked, Predicted, Released, ReplyError,
    SessionState,
};

/// A script text and its SHA-1 for EVALSHA.
#[derive(Debug, Clone)]
pub struct Script {
    pub text: Arc<str>,
    pub sha: String,
}

impl Script {
    /// The script made of `parts` in order, hashed.
    fn new(parts: &[&str]) -> Script {
        let text: Arc<str> = parts.concat().into();
        Script {
            sha: hex::encode(Sha1::digest(text.as_bytes())),
            text,
        }
    }

    /// The script made of `parts`, sent whole with EVAL (no SHA: a rare call).
    pub(super) fn eval(parts: &[&str]) -> Script {
        Script {
            text: parts.concat().into(),
            sha: String::new(),
        }
    }
}

// The shared parts each script starts with are kept once in the module and joined when the
// VM starts (`Scripts::new`): as `concat!` constants they were in the binary once per script
// that uses them, about 30 KB of the module (its size guard: docs/plugin-cpu.md "What matters").
const LEASE: &str = include_str!("scripts/lease.lua");
const HEALTH: &str = include_str!("scripts/health.lua");
const PICK: &str = include_str!("scripts/pick.lua");
const SERVICE_LEASE: &str = include_str!("scripts/service_lease.lua");

pub const GLR_ACQUIRE: &[&str] = &[LEASE, HEALTH, PICK, include_str!("scripts/glr_acquire.lua")];
pub const PREFIX_ACQUIRE: &[&str] = &[
    LEASE,
    HEALTH,
    PICK,
    include_str!("scripts/prefix_acquire.lua"),
];
/// prefix_cache's batched first-bytes: bookings given back, prefill rates learned (§13).
pub const PREFILL_DONE: &[&str] = &[LEASE, include_str!("scripts/prefill_done.lua")];
pub const RELEASE: &[&str] = &[LEASE, HEALTH, include_str!("scripts/release.lua")];
/// A lease the host's retry answered from another endpoint: moved there, its endpoint's
/// failure learned (§14).
pub const MOVED: &[&str] = &[LEASE, HEALTH, include_str!("scripts/moved.lua")];
pub const SERVICE_ACQUIRE: &[&str] = &[SERVICE_LEASE, include_str!("scripts/service_acquire.lua")];
/// prefix_cache's engine-verified keys: a pod's generation bump (docs/redis-data-model.md §5).
pub const PREFIX_FORGET: &[&str] = &[include_str!("scripts/prefix_forget.lua")];
/// endpoint_metrics sessions with Redis (Higress build): keep, or bind anew, in one call.
pub const SESSION_BIND: &[&str] = &[include_str!("scripts/session_bind.lua")];
pub const SERVICE_RELEASE: &[&str] = &[SERVICE_LEASE, include_str!("scripts/service_release.lua")];

/// What health.lua adds to an ejected endpoint's load score (`EJECTED`): a load read from
/// Redis is `score % EJECTED_MARK` (docs/redis-data-model.md §14).
pub const EJECTED_MARK: f64 = 1e12;

/// The scripts one VM uses, hashed once at start.
#[derive(Debug, Clone)]
pub struct Scripts {
    pub acquire: Script,
    pub prefix_acquire: Script,
    pub release: Script,
    pub prefill_done: Script,
    /// cluster_metrics global in-flight (`super::inflight`).
    pub service_acquire: Script,
    pub service_release: Script,
    /// endpoint_metrics session binding (its routes' only script).
    pub session_bind: Script,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            acquire: Script::new(GLR_ACQUIRE),
            prefix_acquire: Script::new(PREFIX_ACQUIRE),
            release: Script::new(RELEASE),
            prefill_done: Script::new(PREFILL_DONE),
            service_acquire: Script::new(SERVICE_ACQUIRE),
            service_release: Script::new(SERVICE_RELEASE),
            session_bind: Script::new(SESSION_BIND),
        }
    }

    /// The endpoint policies' scripts.
    pub fn all(&self) -> [&Script; 3] {
        [&self.acquire, &self.prefix_acquire, &self.release]
    }

    /// The scripts a route calls (preloaded with `SCRIPT LOAD` at configure): a cluster route
    /// only the global in-flight pair; a prefix_cache route also its first bytes'.
    pub fn for_route(&self, cluster: bool, prefix: bool) -> Vec<&Script> {
        match (cluster, prefix) {
            (true, _) => vec![&self.service_acquire, &self.service_release],
            (false, true) => {
                let mut all = self.all().to_vec();
                all.push(&self.prefill_done);
                all
            }
            (false, false) => self.all().to_vec(),
        }
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts::new()
    }
}

/// The keys of one (route, cluster): `<prefix>:{<route>|<cluster>}:<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    pub namespace: String,
    pub load: String,
    pub leases: String,
    pub members: String,
    /// The waiting queue's waiters of every gateway (docs/redis-data-model.md §12).
    pub wait: String,
    /// prefix_cache: each pod's generation (hash; docs/redis-data-model.md §5).
    pub gen: String,
    /// Tenant fairness (docs/redis-data-model.md §11): tenant -> in-flight cost (hash), and
    /// tenant -> its last request (zset).
    pub tenants: String,
    pub seen: String,
    /// prefix_cache's token gate (docs/redis-data-model.md §13): endpoint -> booked prefill
    /// tokens (zset), lease id -> "<endpoint>|<tokens>" (hash), endpoint -> learned prefill
    /// rate in tokens/s (hash).
    pub prefill: String,
    pub booked: String,
    pub rates: String,
    /// Failure memory (docs/redis-data-model.md §14): per endpoint its failures in a row, its
    /// ejections and trial (hash), and until when it is ejected (zset).
    pub health: String,
    pub ejected: String,
    /// prefix_cache's latency models (docs/redis-data-model.md §15): endpoint -> the fleet's
    /// statistics (hash of CSV records), endpoint -> the coefficients the pick reads (hash).
    pub latency: String,
    pub latency_coef: String,
}

impl Keys {
    pub fn new(prefix: &str, route: &str, cluster: &str) -> Keys {
        // Braces inside the names would end the hash tag early or start another one.
        let clean = |s: &str| s.replace(['{', '}'], "_");
        let namespace = format!("{prefix}:{{{}|{}}}", clean(route), clean(cluster));
        Keys {
            load: format!("{namespace}:load"),
            leases: format!("{namespace}:leases"),
            members: format!("{namespace}:members"),
            wait: format!("{namespace}:wait"),
            tenants: format!("{namespace}:tenants"),
            seen: format!("{namespace}:tenants_seen"),
            prefill: format!("{namespace}:prefill"),
            booked: format!("{namespace}:prefill_booked"),
            rates: format!("{namespace}:prefill_rate"),
            gen: format!("{namespace}:gen"),
            health: format!("{namespace}:health"),
            ejected: format!("{namespace}:ejected"),
            latency: format!("{namespace}:latency"),
            latency_coef: format!("{namespace}:latency_coef"),
            namespace,
        }
    }
}

/// `EVALSHA sha n keys... args...`, or `EVAL text ...` after a NOSCRIPT.
pub fn call(script: &Script, by_sha: bool, keys: &[&str], args: &[&[u8]]) -> Vec<u8> {
    let numkeys = keys.len().to_string();
    let mut parts: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + args.len());
    if by_sha {
        parts.push(b"EVALSHA");
        parts.push(script.sha.as_bytes());
    } else {
        parts.push(b"EVAL");
        parts.push(script.text.as_bytes());
    }
    parts.push(numkeys.as_bytes());
    parts.extend(keys.iter().map(|k| k.as_bytes()));
    parts.extend_from_slice(args);
    resp::encode_command(&parts)
}

/// endpoint_metrics: keep the session `key` on its pod if it is one of `keep` (or `choice`),
/// else bind it to `choice`; either way its TTL is `ttl_s` from now (docs/redis-data-model.md
/// §10). The reply parses as an acquire's ([`parse_acquire`]).
pub fn session_bind_call(
    scripts: &Scripts,
    by_sha: bool,
    key: &str,
    ttl_s: u64,
    choice: &str,
    keep: &[String],
) -> Vec<u8> {
    let ttl = ttl_s.to_string();
    let mut args: Vec<&[u8]> = Vec::with_capacity(2 + keep.len());
    args.push(ttl.as_bytes());
    args.push(choice.as_bytes());
    args.extend(keep.iter().map(|k| k.as_bytes()));
    call(&scripts.session_bind, by_sha, &[key], &args)
}

/// `SCRIPT LOAD text`.
pub fn load(script: &Script) -> Vec<u8> {
    resp::encode_command(&[b"SCRIPT".as_slice(), b"LOAD", script.text.as_bytes()])
}

/// How many expired leases every acquire gives back (`reclaim`), endpoint and service scripts
/// alike: what a crashed gateway or a lost release left behind is given back by the first
/// acquire on its route after the lease expired (docs/redis-data-model.md §6). With nothing
/// expired it is one `ZRANGEBYSCORE` that finds nothing. A random 1 in 16, used before, left
/// healing to chance: after a Redis failover some routes kept a leaked count for 90 picks and
/// more (e2e/suite/tests/e2e/redis_cluster.rs).
pub const RECLAIM_LIMIT: u32 = 4;

/// Arguments of one acquire (see glr_acquire.lua for their order).
#[derive(Debug, Clone)]
pub struct AcquireArgs<'a> {
    pub now_ms: u64,
    pub lease_ttl_ms: u64,
    pub request_id: &'a str,
    pub cost: u64,
    pub cap: u64,
    pub random: u32,
    pub fingerprint: &'a str,
    pub reclaim: u32,
    /// The full healthy set, sent only when Redis may not have it.
    pub endpoints: Option<&'a [String]>,
    /// Session stickiness: the session's binding rides in the same call.
    pub session: Option<SessionArgs<'a>>,
    /// Waiting queue: the request's class rank, checked against the waiters of higher classes
    /// (`Keys::wait`); None: no check (no queue, or no priority classes).
    pub wait_rank: Option<usize>,
    /// `maxPoolRequests` (or the request's class cap of it); 0 = none.
    pub pool_cap: u64,
    /// Tenant fairness: the request's tenant.
    pub tenant: Option<TenantArgs<'a>>,
    /// Failure memory: how many requests an endpoint on trial takes (0: off).
    pub trials: u64,
}

/// What a tenant adds to an acquire (docs/redis-data-model.md §11).
#[derive(Debug, Clone)]
pub struct TenantArgs<'a> {
    /// The tenant id (`config::fairness::tenant_id`: hex).
    pub id: &'a str,
    /// The most the tenant may hold while another tenant is active.
    pub limit: u64,
    pub window_ms: u64,
}

/// What a session adds to an acquire (docs/redis-data-model.md §10).
#[derive(Debug, Clone)]
pub struct SessionArgs<'a> {
    /// The session's full Redis key ([`session_key`]).
    pub key: &'a str,
    pub ttl_s: u64,
    /// The guard (global_least_request; prefix_cache uses its own affinity bounds).
    pub max_imbalance: u64,
    pub max_imbalance_ratio: f64,
}

/// A session's key: `<namespace>:session:<SHA-1 of the id>`. Hashed so that any id (10 KB,
/// unicode, binary) is a short key; in the route's hash tag so the call stays in one slot.
pub fn session_key(namespace: &str, id: &[u8]) -> String {
    format!("{namespace}:session:{}", hex::encode(Sha1::digest(id)))
}

pub fn acquire_call(scripts: &Scripts, by_sha: bool, keys: &Keys, a: &AcquireArgs) -> Vec<u8> {
    pick_call(scripts, by_sha, keys, a, None)
}

/// An acquire: least-request (`prefix` None) or prefix_cache.
pub fn pick_call(
    scripts: &Scripts,
    by_sha: bool,
    keys: &Keys,
    a: &AcquireArgs,
    prefix: Option<&PrefixArgs>,
) -> Vec<u8> {
    let fixed = [
        a.now_ms.to_string(),
        a.lease_ttl_ms.to_string(),
        a.request_id.to_string(),
        a.cost.to_string(),
        a.cap.to_string(),
        a.random.to_string(),
        a.fingerprint.to_string(),
        a.reclaim.to_string(),
    ];
    let mut args: Vec<&[u8]> = fixed.iter().map(|s| s.as_bytes()).collect();
    let session_ttl = a.session.as_ref().map_or(0, |s| s.ttl_s).to_string();
    let policy_args: Vec<String> = match (prefix, &a.session) {
        (Some(p), _) => vec![
            p.ttl_s.to_string(),
            p.max_imbalance.to_string(),
            p.max_imbalance_ratio.to_string(),
            session_ttl,
        ],
        (None, Some(s)) => vec![
            session_ttl,
            s.max_imbalance.to_string(),
            s.max_imbalance_ratio.to_string(),
        ],
        (None, None) => vec![session_ttl, "0".into(), "0".into()],
    };
    args.extend(policy_args.iter().map(|s| s.as_bytes()));
    let admission = [
        a.pool_cap.to_string(),
        a.tenant.as_ref().map_or("", |t| t.id).to_string(),
        a.tenant.as_ref().map_or(0, |t| t.limit).to_string(),
        a.tenant.as_ref().map_or(1, |t| t.window_ms).to_string(),
        a.wait_rank.map_or("-1".to_string(), |r| r.to_string()),
    ];
    args.extend(admission.iter().map(|s| s.as_bytes()));
    // prefix_cache's five gate figures, the trials (both scripts), then its per-key tokens.
    let gate = prefix.map(PrefixArgs::gate_args).unwrap_or_default();
    let (figures, per_key) = gate.split_at(gate.len().min(5));
    let trials = a.trials.to_string();
    args.extend(figures.iter().map(|s| s.as_bytes()));
    args.push(trials.as_bytes());
    let latency = prefix.map(PrefixArgs::latency_args).unwrap_or_default();
    args.extend(latency.iter().map(|s| s.as_bytes()));
    args.extend(per_key.iter().map(|s| s.as_bytes()));
    if let Some(eps) = a.endpoints {
        args.extend(eps.iter().map(|e| e.as_bytes()));
    }
    let mut all_keys: Vec<&str> = vec![&keys.load, &keys.leases, &keys.members];
    let script = match prefix {
        None => &scripts.acquire,
        Some(p) => {
            all_keys.extend([
                keys.prefill.as_str(),
                &keys.booked,
                &keys.rates,
                &keys.gen,
                &keys.latency_coef,
            ]);
            all_keys.extend(p.chain.keys.iter().map(String::as_str));
            &scripts.prefix_acquire
        }
    };
    if let Some(s) = &a.session {
        all_keys.push(s.key);
    }
    // Always sent, so the scripts find them from the end (glr_acquire.lua).
    all_keys.extend([
        keys.health.as_str(),
        keys.ejected.as_str(),
        keys.wait.as_str(),
        keys.tenants.as_str(),
        keys.seen.as_str(),
    ]);
    call(script, by_sha, &all_keys, &args)
}

/// The lease member a successful acquire wrote: `<request id>|<endpoint>|<cost>`, with
/// `<request id>~<tenant id>` as the first part for a tenant's request (lease.lua).
pub fn lease_member(request_id: &str, endpoint: &str, cost: u64, tenant: Option<&str>) -> String {
    format!("{}|{endpoint}|{cost}", lease_id(request_id, tenant))
}

/// Lease `member` moved to `endpoint`: the same id and cost (moved.lua writes it so); None
/// for a member that is not `<id>|<endpoint>|<cost>`.
pub fn moved_member(member: &str, endpoint: &str) -> Option<String> {
    let (id, rest) = member.split_once('|')?;
    let (_, cost) = rest.rsplit_once('|')?;
    Some(format!("{id}|{endpoint}|{cost}"))
}

#[cfg(test)]
mod tests;
