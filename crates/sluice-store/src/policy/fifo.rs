//! First in, first out.

use std::collections::VecDeque;

use super::{FixedSet, Key, Policy};

/// First in, first out (hits do not reorder).
#[derive(Debug, Default)]
pub struct Fifo {
    queue: VecDeque<Key>,
    present: FixedSet<Key>,
}

impl Policy for Fifo {
    fn name(&self) -> &str {
        "fifo"
    }
    fn insert(&mut self, key: Key) {
        if self.present.insert(key) {
            self.queue.push_back(key);
        }
    }
    fn hit(&mut self, _key: Key) {}
    fn remove(&mut self, key: Key) {
        if self.present.remove(&key) {
            self.queue.retain(|&k| k != key);
        }
    }
    fn victim(&mut self, evictable: &mut dyn FnMut(Key) -> bool) -> Option<Key> {
        self.queue.iter().copied().find(|&k| evictable(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::k;

    #[test]
    fn fifo_ignores_hits() {
        let mut p = Fifo::default();
        for e in [1, 2, 3] {
            p.insert(k(e));
        }
        p.hit(k(1));
        assert_eq!(p.victim(&mut |_| true), Some(k(1)));
    }
}
