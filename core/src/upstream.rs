//! The upstream host list Higress hands the plugin (`proxy_get_upstream_hosts`): address →
//! JSON `{"health_status": "...", "metrics": "..."}`.

use crate::hash;
use crate::host::pairs;

/// Bytes of a host's health-check body Higress keeps in `metrics` (Envoy's
/// `StoreMetricsResponseBodyLimit`, docs/higress-abi.md §7): a text this long was cut there.
pub const HOST_METRICS_LIMIT: usize = 64 * 1024;

/// Envoy's coarse health of a host, as the Higress host reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Degraded,
    Unhealthy,
    /// Missing or unrecognised status: not selectable, like Higress's Go plugin.
    Unknown,
}

/// One upstream host of the route's cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub address: String,
    pub health: Health,
}

/// Decodes the pairs buffer into endpoints. Entries with an empty or non-UTF-8 address are
/// dropped; a malformed buffer is an error (the caller falls back to the cluster's own LB).
pub fn decode_hosts(buf: &[u8]) -> Result<Vec<Endpoint>, pairs::PairsError> {
    let raw = pairs::decode(buf)?;
    let mut out = Vec::with_capacity(raw.len());
    for (address, info) in named(raw) {
        out.push(Endpoint {
            address: address.to_string(),
            health: health_of(info),
        });
    }
    Ok(out)
}

/// The entries whose address is non-empty UTF-8 (the others are dropped, never an error).
fn named<'a>(raw: Vec<(&'a [u8], &'a [u8])>) -> impl Iterator<Item = (&'a str, &'a [u8])> {
    raw.into_iter().filter_map(|(addr, info)| {
        let address = std::str::from_utf8(addr).ok()?;
        (!address.is_empty()).then_some((address, info))
    })
}

/// The addresses that may be chosen: only `Healthy` hosts, as Higress's plugin does. Sorted,
/// so every gateway computes the same membership fingerprint for the same set.
pub fn healthy_addresses(endpoints: &[Endpoint]) -> Vec<String> {
    let mut v: Vec<String> = endpoints
        .iter()
        .filter(|e| e.health == Health::Healthy)
        .map(|e| e.address.clone())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// FNV-1a over the sorted addresses: identical on every gateway for the same healthy set.
pub fn fingerprint(sorted: &[String]) -> String {
    let h = sorted.iter().fold(hash::FNV_OFFSET, |h, a| {
        hash::fnv1a(hash::fnv1a(h, a.as_bytes()), b"\n")
    });
    format!("{h:016x}{:04x}", sorted.len() & 0xffff)
}

/// One host with its raw (still JSON-escaped) `metrics` string, for endpoint_metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMetrics<'a> {
    pub address: &'a str,
    pub health: Health,
    /// The `metrics` value as it sits in the JSON (escapes intact); empty when absent.
    pub raw_metrics: &'a [u8],
}

/// Like [`decode_hosts`], borrowing, with each host's raw metrics text. Nothing is unescaped
/// or parsed here: the caller fingerprints the raw bytes and parses only when they change.
pub fn decode_hosts_with_metrics(buf: &[u8]) -> Result<Vec<HostMetrics<'_>>, pairs::PairsError> {
    let raw = pairs::decode(buf)?;
    let mut out = Vec::with_capacity(raw.len());
    for (address, info) in named(raw) {
        let (health, raw_metrics) = health_and_metrics(info);
        out.push(HostMetrics {
            address,
            health,
            raw_metrics,
        });
    }
    Ok(out)
}

/// The text of a raw JSON string body (no quotes): escapes resolved. `None` if malformed.
pub fn unescape_json_string(raw: &[u8]) -> Option<String> {
    if !raw.contains(&b'\\') {
        return String::from_utf8(raw.to_vec()).ok();
    }
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    serde_json::from_slice(&quoted).ok()
}

/// A fast, non-cryptographic fingerprint of a byte string (8 bytes per step): detects that a
/// host's metrics text changed without parsing it.
pub fn quick_hash(b: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = b.len() as u64;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    for &x in chunks.remainder() {
        h = (h.rotate_left(5) ^ u64::from(x)).wrapping_mul(K);
    }
    h
}

/// Health and the raw `metrics` string, in one pass over the top-level keys.
fn health_and_metrics(json: &[u8]) -> (Health, &[u8]) {
    let mut s = Scanner { b: json, i: 0 };
    let mut health = Health::Unknown;
    let mut metrics: &[u8] = &[];
    if !s.eat(b'{') {
        return (health, metrics);
    }
    loop {
        let Some(key) = s.string() else {
            return (health, metrics);
        };
        if !s.eat(b':') {
            return (health, metrics);
        }
        if key == b"health_status" {
            health = match s.string() {
                Some(b"Healthy") => Health::Healthy,
                Some(b"Degraded") => Health::Degraded,
                Some(b"Unhealthy") => Health::Unhealthy,
                _ => return (Health::Unknown, metrics),
            };
        } else if key == b"metrics" {
            match s.string() {
                Some(m) => metrics = m,
                None => return (health, metrics),
            }
        } else if !s.skip_value() {
            return (health, metrics);
        }
        if !s.eat(b',') {
            return (health, metrics);
        }
    }
}

