//! The plain-Envoy prefix index (docs/redis-data-model.md §9): chain key → endpoint, kept in the
//! proxy's shared data so every worker VM reads the same one. There is no Redis there, so the
//! bounds Redis gave for free are explicit: at most [`Layout::max_entries`] entries of
//! [`ENTRY_BYTES`] each, spread over [`Layout::shards`] records by key so a request decodes a
//! few small records rather than one large one; entries expire `redisKeyTTL` after their last
//! write or hit, and a full record evicts the entry that expires first (with one TTL that is the
//! least recently used one). Pure: the policy (balancer/policies/prefix_cache/local.rs) reads
//! and writes the records.
//!
//! Record layout: `version u8 = 1 ‖ 0 u8 ‖ count u16 LE ‖ count × (key [8] ‖ endpoint tag u32 LE
//! ‖ expiry ms u64 LE)`, entries unordered. A record that is not exactly this (another version,
//! a wrong length, more than [`SHARD_ENTRIES`]) is corrupt: the writer starts it afresh.

use super::chain::PrefixKey;
use crate::hash;

pub const VERSION: u8 = 1;
pub const HEADER_BYTES: usize = 4;
/// key 8 + endpoint tag 4 + expiry 8.
pub const ENTRY_BYTES: usize = 20;
/// Entries per shard record: a 5 KB record, scanned linearly.
pub const SHARD_ENTRIES: usize = 256;
/// `localIndexMaxEntries` default: 256 records, 1.25 MiB per route config per proxy.
pub const DEFAULT_MAX_ENTRIES: usize = 65_536;
/// `localIndexMaxEntries` range (1 to 4096 records).
pub const MIN_MAX_ENTRIES: usize = SHARD_ENTRIES;
pub const MAX_MAX_ENTRIES: usize = SHARD_ENTRIES * 4096;

/// How one index is cut into records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    shards: u32,
}

impl Layout {
    /// Enough records of [`SHARD_ENTRIES`] for `max_entries` (rounded up; clamped to the range).
    pub fn new(max_entries: usize) -> Layout {
        let wanted = max_entries.clamp(MIN_MAX_ENTRIES, MAX_MAX_ENTRIES);
        let shards = wanted.div_ceil(SHARD_ENTRIES);
        Layout {
            shards: u32::try_from(shards).unwrap_or(1).max(1),
        }
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The record holding `key`. Chain keys are SHA-1 bytes (prefix/chain.rs), so their low
    /// bits spread evenly.
    pub fn shard_of(&self, key: &PrefixKey) -> u32 {
        (u64::from_le_bytes(*key) % u64::from(self.shards)) as u32
    }

    pub fn max_entries(&self) -> usize {
        self.shards as usize * SHARD_ENTRIES
    }

    /// The most bytes all records together can hold.
    pub fn max_bytes(&self) -> usize {
        self.shards as usize * (HEADER_BYTES + SHARD_ENTRIES * ENTRY_BYTES)
    }
}

/// Shared-data key of record `shard` of the index named `base`.
pub fn shard_key(base: &str, shard: u32) -> String {
    format!("{base}.{shard}")
}

/// What an entry stores for an endpoint: 32 bits of FNV-1a of its `ip:port`. Unlike a position
/// in the endpoint list it survives endpoints being added or removed; an entry whose tag names
/// no current endpoint is skipped, as the Redis script skips a key pointing at a departed
/// endpoint.
pub fn endpoint_tag(address: &str) -> u32 {
    let h = hash::fnv1a(hash::FNV_OFFSET, address.as_bytes());
    (h ^ (h >> 32)) as u32
}

/// The tag of `address` at generation `gen` (docs/redis-data-model.md §9 "Engine-verified
/// keys"): generation 0 is [`endpoint_tag`], a later one the tag of `address#gen`, so a bump
/// leaves every entry written at an older generation naming no endpoint.
pub fn generation_tag(address: &str, gen: u64) -> u32 {
    match gen {
        0 => endpoint_tag(address),
        g => endpoint_tag(&format!("{address}#{g}")),
    }
}

/// A record did not decode as written by [`Shard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt;

/// One shard record, always valid: the header and `count` entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    bytes: Vec<u8>,
}

impl Default for Shard {
    fn default() -> Shard {
        Shard {
            bytes: vec![VERSION, 0, 0, 0],
        }
    }
}

impl Shard {
    /// The record in `bytes` (an empty one when absent).
    pub fn decode(bytes: Option<&[u8]>) -> Result<Shard, Corrupt> {
        match bytes {
            None => Ok(Shard::default()),
            Some(b) => check(b).map(|_| Shard { bytes: b.to_vec() }),
        }
    }

    /// The endpoint tag `key` maps to in the record `bytes`, if live at `now_ms`: read in place,
    /// no copy.
    pub fn lookup(bytes: &[u8], key: &PrefixKey, now_ms: u64) -> Result<Option<u32>, Corrupt> {
        check(bytes)?;
        Ok(entries(bytes)
            .find(|e| e.key == *key && e.expires_ms > now_ms)
            .map(|e| e.tag))
    }

