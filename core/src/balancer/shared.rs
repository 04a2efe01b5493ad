//! Per-proxy state in the host's shared data (one copy per proxy process, seen by every worker
//! VM): compare-and-swap updates and the `addr count` record used for per-proxy counts. Values
//! are small text records.

use crate::host::{Host, HostError, HostErrorKind};
use std::collections::HashMap;

/// Attempts of one compare-and-swap update before giving up.
const CAS_TRIES: usize = 8;

/// Read-modify-write of one key with CAS. `f` gets the current value (None when absent), its
/// own copy to edit in place and return, and returns the new value and a result. Gives up
/// after a few conflicting writers.
pub fn update<T>(
    host: &mut dyn Host,
    key: &str,
    mut f: impl FnMut(Option<Vec<u8>>) -> (Vec<u8>, T),
) -> Result<T, HostError> {
    let mut last = HostError::new("set_shared_data", HostErrorKind::CasMismatch);
    for _ in 0..CAS_TRIES {
        let (value, cas) = match host.shared_get(key)? {
            Some((v, cas)) => (Some(v), cas),
            None => (None, 0),
        };
        let (new, out) = f(value);
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
