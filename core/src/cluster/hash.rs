//! `cluster_hash`: weighted header hashing into 100 slots, slot for slot as Higress computes it
//! (docs/higress-cluster-policies.md §2). Higress builds with standard Go for wasip1, where `int`
//! is 64 bits, so `int(sum32) % 100` is an unsigned modulo of the 32-bit hash.

use std::fmt;

/// Every table has exactly this many slots; weights must sum to it.
pub const SLOT_COUNT: usize = 100;
/// Local reply when the hash header is missing or empty.
pub const MISSING_HEADER_STATUS: u32 = 403;
pub const MISSING_HEADER_BODY: &str = "hash header required";
/// Its body when the config has a `key` block (Higress PR #3921).
pub const MISSING_KEY_BODY: &str = "hash key required";
/// Local reply when writing the cluster header fails (the glue's case; Go sends the same).
pub const HEADER_WRITE_FAILED_STATUS: u32 = 500;
pub const HEADER_WRITE_FAILED_BODY: &str = "internal error";

const FNV32_OFFSET: u32 = 0x811c_9dc5;
const FNV32_PRIME: u32 = 0x0100_0193;

/// FNV-1a 32 (Go `hash/fnv.New32a`) over the raw bytes. Distinct from `crate::hash::fnv1a`,
/// which is the 64-bit variant: Higress hashes cluster keys with the 32-bit one.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(FNV32_OFFSET, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(FNV32_PRIME)
    })
}

/// The slot a header value lands in.
pub fn slot_of(key: &[u8]) -> usize {
    // The remainder is below 100, so the cast cannot truncate.
    (u64::from(fnv1a32(key)) % SLOT_COUNT as u64) as usize
}

/// Why a `clusters` list was refused; `Display` is Go's error text (checked in this order:
/// entry by entry name then weight, then the total).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotError {
    Empty,
    EmptyCluster,
    BadWeight {
        cluster: String,
        weight: i64,
    },
    BadSum(i64),
    /// The weights overflow a 64-bit sum. Go's sum wraps, and if it wraps to exactly 100 Go
    /// accepts the list and then tries to fill 2^63 slots; we refuse it instead.
    SumOverflow,
}

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotError::Empty => f.write_str("clusters is required and must be a non-empty array"),
            SlotError::EmptyCluster => {
                f.write_str("each entry must have a non-empty cluster field")
            }
            SlotError::BadWeight { cluster, weight } => write!(
                f,
                "cluster {} has invalid weight {weight}, must be > 0",
                go_quote(cluster)
            ),
            SlotError::BadSum(total) => {
                write!(f, "sum of cluster weights must be 100, got {total}")
            }
            SlotError::SumOverflow => f.write_str(
                "sum of cluster weights must be 100, got a sum beyond 9223372036854775807",
            ),
        }
    }
}

impl std::error::Error for SlotError {}

/// Where one request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashDecision<'a> {
    /// Write this cluster name into `cluster_header`.
    Cluster(&'a str),
    /// Answer locally: [`MISSING_HEADER_STATUS`] with [`MISSING_HEADER_BODY`].
    Reject { status: u32, body: &'static str },
}

/// The 100 slots: each cluster fills `weight` consecutive slots, in list order, so the first
/// entry owns `[0, w1)`, the next `[w1, w1 + w2)`, and so on. Duplicate names are allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotTable {
    clusters: Vec<String>,
    /// Entry index per slot; at most 100 entries fit (every weight is at least 1).
    slots: Vec<u8>,
}

impl SlotTable {
    /// Validates `(cluster, weight)` entries as Go does and builds the slots. `weight` is the
    /// value after Go's integer coercion (docs/higress-cluster-policies.md §4.2).
    pub fn build<S: AsRef<str>>(entries: &[(S, i64)]) -> Result<SlotTable, SlotError> {
        if entries.is_empty() {
            return Err(SlotError::Empty);
        }
        let mut total: Option<i64> = Some(0);
        for (cluster, weight) in entries {
            let cluster = cluster.as_ref();
            if cluster.is_empty() {
                return Err(SlotError::EmptyCluster);
            }
            if *weight <= 0 {
                return Err(SlotError::BadWeight {
                    cluster: cluster.to_string(),
                    weight: *weight,
                });
            }
            total = total.and_then(|t| t.checked_add(*weight));
        }
        match total {
            None => return Err(SlotError::SumOverflow),
            Some(t) if t != SLOT_COUNT as i64 => return Err(SlotError::BadSum(t)),
            Some(_) => {}
        }
        let mut slots = Vec::with_capacity(SLOT_COUNT);
        for (index, (_, weight)) in entries.iter().enumerate() {
            // The total is 100 and every weight positive, so there are at most 100 entries
            // and each weight is at most 100.
            let index = u8::try_from(index).map_err(|_| SlotError::BadSum(SLOT_COUNT as i64))?;
            let weight = usize::try_from(*weight).map_err(|_| SlotError::SumOverflow)?;
            slots.extend(std::iter::repeat_n(index, weight));
        }
        Ok(SlotTable {
            clusters: entries
                .iter()
                .map(|(c, _)| c.as_ref().to_string())
                .collect(),
            slots,
        })
    }

