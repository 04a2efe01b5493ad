//! Responses continuations' keys (docs/redis-data-model.md §10 "Responses continuations"): a
//! response's key, and its binding to the pod that produced it, written with the lease's
//! release (release.lua) or alone.

use super::resp;
use super::scripts::{call, Keys, Scripts};
use sha1::{Digest, Sha1};

/// A response's key: `<namespace>:resp:<SHA-1 of its id>`, holding the pod that produced it
/// (docs/redis-data-model.md §10 "Responses continuations"). Read in the session slot of an
/// acquire when a request continues that response; written with the release of the request
/// that produced it.
pub fn response_key(namespace: &str, id: &[u8]) -> String {
    format!("{namespace}:resp:{}", hex::encode(Sha1::digest(id)))
}

/// A key to `SET` to a value with a TTL: a response's pod ([`response_key`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub key: String,
    pub value: String,
    pub ttl_s: u64,
}

/// `scripts::release_call` that also writes `bind` in the same call (release.lua): the response a
/// request produced is recorded with its lease's release, in one round trip.
pub fn release_bind_call(
    scripts: &Scripts,
    by_sha: bool,
    keys: &Keys,
    members: &[String],
    booked: bool,
    bind: Option<&Bind>,
) -> Vec<u8> {
    let ttl = bind.map(|b| b.ttl_s.to_string());
    let mut args: Vec<&[u8]> = members.iter().map(|m| m.as_bytes()).collect();
    // release_call's keys, then the response's.
    let mut all_keys = vec![keys.load.as_str(), &keys.leases, &keys.tenants];
    if booked {
        all_keys.extend([keys.prefill.as_str(), &keys.booked]);
    }
    if let (Some(b), Some(ttl)) = (bind, &ttl) {
        all_keys.push(&b.key);
        args.extend([b.value.as_bytes(), ttl.as_bytes()]);
    }
    call(&scripts.release, by_sha, &all_keys, &args)
}

/// `SET key value EX ttl`: a binding written alone, where no release goes (endpoint_metrics).
pub fn bind_call(bind: &Bind) -> Vec<u8> {
    let ttl = bind.ttl_s.to_string();
    resp::encode_command(&[
        b"SET".as_slice(),
        bind.key.as_bytes(),
        bind.value.as_bytes(),
        b"EX",
        ttl.as_bytes(),
    ])
}
