//! The Lua scripts, their SHA-1s, the Redis keys they touch, and the typed form of their
//! arguments and replies. Every key a script touches is passed in KEYS and all of them share
//! one hash tag, so each call stays in one slot (Redis Cluster proxies accept it).

use super::resp::{self, Value};
use sha1::{Digest, Sha1};

/// A script text and its SHA-1 for EVALSHA.
#[derive(Debug, Clone)]
pub struct Script {
    pub text: &'static str,
    pub sha: String,
}

impl Script {
    fn new(text: &'static str) -> Script {
        Script {
            text,
            sha: hex::encode(Sha1::digest(text.as_bytes())),
        }
    }
}

pub const GLR_ACQUIRE: &str = concat!(
    include_str!("scripts/lease.lua"),
    include_str!("scripts/pick.lua"),
    include_str!("scripts/glr_acquire.lua")
);
pub const PREFIX_ACQUIRE: &str = concat!(
    include_str!("scripts/lease.lua"),
    include_str!("scripts/pick.lua"),
    include_str!("scripts/prefix_acquire.lua")
);
pub const RELEASE: &str = concat!(
    include_str!("scripts/lease.lua"),
    include_str!("scripts/release.lua")
);
pub const SERVICE_ACQUIRE: &str = concat!(
    include_str!("scripts/service_lease.lua"),
    include_str!("scripts/service_acquire.lua")
);
/// endpoint_metrics sessions with Redis (Higress build): keep, or bind anew, in one call.
pub const SESSION_BIND: &str = include_str!("scripts/session_bind.lua");
pub const SERVICE_RELEASE: &str = concat!(
    include_str!("scripts/service_lease.lua"),
    include_str!("scripts/service_release.lua")
);

/// The scripts one VM uses, hashed once at start.
#[derive(Debug, Clone)]
pub struct Scripts {
    pub acquire: Script,
    pub prefix_acquire: Script,
    pub release: Script,
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
    /// only the global in-flight pair.
    pub fn for_route(&self, cluster: bool) -> Vec<&Script> {
        if cluster {
            vec![&self.service_acquire, &self.service_release]
        } else {
            self.all().to_vec()
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
    /// Tenant fairness (docs/redis-data-model.md §11): tenant -> in-flight cost (hash), and
    /// tenant -> its last request (zset).
    pub tenants: String,
    pub seen: String,
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
/// expired it is one `ZRANGEBYSCORE` that finds nothing: `make bench` showed no difference in
/// pick cost against reclaiming on one acquire in 16. A random 1 in 16, used before, left
/// healing to chance: after a Redis failover some routes kept a leaked count for 90 picks and
/// more (e2e/suite/tests/redis_cluster.rs).
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

/// How the session fared in an acquire (the script's fifth reply item).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionState {
    /// No session in this request.
    #[default]
    None,
    /// The session stayed on its endpoint.
    Kept,
    /// The session had no endpoint: bound to the one picked.
    New,
    /// The session's endpoint left or was over the guard: bound to the one picked.
    Rebound,
}

/// What a prefix_cache pick adds to an acquire.
#[derive(Debug, Clone)]
pub struct PrefixArgs<'a> {
    /// Full Redis keys of the prompt's prefix chain, shortest first.
    pub chain: &'a [String],
    pub ttl_s: u64,
    pub max_imbalance: u64,
    pub max_imbalance_ratio: f64,
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
    if let Some(eps) = a.endpoints {
        args.extend(eps.iter().map(|e| e.as_bytes()));
    }
    let mut all_keys: Vec<&str> = vec![&keys.load, &keys.leases, &keys.members];
    let script = match prefix {
        None => &scripts.acquire,
        Some(p) => {
            all_keys.extend(p.chain.iter().map(String::as_str));
            &scripts.prefix_acquire
        }
    };
    if let Some(s) = &a.session {
        all_keys.push(s.key);
    }
    // Always sent, so the scripts find them from the end (glr_acquire.lua).
    all_keys.extend([
        keys.wait.as_str(),
        keys.tenants.as_str(),
        keys.seen.as_str(),
    ]);
    call(script, by_sha, &all_keys, &args)
}

/// The lease member a successful acquire wrote: `<request id>|<endpoint>|<cost>`, with
/// `<request id>~<tenant id>` as the first part for a tenant's request (lease.lua).
pub fn lease_member(request_id: &str, endpoint: &str, cost: u64, tenant: Option<&str>) -> String {
    match tenant {
        Some(t) => format!("{request_id}~{t}|{endpoint}|{cost}"),
        None => format!("{request_id}|{endpoint}|{cost}"),
    }
}

pub fn release_call(scripts: &Scripts, by_sha: bool, keys: &Keys, members: &[String]) -> Vec<u8> {
    let args: Vec<&[u8]> = members.iter().map(|m| m.as_bytes()).collect();
    call(
        &scripts.release,
        by_sha,
        &[&keys.load, &keys.leases, &keys.tenants],
        &args,
    )
}

/// What an acquire answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireReply {
    /// `depth`: prefix blocks matched (0 = none); `spilled`: the match was too loaded;
    /// `load_before`: the endpoint's load before this request (None: the session binding
    /// call, which counts nothing).
    Picked {
        endpoint: String,
        depth: u32,
        spilled: bool,
        session: SessionState,
        load_before: Option<u64>,
    },
    /// Every endpoint is at the cap, or the pool at its cap: nothing was incremented.
    Full,
    /// The pool is at its cap: nothing was incremented.
    PoolFull,
    /// The request's tenant is at its share while another tenant is active.
    Tenant,
    /// Redis does not have this caller's endpoint set: resend with the list.
    Sync,
    /// No endpoints at all in Redis.
    Empty,
}

