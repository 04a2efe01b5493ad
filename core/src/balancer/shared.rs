//! Per-proxy state in the host's shared data (one copy per proxy process, seen by every worker
//! VM): compare-and-swap updates and the `addr count` record used for per-proxy counts. Values
//! are small text records.

use crate::host::{Host, HostError, HostErrorKind};
use std::collections::HashMap;

/// Attempts of one compare-and-swap update before giving up.
const CAS_TRIES: usize = 8;

/// The CAS a missing key is created with: one no existing entry has in practice (hosts hand
/// them out counting up from 1), so the create fails when another worker created it first.
const CREATE_CAS: u32 = u32::MAX;

/// Read-modify-write of one key with CAS. `f` gets the current value (None when absent or
/// empty), its own copy to edit in place and return, and returns the new value and a result.
/// Gives up after a few conflicting writers.
///
/// A host checks the CAS only of a key that exists (proxy-wasm-cpp-host `SharedData::set`),
/// so two workers each writing a missing key would both succeed and one change would be lost
/// (seen as a lost in-flight count when the first two requests of a proxy arrived on two
/// workers at once). A missing key is therefore first created empty with [`CREATE_CAS`]; the
/// change itself is always a CAS write over a value read.
pub fn update<T>(
    host: &mut dyn Host,
    key: &str,
    mut f: impl FnMut(Option<Vec<u8>>) -> (Vec<u8>, T),
) -> Result<T, HostError> {
    let mut last = HostError::new("set_shared_data", HostErrorKind::CasMismatch);
    for _ in 0..CAS_TRIES {
        let Some((value, cas)) = host.shared_get(key)? else {
            match host.shared_set(key, &[], CREATE_CAS) {
                Ok(()) => continue,
                Err(e) if e.kind == HostErrorKind::CasMismatch => {
                    last = e;
                    continue;
                }
                Err(e) => return Err(e),
            }
        };
        let (new, out) = f(Some(value).filter(|v| !v.is_empty()));
        match host.shared_set(key, &new, cas) {
            Ok(()) => return Ok(out),
            Err(e) if e.kind == HostErrorKind::CasMismatch => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// `addr count` lines → map. Malformed lines are skipped.
pub fn decode_counts(b: &[u8]) -> HashMap<String, u64> {
    let text = String::from_utf8_lossy(b);
    text.lines()
        .filter_map(|l| {
            let (a, n) = l.rsplit_once(' ')?;
            Some((a.to_string(), n.parse().ok()?))
        })
        .collect()
}

pub fn encode_counts(m: &HashMap<String, u64>) -> Vec<u8> {
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort_unstable();
    let mut out = String::new();
    for k in keys {
        let v = m.get(k).copied().unwrap_or(0);
        out.push_str(&format!("{k} {v}\n"));
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::mock::MockHost;

    fn add(host: &mut MockHost, endpoint: &str) {
        let r = update(host, "k", |cur| {
            let mut m = cur.map(|v| decode_counts(&v)).unwrap_or_default();
            *m.entry(endpoint.to_string()).or_insert(0) += 1;
            (encode_counts(&m), ())
        });
        assert!(r.is_ok(), "{r:?}");
    }

    #[test]
    fn a_key_another_worker_creates_meanwhile_keeps_both_changes() {
        let mut host = MockHost::new();
        // This worker reads the key missing; the other worker creates it right then.
        *host.interleave.borrow_mut() = Some(("k".into(), b"a 1\n".to_vec()));
        add(&mut host, "b");
        let counts = decode_counts(&host.shared.borrow()["k"].0);
        assert_eq!(counts, HashMap::from([("a".into(), 1), ("b".into(), 1)]));
    }

    #[test]
    fn a_missing_key_is_created_then_updated() {
        let mut host = MockHost::new();
        add(&mut host, "a");
        add(&mut host, "a");
        let counts = decode_counts(&host.shared.borrow()["k"].0);
        assert_eq!(counts, HashMap::from([("a".into(), 2)]));
    }
}