    pub fn len(&self) -> usize {
        self.bytes.len().saturating_sub(HEADER_BYTES) / ENTRY_BYTES
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    pub fn get(&self, key: &PrefixKey, now_ms: u64) -> Option<u32> {
        entries(&self.bytes)
            .find(|e| e.key == *key && e.expires_ms > now_ms)
            .map(|e| e.tag)
    }

    /// Extends a live entry's life to `expires_ms` (a hit); false when absent or expired.
    pub fn touch(&mut self, key: &PrefixKey, now_ms: u64, expires_ms: u64) -> bool {
        let Some(slot) = entries(&self.bytes).position(|e| e.key == *key && e.expires_ms > now_ms)
        else {
            return false;
        };
        self.write_expiry(slot, expires_ms);
        true
    }

    /// Maps `key` to `tag` until `expires_ms`: in place when present, appended while there is
    /// room, else over the entry that expires first (an expired one, or the least recently
    /// used).
    pub fn put(&mut self, key: &PrefixKey, tag: u32, expires_ms: u64) {
        // One pass: the key's slot, else the slot that expires first.
        let mut existing = None;
        let mut oldest = (u64::MAX, 0);
        for (slot, e) in slots(&self.bytes).enumerate() {
            if e.get(..8) == Some(key.as_slice()) {
                existing = Some(slot);
                break;
            }
            let expiry = u64::from_le_bytes(field(e, 12));
            if expiry < oldest.0 {
                oldest = (expiry, slot);
            }
        }
        let slot = match existing {
            Some(slot) => slot,
            None if self.len() < SHARD_ENTRIES => {
                self.bytes.extend_from_slice(&[0; ENTRY_BYTES]);
                let count = self.len() as u16;
                if let Some(c) = self.bytes.get_mut(2..4) {
                    c.copy_from_slice(&count.to_le_bytes());
                }
                count as usize - 1
            }
            None => oldest.1,
        };
        let at = HEADER_BYTES + slot * ENTRY_BYTES;
        if let Some(e) = self.bytes.get_mut(at..at + ENTRY_BYTES) {
            e[..8].copy_from_slice(key);
            e[8..12].copy_from_slice(&tag.to_le_bytes());
            e[12..].copy_from_slice(&expires_ms.to_le_bytes());
        }
    }

    fn write_expiry(&mut self, slot: usize, expires_ms: u64) {
        let at = HEADER_BYTES + slot * ENTRY_BYTES + 12;
        if let Some(e) = self.bytes.get_mut(at..at + 8) {
            e.copy_from_slice(&expires_ms.to_le_bytes());
        }
    }
}

struct Entry {
    key: PrefixKey,
    tag: u32,
    expires_ms: u64,
}

/// Header, version, count and length agree.
fn check(bytes: &[u8]) -> Result<(), Corrupt> {
    let [version, reserved, lo, hi] = *bytes.get(..HEADER_BYTES).ok_or(Corrupt)? else {
        return Err(Corrupt);
    };
    let count = usize::from(u16::from_le_bytes([lo, hi]));
    let whole = bytes.len() == HEADER_BYTES + count * ENTRY_BYTES;
    if version != VERSION || reserved != 0 || count > SHARD_ENTRIES || !whole {
        return Err(Corrupt);
    }
    Ok(())
}

/// The raw entries of a checked record.
fn slots(bytes: &[u8]) -> std::slice::ChunksExact<'_, u8> {
    bytes
        .get(HEADER_BYTES..)
        .unwrap_or_default()
        .chunks_exact(ENTRY_BYTES)
}

/// The entries of a checked record.
fn entries(bytes: &[u8]) -> impl Iterator<Item = Entry> + '_ {
    slots(bytes).map(|e| Entry {
        key: field(e, 0),
        tag: u32::from_le_bytes(field(e, 8)),
        expires_ms: u64::from_le_bytes(field(e, 12)),
    })
}

