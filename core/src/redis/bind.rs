//! Responses continuations' keys (docs/redis-data-model.md §10 "Responses continuations"): a
//! response's key, and its binding to the pod that produced it.

use super::resp;
use sha1::{Digest, Sha1};

/// A response's key: `<namespace>:resp:<SHA-1 of its id>`, holding the pod that produced it
/// (docs/redis-data-model.md §10 "Responses continuations"). Read in the session slot of an
/// acquire when a request continues that response; written ([`bind_call`]) as soon as the
/// answer that produced it names itself.
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

/// `SET key value EX ttl`: a response's pod, written fire-and-forget.
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
