//! Block-level LRU prefix cache of one fake pod (vLLM automatic prefix caching, simplified).

use std::collections::{BTreeMap, HashMap};

/// Maps a chained block hash to its last-use tick; `by_tick` orders blocks for eviction.
#[derive(Debug, Default)]
pub struct PrefixCache {
    capacity: usize,
    tick: u64,
    last_use: HashMap<u64, u64>,
    by_tick: BTreeMap<u64, u64>,
}

impl PrefixCache {
    /// A cache holding at most `capacity` blocks (0 disables caching).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            ..Self::default()
        }
    }

    /// Number of leading blocks of `hashes` present in the cache (the prefix hit).
    pub fn leading_hits(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.last_use.contains_key(h))
            .count()
    }

    /// Inserts or refreshes all blocks. Walks back to front so the *first* blocks end up most
    /// recently used: under pressure a prompt's tail is evicted before its shared prefix, which is
    /// what vLLM's reverse-order block freeing achieves too.
    pub fn insert(&mut self, hashes: &[u64]) {
        self.insert_within(hashes, None);
    }

    /// [`PrefixCache::insert`], keeping at most `room` blocks when that is below the capacity
    /// (the KV the running requests leave free, kv.rs); at least the inserted prompt's blocks
    /// stay, as a running request's own blocks cannot be evicted.
    pub fn insert_within(&mut self, hashes: &[u64], room: Option<usize>) {
        if self.capacity == 0 {
            return;
        }
        let limit = room
            .map_or(self.capacity, |r| r.max(hashes.len()))
            .min(self.capacity);
        for h in hashes.iter().rev() {
            self.tick += 1;
            if let Some(old) = self.last_use.insert(*h, self.tick) {
                self.by_tick.remove(&old);
            }
            self.by_tick.insert(self.tick, *h);
            while self.last_use.len() > limit {
                let Some((_, victim)) = self.by_tick.pop_first() else {
                    break;
                };
                self.last_use.remove(&victim);
            }
        }
    }

    /// Number of cached blocks.
    pub fn len(&self) -> usize {
        self.last_use.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.last_use.is_empty()
    }

    /// Configured capacity in blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Drops every cached block.
    pub fn clear(&mut self) {
        self.last_use.clear();
        self.by_tick.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_are_leading_and_lru_evicts_tails_first() {
        let mut c = PrefixCache::new(4);
        c.insert(&[1, 2, 3]);
        assert_eq!(c.leading_hits(&[1, 2, 3, 4]), 3);
        assert_eq!(c.leading_hits(&[9, 2, 3]), 0);
        c.insert(&[5, 6]); // over capacity: evicts the least recent, block 3 (a tail)
        assert_eq!(c.len(), 4);
        assert_eq!(c.leading_hits(&[1, 2, 3]), 2);
        assert_eq!(c.leading_hits(&[5, 6]), 2);
        let mut off = PrefixCache::new(0);
        off.insert(&[1]);
        assert!(off.is_empty());
    }
}