/// Reads `health_status` from the host's JSON without materialising the rest: the `metrics`
/// value can be 64 KiB per host, and this runs for every host on every request. Top-level
/// values other than the status are skipped; the scan stops at the status.
fn health_of(json: &[u8]) -> Health {
    let mut s = Scanner { b: json, i: 0 };
    if !s.eat(b'{') {
        return Health::Unknown;
    }
    loop {
        let Some(key) = s.string() else {
            return Health::Unknown;
        };
        if !s.eat(b':') {
            return Health::Unknown;
        }
        if key == b"health_status" {
            return match s.string() {
                Some(b"Healthy") => Health::Healthy,
                Some(b"Degraded") => Health::Degraded,
                Some(b"Unhealthy") => Health::Unhealthy,
                _ => Health::Unknown,
            };
        }
        if !s.skip_value() || !s.eat(b',') {
            return Health::Unknown;
        }
    }
}

/// A minimal JSON scanner for one flat object of strings/scalars.
struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn ws(&mut self) {
        while matches!(self.b.get(self.i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// A string's raw bytes (escapes left as they are: the values we compare have none).
    fn string(&mut self) -> Option<&'a [u8]> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.i;
        loop {
            match self.b.get(self.i)? {
                b'\\' => self.i += 2,
                b'"' => {
                    let s = self.b.get(start..self.i)?;
                    self.i += 1;
                    return Some(s);
                }
                _ => self.i += 1,
            }
        }
    }

    fn skip_value(&mut self) -> bool {
        self.ws();
        match self.b.get(self.i) {
            Some(b'"') => self.string().is_some(),
            Some(b'{' | b'[') => false, // nested values are not part of the host's format
            Some(_) => {
                while !matches!(self.b.get(self.i), None | Some(b',' | b'}')) {
                    self.i += 1;
                }
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &[(&str, &str)]) -> Vec<u8> {
        pairs::encode(list)
    }

    #[test]
    fn decodes_health_in_any_key_order() {
        let buf = hosts(&[
            ("10.0.0.1:80", r#"{"health_status":"Healthy","metrics":""}"#),
            (
                "10.0.0.2:80",
                r#"{"metrics":"a \"quoted\" \\ text","health_status":"Degraded"}"#,
            ),
            ("10.0.0.3:80", r#"{ "health_status" : "Unhealthy" }"#),
            ("10.0.0.4:80", r#"{"weight":3,"health_status":"Healthy"}"#),
            ("10.0.0.5:80", r#"{"health_status":"Bogus"}"#),
            ("10.0.0.6:80", "not json"),
            ("", r#"{"health_status":"Healthy"}"#),
        ]);
        let eps = decode_hosts(&buf).unwrap();
        let got: Vec<(&str, Health)> = eps.iter().map(|e| (e.address.as_str(), e.health)).collect();
        assert_eq!(
            got,
            vec![
                ("10.0.0.1:80", Health::Healthy),
                ("10.0.0.2:80", Health::Degraded),
                ("10.0.0.3:80", Health::Unhealthy),
                ("10.0.0.4:80", Health::Healthy),
                ("10.0.0.5:80", Health::Unknown),
                ("10.0.0.6:80", Health::Unknown),
            ]
        );
        assert_eq!(healthy_addresses(&eps), vec!["10.0.0.1:80", "10.0.0.4:80"]);
    }

    #[test]
    fn fingerprint_depends_on_the_set_only() {
        let a = vec!["a:1".to_string(), "b:2".to_string()];
        let b = vec!["a:1".to_string()];
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        // Joining is unambiguous: ["ab"] differs from ["a","b"].
        assert_ne!(
            fingerprint(&["ab".into()]),
            fingerprint(&["a".into(), "b".into()])
        );
    }

    #[test]
    fn metrics_field_is_borrowed_raw_and_unescaped_on_demand() {
        let buf = hosts(&[
            (
                "10.0.0.1:80",
                r#"{"health_status":"Healthy","metrics":"a 1\nb{x=\"y\"} 2\n"}"#,
            ),
            (
                "10.0.0.2:80",
                r#"{"metrics":"plain 3","health_status":"Degraded"}"#,
            ),
            ("10.0.0.3:80", r#"{"health_status":"Healthy"}"#),
            ("10.0.0.4:80", r#"{"health_status":"Healthy","metrics":"#),
        ]);
        let h = decode_hosts_with_metrics(&buf).unwrap();
        assert_eq!(h[0].health, Health::Healthy);
        assert_eq!(
            unescape_json_string(h[0].raw_metrics).unwrap(),
            "a 1\nb{x=\"y\"} 2\n"
        );
        assert_eq!(h[1].health, Health::Degraded);
        assert_eq!(h[1].raw_metrics, b"plain 3");
        assert_eq!(h[2].raw_metrics, b"");
        assert_eq!(h[3].health, Health::Healthy);
        assert_eq!(h[3].raw_metrics, b"");
        assert_eq!(unescape_json_string(b"bad \\x"), None);
        assert_ne!(quick_hash(b"abcdefgh1"), quick_hash(b"abcdefgh2"));
        assert_ne!(quick_hash(b""), quick_hash(b"\0"));
    }

    #[test]
    fn garbage_health_json_never_panics() {
        for s in [
            "",
            "{",
            "{\"",
            "{\"health_status\"",
            "{\"a\":\"\\",
            "{\"a\":1",
            "{\"a\":[1]}",
            "{,}",
        ] {
            assert_eq!(health_of(s.as_bytes()), Health::Unknown, "{s}");
        }
    }
}
