//! The upstream host list Higress hands the plugin (`host::pairs`, `upstream`): pairs buffers of
//! hosts with JSON health and the metrics pages of `src/model_metrics/testdata` as their
//! health-check bodies, mutated as bytes; and random host maps encoded.
//!
//! Properties: never panics; every slice the decoders return lies inside the input buffer
//! (nothing is read past it, nothing is invented); a buffer that encodes pairs decodes to them;
//! the borrowing and the plain decoder agree on addresses and health; the health read by the
//! fast scanner is the one `serde_json` reads; a JSON string written by `serde_json` unescapes
//! to the text it was written from.

use crate::gen::{drive, mutate_bytes, Rng};
use ailb_core::host::pairs;
use ailb_core::upstream::{self, Health};
use serde_json::{json, Value};

fn metrics_pages() -> Vec<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/model_metrics/testdata");
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    out.sort();
    out
}

const HEALTH: &[&str] = &["Healthy", "Degraded", "Unhealthy", "Timeout", "", "healthy"];

/// One host's JSON value, in the shapes Higress writes and some it does not.
fn host_json(rng: &mut Rng, pages: &[String]) -> String {
    let metrics = if rng.chance(1, 3) {
        String::new()
    } else {
        rng.pick(pages).clone()
    };
    let health = rng.pick(HEALTH);
    match rng.below(4) {
        0 => json!({"health_status": health, "metrics": metrics}).to_string(),
        1 => json!({"metrics": metrics, "weight": 1, "health_status": health}).to_string(),
        2 => format!(
            "{{ \"health_status\" : \"{health}\" ,\n \"metrics\" : {} }}",
            Value::String(metrics)
        ),
        _ => json!({"health_status": health}).to_string(),
    }
}

fn address(rng: &mut Rng) -> String {
    match rng.below(3) {
        0 => format!("10.0.{}.{}:8000", rng.below(256), rng.below(256)),
        1 => format!("[fd00::{:x}]:80", rng.below(65536)),
        _ => (0..rng.len(12))
            .map(|_| *rng.pick(&['a', ':', '1', '\0', 'é']))
            .collect(),
    }
}

fn hosts(rng: &mut Rng, pages: &[String]) -> Vec<(String, String)> {
    (0..rng.len(6))
        .map(|_| (address(rng), host_json(rng, pages)))
        .collect()
}

fn encode(list: &[(String, String)]) -> Vec<u8> {
    let refs: Vec<(&str, &str)> = list.iter().map(|(a, j)| (a.as_str(), j.as_str())).collect();
    pairs::encode(&refs)
}

const DICT: &[&[u8]] = &[
    b"\"health_status\"",
    b"\"metrics\"",
    b"\"Healthy\"",
    b"\\\"",
    b"\\u0000",
    b"\x00",
    b"\xff\xff\xff\xff",
    b"{",
    b"}",
    b",",
];

fn generate(rng: &mut Rng, pages: &[String], seeds: &[Vec<u8>]) -> Vec<u8> {
    let list = hosts(rng, pages);
    let buf = encode(&list);
    if rng.chance(1, 3) {
        buf
    } else {
        mutate_bytes(rng, &buf, seeds, DICT, 1 << 20)
    }
}

/// `inner` lies within `outer` (by address): a borrowed slice of the input.
fn within(outer: &[u8], inner: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    inner.is_empty() || (i >= o && i + inner.len() <= o + outer.len())
}

fn serde_health(json: &[u8]) -> Option<Health> {
    let v: Value = serde_json::from_slice(json).ok()?;
    let obj = v.as_object()?;
    // Only flat objects of scalars are the host's format; the fast scanner stops at nesting.
    if obj.values().any(|x| x.is_object() || x.is_array()) {
        return None;
    }
    Some(match obj.get("health_status").and_then(Value::as_str) {
        Some("Healthy") => Health::Healthy,
        Some("Degraded") => Health::Degraded,
        Some("Unhealthy") => Health::Unhealthy,
        _ => Health::Unknown,
    })
}

fn check(buf: &[u8]) {
    let raw = pairs::decode(buf);
    let plain = upstream::decode_hosts(buf);
    let borrowed = upstream::decode_hosts_with_metrics(buf);
    assert_eq!(raw.is_ok(), plain.is_ok());
    assert_eq!(raw.is_ok(), borrowed.is_ok());
    let (Ok(raw), Ok(plain), Ok(borrowed)) = (raw, plain, borrowed) else {
        return;
    };
    for (k, v) in &raw {
        assert!(within(buf, k) && within(buf, v));
    }
    // Encoding what decoded gives the buffer back (bytes after the last pair are ignored; an
    // empty buffer is an empty list) when keys and values are text.
    let text: Option<Vec<(&str, &str)>> = raw
        .iter()
        .map(|(k, v)| Some((std::str::from_utf8(k).ok()?, std::str::from_utf8(v).ok()?)))
        .collect();
    if let Some(text) = text.filter(|_| !buf.is_empty()) {
        assert!(buf.starts_with(&pairs::encode(&text)));
    }
    // Entries with an empty or non-UTF-8 address are dropped, the rest kept in order.
    let named: Vec<&[u8]> = raw
        .iter()
        .filter(|(k, _)| !k.is_empty() && std::str::from_utf8(k).is_ok())
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(plain.len(), named.len());
    assert_eq!(plain.len(), borrowed.len());
    for ((p, b), info) in plain.iter().zip(&borrowed).zip(named) {
        assert_eq!((p.address.as_str(), p.health), (b.address, b.health));
        assert!(within(buf, b.address.as_bytes()) && within(buf, b.raw_metrics));
        assert!(b.raw_metrics.is_empty() || within(info, b.raw_metrics));
        if let Some(h) = serde_health(info) {
            // Duplicate keys: serde keeps the last, the scanner stops at the first; both are
            // fine for the host's own output, which has none.
            let dup = info
                .windows(15)
                .filter(|w| *w == b"\"health_status\"")
                .count()
                > 1;
            if !dup {
                assert_eq!(b.health, h, "{}", String::from_utf8_lossy(info));
            }
        }
        let _ = upstream::unescape_json_string(b.raw_metrics);
        let _ = upstream::quick_hash(b.raw_metrics);
    }
    let _ = upstream::fingerprint(&upstream::healthy_addresses(&plain));
}

/// A JSON string written by serde_json unescapes to its text.
fn check_unescape(rng: &mut Rng) {
    let text: String = (0..rng.len(64))
        .map(|_| {
            *rng.pick(&[
                'a', '"', '\\', '\n', '\r', '\t', '\u{0}', '\u{1f}', '\u{7f}', 'é', '✓', '😀', '/',
                ' ',
            ])
        })
        .collect();
    let quoted = Value::String(text.clone()).to_string();
    let raw = &quoted.as_bytes()[1..quoted.len() - 1];
    assert_eq!(
        upstream::unescape_json_string(raw).as_deref(),
        Some(text.as_str())
    );
}

#[test]
fn fuzz_upstream_host_list() {
    let pages = metrics_pages();
    let mut r = Rng::new(7);
    let seeds: Vec<Vec<u8>> = (0..16).map(|_| encode(&hosts(&mut r, &pages))).collect();
    for s in &seeds {
        check(s);
    }
    drive(
        "hosts",
        200,
        |rng| generate(rng, &pages, &seeds),
        |b| {
            check(b);
            check_unescape(&mut Rng::new(b.len() as u64 ^ 0x55));
        },
    );
}
