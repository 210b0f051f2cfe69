//! Least recently used.

use std::collections::BTreeMap;

use super::{FixedMap, Key, Policy};

/// Least recently used.
#[derive(Debug, Default)]
pub struct Lru {
    tick: u64,
    by_tick: BTreeMap<u64, Key>,
    tick_of: FixedMap<Key, u64>,
}

impl Lru {
    fn touch(&mut self, key: Key) {
        if let Some(t) = self.tick_of.remove(&key) {
            self.by_tick.remove(&t);
        }
        self.tick += 1;
        self.by_tick.insert(self.tick, key);
        self.tick_of.insert(key, self.tick);
    }
}

impl Policy for Lru {
    fn name(&self) -> &str {
        "lru"
    }
    fn insert(&mut self, key: Key) {
        self.touch(key)
    }
    fn hit(&mut self, key: Key) {
        self.touch(key)
    }
    fn remove(&mut self, key: Key) {
        if let Some(t) = self.tick_of.remove(&key) {
            self.by_tick.remove(&t);
        }
    }
    fn victim(&mut self, evictable: &mut dyn FnMut(Key) -> bool) -> Option<Key> {
        self.by_tick.values().copied().find(|&k| evictable(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::k;

    #[test]
    fn lru_order() {
        let mut p = Lru::default();
        for e in [1, 2, 3] {
            p.insert(k(e));
        }
        p.hit(k(1));
        assert_eq!(p.victim(&mut |_| true), Some(k(2)));
        assert_eq!(p.victim(&mut |x| x != k(2)), Some(k(3)));
    }
}