fn field<const N: usize>(e: &[u8], at: usize) -> [u8; N] {
    e.get(at..at + N)
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .unwrap_or([0; N])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::SplitMix64;
    use std::collections::HashMap;

    fn key(n: u64) -> PrefixKey {
        SplitMix64(n).next_u64().to_le_bytes()
    }

    #[test]
    fn put_get_touch_and_expiry() {
        let mut s = Shard::default();
        assert!(s.is_empty());
        s.put(&key(1), 7, 1_000);
        s.put(&key(2), 8, 2_000);
        assert_eq!(s.get(&key(1), 0), Some(7));
        assert_eq!(s.get(&key(1), 1_000), None, "expired at its expiry");
        assert_eq!(Shard::lookup(s.as_bytes(), &key(2), 1_500), Ok(Some(8)));
        // Overwrite in place: still two entries.
        s.put(&key(1), 9, 3_000);
        assert_eq!((s.len(), s.get(&key(1), 2_500)), (2, Some(9)));
        assert!(s.touch(&key(2), 1_500, 5_000));
        assert_eq!(s.get(&key(2), 4_000), Some(8));
        assert!(!s.touch(&key(3), 0, 5_000), "absent");
        assert!(
            !s.touch(&key(2), 6_000, 9_000),
            "expired entries are not revived"
        );
        assert_eq!(s.as_bytes().len(), HEADER_BYTES + 2 * ENTRY_BYTES);
        assert_eq!(Shard::decode(Some(s.as_bytes())), Ok(s.clone()));
    }

    #[test]
    fn a_full_record_evicts_the_entry_that_expires_first() {
        let mut s = Shard::default();
        for n in 0..SHARD_ENTRIES as u64 {
            s.put(&key(n), 1, 10_000 + n);
        }
        // Entry 0 is hit: it now expires last, so entry 1 is the least recently used.
        assert!(s.touch(&key(0), 0, 50_000));
        s.put(&key(9_999), 2, 60_000);
        assert_eq!(s.len(), SHARD_ENTRIES);
        assert_eq!(s.get(&key(1), 0), None, "evicted");
        assert_eq!(s.get(&key(0), 0), Some(1));
        assert_eq!(s.get(&key(9_999), 0), Some(2));
        // An expired entry goes before any live one.
        s.put(&key(5), 1, 1);
        s.put(&key(10_000), 3, 60_000);
        assert_eq!((s.get(&key(5), 0), s.get(&key(6), 0)), (None, Some(1)));
    }

    #[test]
    fn anything_but_a_whole_record_is_corrupt() {
        let mut good = Shard::default();
        good.put(&key(1), 1, 10);
        let b = good.as_bytes().to_vec();
        let mut bad_version = b.clone();
        bad_version[0] = 2;
        let mut bad_reserved = b.clone();
        bad_reserved[1] = 1;
        let mut too_many = Shard::default().into_bytes();
        too_many[2..4].copy_from_slice(&(SHARD_ENTRIES as u16 + 1).to_le_bytes());
        too_many.resize(HEADER_BYTES + (SHARD_ENTRIES + 1) * ENTRY_BYTES, 0);
        for garbage in [
            &b[..b.len() - 1],
            &[b.as_slice(), &[0]].concat()[..],
            &bad_version[..],
            &bad_reserved[..],
            &too_many[..],
            b"10.0.0.1:80 3\n",
            &[],
            &[1, 0, 1],
        ] {
            assert_eq!(Shard::decode(Some(garbage)), Err(Corrupt), "{garbage:?}");
            assert_eq!(Shard::lookup(garbage, &key(1), 0), Err(Corrupt));
        }
        assert_eq!(Shard::decode(None), Ok(Shard::default()));
    }

    #[test]
    fn layout_rounds_up_and_spreads_keys_over_every_shard() {
        assert_eq!(Layout::new(DEFAULT_MAX_ENTRIES).shards(), 256);
        assert_eq!(Layout::new(1_000).max_entries(), 1_024);
        assert_eq!(Layout::new(0).shards(), 1);
        assert_eq!(Layout::new(usize::MAX).shards(), 4096);
        let l = Layout::new(DEFAULT_MAX_ENTRIES);
        assert_eq!(l.max_bytes(), 256 * (4 + 256 * 20));
        let mut per = vec![0u32; l.shards() as usize];
        for n in 0..25_600 {
            per[l.shard_of(&key(n)) as usize] += 1;
        }
        // 100 keys per shard expected; a fair spread keeps every shard within ±50%.
        assert!(per.iter().all(|&c| (50..150).contains(&c)), "{per:?}");
        assert_eq!(shard_key("ailb.px.0123", 17), "ailb.px.0123.17");
        assert_ne!(endpoint_tag("10.0.0.1:80"), endpoint_tag("10.0.0.2:80"));
    }

    #[test]
    fn the_index_never_exceeds_its_bounds_under_100k_random_keys() {
        let layout = Layout::new(4_000);
        let mut records: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut rng = SplitMix64(7);
        let mut now = 0u64;
        let mut recent = Vec::new();
        for n in 0..100_000u64 {
            now += 1;
            let k = rng.next_u64().to_le_bytes();
            let shard = layout.shard_of(&k);
            let mut s = Shard::decode(records.get(&shard).map(Vec::as_slice)).unwrap();
            s.put(&k, (n % 16) as u32, now + 1_000_000);
            records.insert(shard, s.into_bytes());
            recent.push((k, (n % 16) as u32));
            if n % 1_000 == 0 || n > 99_990 {
                let entries: usize = records
                    .values()
                    .map(|r| Shard::decode(Some(r)).unwrap().len())
                    .sum();
                let bytes: usize = records.values().map(Vec::len).sum();
                assert!(entries <= layout.max_entries(), "{entries} entries at {n}");
                assert!(bytes <= layout.max_bytes(), "{bytes} bytes at {n}");
            }
        }
        // Full: exactly the bound, and the most recent keys survived.
        let entries: usize = records
            .values()
            .map(|r| Shard::decode(Some(r)).unwrap().len())
            .sum();
        assert_eq!(entries, layout.max_entries());
        for (k, tag) in recent.iter().rev().take(100) {
            let r = &records[&layout.shard_of(k)];
            assert_eq!(Shard::lookup(r, k, now), Ok(Some(*tag)));
        }
    }
}