    /// The configured entries, in list order.
    pub fn clusters(&self) -> &[String] {
        &self.clusters
    }

    /// Entry index owning `slot` (`None` past the last slot).
    pub fn entry_at(&self, slot: usize) -> Option<usize> {
        self.slots.get(slot).map(|&i| usize::from(i))
    }

    /// The cluster for a header value (present and non-empty).
    pub fn pick(&self, key: &[u8]) -> Option<&str> {
        let entry = self.entry_at(slot_of(key))?;
        self.clusters.get(entry).map(String::as_str)
    }

    /// The whole request-headers decision: a missing or empty header is rejected with 403.
    pub fn route(&self, header: Option<&[u8]>) -> HashDecision<'_> {
        const REJECT: HashDecision<'static> = HashDecision::Reject {
            status: MISSING_HEADER_STATUS,
            body: MISSING_HEADER_BODY,
        };
        match header {
            Some(key) if !key.is_empty() => self.pick(key).map_or(REJECT, HashDecision::Cluster),
            _ => REJECT,
        }
    }
}

/// Go's `%q` for the error text: double quotes, backslash escapes for quotes, backslashes and
/// ASCII control characters; other characters as they are.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\x7f' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::SplitMix64;

    const A: &str = "outbound|443||llm-a.internal.dns";
    const B: &str = "outbound|443||llm-b.internal.dns";
    const C: &str = "outbound|80||llm-c.static";

    #[test]
    fn fnv1a32_matches_the_reference_vectors() {
        // FNV-1a 32 reference values (the FNV test suite; Go's hash/fnv golden32a table).
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"ab"), 0x4d25_05ca);
        assert_eq!(fnv1a32(b"abc"), 0x1a47_e90b);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn slots_match_higress_for_known_keys() {
        // key → FNV-1a 32 → slot (hash mod 100 on a 64-bit int).
        for (key, hash, slot) in [
            ("alice", 2_267_157_479u32, 79usize),
            ("bob", 2_261_164_244, 44),
            ("test-0", 373_822_520, 20),
            ("key-1", 1_474_311_238, 38),
            ("consumer-a", 2_223_190_263, 63),
        ] {
            assert_eq!(fnv1a32(key.as_bytes()), hash, "{key}");
            assert_eq!(slot_of(key.as_bytes()), slot, "{key}");
        }
        // Non-UTF-8 bytes are hashed as they are.
        assert_eq!(fnv1a32(&[0xff, 0x00, 0x80]), 0xa36c_d47e);
        assert_eq!(slot_of(&[0xff, 0x00, 0x80]), 94);
    }

    #[test]
    fn hashes_above_2_pow_31_use_the_unsigned_remainder() {
        // A 32-bit signed int would give (-2027809817 % 100) + 100 = 83 for "alice".
        assert!(fnv1a32(b"alice") > i32::MAX as u32);
        assert_eq!(slot_of(b"alice"), 79);
    }

    #[test]
    fn weights_fill_consecutive_slots_in_list_order() {
        let t = SlotTable::build(&[(A, 70), (B, 30)]).unwrap();
        assert_eq!(t.entry_at(0), Some(0));
        assert_eq!(t.entry_at(69), Some(0));
        assert_eq!(t.entry_at(70), Some(1));
        assert_eq!(t.entry_at(99), Some(1));
        assert_eq!(t.entry_at(100), None);
        // alice → 79 → B; bob → 44 → A; test-0 → 20 → A.
        assert_eq!(t.pick(b"alice"), Some(B));
        assert_eq!(t.pick(b"bob"), Some(A));
        assert_eq!(t.pick(b"test-0"), Some(A));

        // Order matters: the same weights listed the other way round move the boundary.
        let t = SlotTable::build(&[(B, 30), (A, 70)]).unwrap();
        assert_eq!(t.pick(b"alice"), Some(A));
        assert_eq!(t.pick(b"test-0"), Some(B));

        let t = SlotTable::build(&[(A, 1), (B, 98), (C, 1)]).unwrap();
        assert_eq!(t.entry_at(0), Some(0));
        assert_eq!(t.entry_at(1), Some(1));
        assert_eq!(t.entry_at(98), Some(1));
        assert_eq!(t.entry_at(99), Some(2));
    }

    #[test]
    fn duplicate_names_are_separate_entries() {
        let t = SlotTable::build(&[(A, 50), (B, 25), (A, 25)]).unwrap();
        assert_eq!(t.clusters().len(), 3);
        assert_eq!(t.entry_at(79), Some(2));
        assert_eq!(t.pick(b"alice"), Some(A));
    }

    #[test]
    fn invalid_lists_are_refused_with_gos_text_in_gos_order() {
        let none: [(&str, i64); 0] = [];
        let err = |e: &[(&str, i64)]| SlotTable::build(e).unwrap_err().to_string();
        assert_eq!(
            SlotTable::build(&none).unwrap_err().to_string(),
            "clusters is required and must be a non-empty array"
        );
        assert_eq!(
            err(&[(A, 60), (B, 30)]),
            "sum of cluster weights must be 100, got 90"
        );
        assert_eq!(
            err(&[(A, 60), (B, 60)]),
            "sum of cluster weights must be 100, got 120"
        );
        assert_eq!(
            err(&[(A, 0), (B, 100)]),
            format!("cluster \"{A}\" has invalid weight 0, must be > 0")
        );
        assert_eq!(
            err(&[(A, 101), (B, -1)]),
            format!("cluster \"{B}\" has invalid weight -1, must be > 0")
        );
        assert_eq!(
            err(&[("", 100)]),
            "each entry must have a non-empty cluster field"
        );
        // Entry by entry: the bad weight of the first entry wins over the empty second name.
        assert_eq!(
            err(&[(A, 0), ("", 100)]),
            format!("cluster \"{A}\" has invalid weight 0, must be > 0")
        );
        assert_eq!(
            err(&[("a\"b\n", -5)]),
            "cluster \"a\\\"b\\n\" has invalid weight -5, must be > 0"
        );
        // Go's wrapping sum would read 100 here; we refuse instead of filling 2^63 slots.
        assert_eq!(
            SlotTable::build(&[(A, i64::MAX), (B, i64::MAX), (C, 102)]).unwrap_err(),
            SlotError::SumOverflow
        );
        // An empty name after an overflowing weight is still reported first, as in Go.
        assert_eq!(
            SlotTable::build(&[(A, i64::MAX), (B, i64::MAX), ("", 1)]).unwrap_err(),
            SlotError::EmptyCluster
        );
    }

    #[test]
    fn missing_or_empty_header_is_rejected_with_403() {
        let t = SlotTable::build(&[(A, 100)]).unwrap();
        let reject = HashDecision::Reject {
            status: 403,
            body: "hash header required",
        };
        assert_eq!(t.route(None), reject);
        assert_eq!(t.route(Some(b"")), reject);
        assert_eq!(t.route(Some(b"alice")), HashDecision::Cluster(A));
        // A single cluster takes every key, including whitespace-only ones.
        assert_eq!(t.route(Some(b" ")), HashDecision::Cluster(A));
    }

    /// Go's `selectCluster` restated from its source, as plainly as possible: expand the
    /// slots into a list of names, hash with `hash/fnv`'s sum32a loop, convert to a 64-bit
    /// int, take `%`, add the length if negative.
    fn go_reference(clusters: &[(&str, i64)], key: &[u8]) -> String {
        let mut slots: Vec<String> = Vec::new();
        for (c, w) in clusters {
            for _ in 0..*w {
                slots.push((*c).to_string());
            }
        }
        let mut hash: u32 = 2_166_136_261;
        for &c in key {
            hash ^= c as u32;
            hash = hash.wrapping_mul(16_777_619);
        }
        let len = slots.len() as i64;
        let mut index = (hash as i64) % len;
        if index < 0 {
            index += len;
        }
        slots[index as usize].clone()
    }

    /// `BENCH cluster_hash_slot_agreement`: 10,000 generated header values (ASCII ids, UUID-like
    /// strings, raw bytes) land on the same cluster as the Go restatement, for several lists.
    #[test]
    fn cluster_hash_slot_agreement_10k() {
        let lists: [&[(&str, i64)]; 4] = [
            &[(A, 70), (B, 30)],
            &[(A, 1), (B, 98), (C, 1)],
            &[(C, 33), (A, 33), (B, 34)],
            &[(A, 100)],
        ];
        let tables: Vec<SlotTable> = lists.iter().map(|l| SlotTable::build(l).unwrap()).collect();
        let mut rng = SplitMix64(0xc1a5_7e12);
        let mut agreed = 0;
        let mut hits = [[0u32; 3]; 4];
        for i in 0..10_000u32 {
            let key: Vec<u8> = match i % 3 {
                0 => format!("consumer-{i}").into_bytes(),
                1 => format!("{:016x}-{:08x}", rng.next_u64(), i).into_bytes(),
                _ => {
                    let len = 1 + (rng.next_u64() % 48) as usize;
                    (0..len).map(|_| rng.next_u64() as u8).collect()
                }
            };
            for (l, (list, table)) in lists.iter().zip(&tables).enumerate() {
                let got = table.route(Some(&key));
                let want = go_reference(list, &key);
                assert_eq!(got, HashDecision::Cluster(want.as_str()), "key {key:?}");
                let entry = table.entry_at(slot_of(&key)).unwrap();
                hits[l][entry] += 1;
            }
            agreed += 1;
        }
        assert_eq!(agreed, 10_000);
        // The slots really spread the keys by weight (70/30 within a few percent).
        assert!((6_700..7_300).contains(&hits[0][0]), "{:?}", hits[0]);
        assert!((9_600..9_950).contains(&hits[1][1]), "{:?}", hits[1]);
        assert!((30..250).contains(&hits[1][0]), "{:?}", hits[1]);
    }
}