/// A reply that is not what the script returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// The script is not cached in Redis: resend with EVAL.
    NoScript,
    /// Redis answered an error (`-ERR`, `-NOAUTH`, `-MOVED`, ...).
    Redis(String),
    /// Not RESP, or not the shape the script returns.
    Malformed(String),
}

impl std::fmt::Display for ReplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplyError::NoScript => write!(f, "NOSCRIPT"),
            ReplyError::Redis(e) => write!(f, "redis error: {e}"),
            ReplyError::Malformed(e) => write!(f, "malformed reply: {e}"),
        }
    }
}

pub(super) fn decode(raw: &[u8]) -> Result<Value, ReplyError> {
    match resp::decode_exact(raw) {
        Ok(Value::Error(e)) if e.starts_with("NOSCRIPT") => Err(ReplyError::NoScript),
        Ok(Value::Error(e)) => Err(ReplyError::Redis(e)),
        Ok(v) => Ok(v),
        Err(e) => Err(ReplyError::Malformed(e.to_string())),
    }
}

pub fn parse_acquire(raw: &[u8]) -> Result<AcquireReply, ReplyError> {
    let value = decode(raw)?;
    let Value::Array(Some(items)) = &value else {
        return Err(ReplyError::Malformed(format!(
            "expected an array, got {value:?}"
        )));
    };
    let tag = items.first().and_then(Value::as_str);
    match (tag, items.get(1).and_then(Value::as_str)) {
        (Some("OK"), Some(ep)) if !ep.is_empty() => {
            // {OK, endpoint, depth, spilled, session state, load before}; the session binding
            // call (session_bind.lua) stops after the state.
            let int = |i: usize| items.get(i).and_then(Value::as_i64);
            let session = match int(4) {
                Some(0) => SessionState::None,
                Some(1) => SessionState::Kept,
                Some(2) => SessionState::New,
                Some(3) => SessionState::Rebound,
                _ => {
                    return Err(ReplyError::Malformed(format!(
                        "unexpected session state in {items:?}"
                    )))
                }
            };
            Ok(AcquireReply::Picked {
                endpoint: ep.to_string(),
                depth: int(2).unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32,
                spilled: int(3) == Some(1),
                session,
                load_before: int(5).and_then(|l| u64::try_from(l).ok()),
            })
        }
        (Some("FULL"), _) => Ok(AcquireReply::Full),
        (Some("TENANT"), _) => Ok(AcquireReply::Tenant),
        (Some("POOL"), _) => Ok(AcquireReply::PoolFull),
        (Some("SYNC"), _) => Ok(AcquireReply::Sync),
        (Some("EMPTY"), _) => Ok(AcquireReply::Empty),
        _ => Err(ReplyError::Malformed(format!(
            "unexpected acquire reply {items:?}"
        ))),
    }
}

