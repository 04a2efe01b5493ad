//! [`IdMap`]: the map keyed by ids the host numbers (u32 context ids, call tokens), which every
//! callback of every request looks its stream up in.
//!
//! The values sit dense in a `Vec`; a non-generic open-addressing index finds them, so the
//! probing is compiled once for every map type. Context ids count up, so a Fibonacci multiply
//! spreads them without a hasher; the host picks the ids, not a client, so no chosen-key
//! defence is needed.

/// Slots of a new index; doubled whenever three quarters are taken.
const MIN_SLOTS: usize = 16;

/// A map from ids to values: the values dense in a `Vec`, found through an [`Index`]. The
/// index is not generic, so its probing is compiled once for every map type; what each type
/// adds is a push, a swap-remove and a bounds-checked read.
#[derive(Debug, Clone)]
pub struct IdMap<V> {
    index: Index,
    values: Vec<(u32, V)>,
}

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        IdMap::new()
    }
}

impl<V> IdMap<V> {
    /// An empty map; const, so a `static` may hold one.
    pub const fn new() -> Self {
        IdMap {
            index: Index::new(),
            values: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn get(&self, id: &u32) -> Option<&V> {
        let at = self.index.get(*id)?;
        self.values.get(at).map(|(_, v)| v)
    }

    pub fn get_mut(&mut self, id: &u32) -> Option<&mut V> {
        let at = self.index.get(*id)?;
        self.values.get_mut(at).map(|(_, v)| v)
    }

    pub fn contains_key(&self, id: &u32) -> bool {
        self.index.get(*id).is_some()
    }

    /// Inserts `value` for `id`; the value it replaces, if any.
    pub fn insert(&mut self, id: u32, value: V) -> Option<V> {
        if let Some(at) = self.index.get(id) {
            let (_, old) = self.values.get_mut(at)?;
            return Some(std::mem::replace(old, value));
        }
        // A position always fits: the values would fill memory long before u32::MAX.
        let _ = self.index.insert(id, self.values.len());
        self.values.push((id, value));
        None
    }

    pub fn remove(&mut self, id: &u32) -> Option<V> {
        let at = self.index.remove(*id)?;
        if at >= self.values.len() {
            return None;
        }
        let (_, value) = self.values.swap_remove(at);
        // The last value moved into the gap: its index entry follows it.
        if let Some((moved, _)) = self.values.get(at) {
            let _ = self.index.insert(*moved, at);
        }
        Some(value)
    }

    pub fn clear(&mut self) {
        self.index = Index::default();
        self.values.clear();
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &V)> {
        self.values.iter().map(|(k, v)| (*k, v))
    }
}

/// Id → position: open addressing with linear probing over a power-of-two table, and
/// backward-shift removal (no tombstones). [`IdMap`]'s non-generic core, and on its own a map
/// from ids to numbers below `u32::MAX` (the glue's stream → root): its code is the same for
/// every use.
#[derive(Debug, Clone, Default)]
pub struct Index {
    /// Empty, or a power of two long. `(id, position + 1)`; a position of 0 is an empty slot.
    slots: Vec<(u32, u32)>,
    len: usize,
}

impl Index {
    /// An empty index; const, so a `static` may hold one.
    pub const fn new() -> Self {
        Index {
            slots: Vec::new(),
            len: 0,
        }
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where `id`'s probe starts (Knuth's multiplicative hash; the table is not empty).
    fn home(&self, id: u32) -> usize {
        (id.wrapping_mul(0x9e37_79b9) as usize) & (self.slots.len() - 1)
    }

    /// The slot holding `id`.
    fn find(&self, id: u32) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut at = self.home(id);
        // The table is never full, so the probe meets an empty slot.
        loop {
            match self.slots.get(at)? {
                (_, 0) => return None,
                (k, _) if *k == id => return Some(at),
                _ => at = (at + 1) & mask,
            }
        }
    }

    pub fn get(&self, id: u32) -> Option<usize> {
        let (_, pos) = self.slots.get(self.find(id)?)?;
        Some(*pos as usize - 1)
    }

    /// Points `id` at `pos`, adding it when absent. False, storing nothing, for a `pos` of
    /// `u32::MAX` or more, which a slot cannot hold (a position never comes near it; a
    /// number used as a value might).
    pub fn insert(&mut self, id: u32, pos: usize) -> bool {
        let Some(value) = pos.checked_add(1).and_then(|v| u32::try_from(v).ok()) else {
            return false;
        };
        if let Some(slot) = self.find(id).and_then(|at| self.slots.get_mut(at)) {
            slot.1 = value;
            return true;
        }
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut at = self.home(id);
        while matches!(self.slots.get(at), Some((_, p)) if *p != 0) {
            at = (at + 1) & mask;
        }
        match self.slots.get_mut(at) {
            Some(slot) => {
                *slot = (id, value);
                self.len += 1;
                true
            }
            None => false,
        }
    }

    pub fn remove(&mut self, id: u32) -> Option<usize> {
        let mut hole = self.find(id)?;
        let (_, pos) = std::mem::take(self.slots.get_mut(hole)?);
        self.len -= 1;
        // Backward shift: move each later entry of the run into the hole when its probe
        // started at or before the hole, so every probe still finds its entry.
        let mask = self.slots.len() - 1;
        let mut at = (hole + 1) & mask;
        while let Some(&(k, p)) = self.slots.get(at) {
            if p == 0 {
                break;
            }
            let home = self.home(k);
            if (at.wrapping_sub(home) & mask) >= (at.wrapping_sub(hole) & mask) {
                if let Some(slot) = self.slots.get_mut(hole) {
                    *slot = (k, p);
                }
                if let Some(slot) = self.slots.get_mut(at) {
                    *slot = (0, 0);
                }
                hole = at;
            }
            at = (at + 1) & mask;
        }
        Some(pos as usize - 1)
    }

    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![(0, 0); size]);
        self.len = 0;
        for (k, p) in old {
            if p != 0 {
                self.insert(k, p as usize - 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn behaves_as_a_map_under_random_inserts_and_removes() {
        let mut m: IdMap<u64> = IdMap::default();
        let mut model: HashMap<u32, u64> = HashMap::new();
        let mut rng = crate::hash::SplitMix64(7);
        for step in 0..20_000u64 {
            let r = rng.next_u64();
            // Few distinct keys so removes hit, clustered so probes run long.
            let id = ((r >> 8) % 300) as u32 * if r & 1 == 0 { 1 } else { 16 };
            match r % 3 {
                0 | 1 => assert_eq!(m.insert(id, step), model.insert(id, step)),
                _ => assert_eq!(m.remove(&id), model.remove(&id)),
            }
            assert_eq!(m.len(), model.len());
            if step % 1000 == 0 {
                for (k, v) in &model {
                    assert_eq!(m.get(k), Some(v), "step {step} id {k}");
                }
                assert_eq!(m.iter().count(), model.len());
            }
        }
        for id in 0..5000 {
            assert_eq!(m.get(&id), model.get(&id));
            assert_eq!(m.contains_key(&id), model.contains_key(&id));
        }
    }

    #[test]
    fn sequential_ids_grow_get_mut_and_clear() {
        let mut m: IdMap<u32> = IdMap::default();
        assert!(m.get(&1).is_none() && m.is_empty());
        assert_eq!(m.remove(&1), None);
        for id in 0..1000 {
            m.insert(id, id * 2);
        }
        assert!((0..1000).all(|id| m.get(&id) == Some(&(id * 2))));
        if let Some(v) = m.get_mut(&7) {
            *v = 1;
        }
        assert_eq!(m.remove(&7), Some(1));
        assert_eq!((m.len(), m.get(&7)), (999, None));
        m.clear();
        assert!(m.is_empty() && m.get(&8).is_none());
        m.insert(8, 3);
        assert_eq!(m.get(&8), Some(&3));
    }

    #[test]
    fn an_index_holds_numbers_below_u32_max_and_refuses_the_rest() {
        let mut ix = Index::new();
        assert!(ix.insert(5, u32::MAX as usize - 1));
        assert_eq!(ix.get(5), Some(u32::MAX as usize - 1));
        assert!(!ix.insert(6, u32::MAX as usize), "does not fit a slot");
        assert_eq!(ix.get(6), None, "nothing stored, not a wrong number");
        assert!(!ix.insert(5, u32::MAX as usize));
        assert_eq!(
            ix.get(5),
            Some(u32::MAX as usize - 1),
            "the old value stays"
        );
        assert_eq!(
            (ix.len(), ix.remove(5), ix.remove(5)),
            (1, Some(u32::MAX as usize - 1), None)
        );
        assert!(ix.is_empty());
    }
}