/// Whether a lease was released.
pub fn parse_release(raw: &[u8]) -> Result<bool, ReplyError> {
    match decode(raw)? {
        Value::Integer(n) => Ok(n == 1),
        other => Err(ReplyError::Malformed(format!(
            "unexpected release reply {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let k = Keys::new("ailb", "default/chat", "outbound|8000||llm.static");
        assert_eq!(k.load, "ailb:{default/chat|outbound|8000||llm.static}:load");
        for key in [&k.load, &k.leases, &k.members] {
            assert!(key.starts_with("ailb:{default/chat|outbound|8000||llm.static}:"));
        }
        let odd = Keys::new("ailb", "r{1}", "c}");
        assert_eq!(odd.namespace, "ailb:{r_1_|c_}");
    }

    #[test]
    fn sha_matches_redis_script_sha() {
        // SHA-1 of "return 1", as SCRIPT LOAD reports it.
        assert_eq!(
            Script::new("return 1").sha,
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
    }

    #[test]
    fn acquire_call_layout() {
        let s = Scripts::new();
        let k = Keys::new("p", "r", "c");
        let eps = vec!["a:1".to_string(), "b:2".to_string()];
        let args = AcquireArgs {
            now_ms: 5,
            lease_ttl_ms: 6,
            request_id: "rid",
            cost: 1,
            cap: 0,
            random: 9,
            fingerprint: "fp",
            reclaim: 2,
            endpoints: Some(&eps),
            session: None,
            wait_rank: None,
            pool_cap: 0,
            tenant: None,
        };
        let q = acquire_call(&s, true, &k, &args);
        let Value::Array(Some(items)) = resp::decode_exact(&q).unwrap() else {
            panic!()
        };
        let words: Vec<&str> = items.iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(
            words,
            [
                "EVALSHA",
                s.acquire.sha.as_str(),
                "6",
                "p:{r|c}:load",
                "p:{r|c}:leases",
                "p:{r|c}:members",
                "p:{r|c}:wait",
                "p:{r|c}:tenants",
                "p:{r|c}:tenants_seen",
                "5",
                "6",
                "rid",
                "1",
                "0",
                "9",
                "fp",
                "2",
                "0",
                "0",
                "0",
                "0",
                "",
                "0",
                "1",
                "-1",
                "a:1",
                "b:2"
            ]
        );
    }

    #[test]
    fn session_calls_carry_the_key_last_and_the_ttl_before_the_list() {
        let s = Scripts::new();
        let k = Keys::new("p", "r", "c");
        let key = session_key(&k.namespace, "\u{4f1a}\u{8bdd}".as_bytes());
        assert!(key.starts_with("p:{r|c}:session:") && key.len() == "p:{r|c}:session:".len() + 40);
        assert_ne!(key, session_key(&k.namespace, b""));
        let eps = vec!["a:1".to_string()];
        let session = SessionArgs {
            key: &key,
            ttl_s: 60,
            max_imbalance: 8,
            max_imbalance_ratio: 1.5,
        };
        let args = AcquireArgs {
            now_ms: 5,
            lease_ttl_ms: 6,
            request_id: "rid",
            cost: 1,
            cap: 0,
            random: 9,
            fingerprint: "fp",
            reclaim: 2,
            endpoints: Some(&eps),
            session: Some(session),
            wait_rank: None,
            pool_cap: 0,
            tenant: None,
        };
        let words = |q: Vec<u8>| -> Vec<String> {
            let Value::Array(Some(items)) = resp::decode_exact(&q).unwrap() else {
                panic!()
            };
            items
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        let glr = words(acquire_call(&s, true, &k, &args));
        assert_eq!(glr[2], "7");
        assert_eq!(glr[6], key);
        assert_eq!(
            &glr[18..],
            ["60", "8", "1.5", "0", "", "0", "1", "-1", "a:1"]
        );
        let chain = vec!["p:{r|c}:px:1".to_string()];
        let prefix = PrefixArgs {
            chain: &chain,
            ttl_s: 30,
            max_imbalance: 4,
            max_imbalance_ratio: 2.0,
        };
        let px = words(pick_call(&s, true, &k, &args, Some(&prefix)));
        assert_eq!(px[2], "8");
        assert_eq!(&px[6..8], [chain[0].as_str(), key.as_str()]);
        assert_eq!(
            &px[19..],
            ["30", "4", "2", "60", "0", "", "0", "1", "-1", "a:1"]
        );
    }

    #[test]
    fn parses_session_states() {
        for (state, want) in [
            ("1", SessionState::Kept),
            ("2", SessionState::New),
            ("3", SessionState::Rebound),
        ] {
            let reply =
                resp::encode_command(&[b"OK".as_slice(), b"h:1", b"2", b"0", state.as_bytes()]);
            assert_eq!(
                parse_acquire(&reply),
                Ok(AcquireReply::Picked {
                    endpoint: "h:1".into(),
                    depth: 2,
                    spilled: false,
                    session: want,
                    load_before: None
                })
            );
        }
        let bad = resp::encode_command(&[b"OK".as_slice(), b"h:1", b"0", b"0", b"x"]);
        assert!(matches!(parse_acquire(&bad), Err(ReplyError::Malformed(_))));
    }

    #[test]
    fn parses_replies() {
        assert_eq!(
            parse_acquire(b"*6\r\n$2\r\nOK\r\n$6\r\nh:8000\r\n:0\r\n:0\r\n:0\r\n:7\r\n"),
            Ok(AcquireReply::Picked {
                endpoint: "h:8000".into(),
                depth: 0,
                spilled: false,
                session: SessionState::None,
                load_before: Some(7)
            })
        );
        assert_eq!(
            parse_acquire(b"*6\r\n$2\r\nOK\r\n$6\r\nh:8000\r\n:3\r\n:1\r\n:1\r\n:0\r\n"),
            Ok(AcquireReply::Picked {
                endpoint: "h:8000".into(),
                depth: 3,
                spilled: true,
                session: SessionState::Kept,
                load_before: Some(0)
            })
        );
        assert_eq!(
            parse_acquire(b"*2\r\n$4\r\nFULL\r\n$1\r\n3\r\n"),
            Ok(AcquireReply::Full)
        );
        assert_eq!(
            parse_acquire(b"*1\r\n$4\r\nSYNC\r\n"),
            Ok(AcquireReply::Sync)
        );
        assert_eq!(
            parse_acquire(b"-NOSCRIPT No matching script\r\n"),
            Err(ReplyError::NoScript)
        );
        assert!(matches!(
            parse_acquire(b"-ERR x\r\n"),
            Err(ReplyError::Redis(_))
        ));
        assert!(matches!(
            parse_acquire(b":1\r\n"),
            Err(ReplyError::Malformed(_))
        ));
        assert!(matches!(
            parse_acquire(b"*1\r\n$2\r\nOK\r\n"),
            Err(ReplyError::Malformed(_))
        ));
        assert!(matches!(
            parse_acquire(b"garbage"),
            Err(ReplyError::Malformed(_))
        ));
        assert_eq!(parse_release(b":1\r\n"), Ok(true));
        assert_eq!(parse_release(b":0\r\n"), Ok(false));
    }
}
