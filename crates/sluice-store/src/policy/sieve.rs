//! SIEVE (Zhang et al., NSDI 2024).

use std::collections::VecDeque;

use super::{FixedMap, Key, Policy};

/// SIEVE (Zhang et al., NSDI 2024): a FIFO queue with a visited bit and a hand that sweeps
/// from the oldest entry, clearing bits, and evicts the first unvisited entry.
#[derive(Debug, Default)]
pub struct Sieve {
    /// Oldest first.
    queue: VecDeque<Key>,
    visited: FixedMap<Key, bool>,
    /// Index into `queue` of the hand (sweeps toward newer entries, wraps to the oldest).
    hand: usize,
}

impl Policy for Sieve {
    fn name(&self) -> &str {
        "sieve"
    }
    fn insert(&mut self, key: Key) {
        if self.visited.insert(key, false).is_none() {
            self.queue.push_back(key);
        }
    }
    fn hit(&mut self, key: Key) {
        if let Some(v) = self.visited.get_mut(&key) {
            *v = true;
        }
    }
    fn remove(&mut self, key: Key) {
        if self.visited.remove(&key).is_some()
            && let Some(i) = self.queue.iter().position(|&k| k == key)
        {
            self.queue.remove(i);
            if i < self.hand {
                self.hand -= 1;
            }
            if self.hand >= self.queue.len() {
                self.hand = 0;
            }
        }
    }
    fn victim(&mut self, evictable: &mut dyn FnMut(Key) -> bool) -> Option<Key> {
        let n = self.queue.len();
        if n == 0 {
            return None;
        }
        // Two sweeps clear every bit; a third finds an evictable entry if any exists.
        for _ in 0..3 * n {
            if self.hand >= self.queue.len() {
                self.hand = 0;
            }
            let k = self.queue[self.hand];
            let v = self
                .visited
                .get_mut(&k)
                .map(|v| std::mem::replace(v, false))
                .unwrap_or(false);
            if !v && evictable(k) {
                return Some(k);
            }
            self.hand += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::k;

    #[test]
    fn sieve_spares_visited() {
        let mut p = Sieve::default();
        for e in [1, 2, 3] {
            p.insert(k(e));
        }
        p.hit(k(1));
        assert_eq!(p.victim(&mut |_| true), Some(k(2)));
        p.remove(k(2));
        p.hit(k(3));
        // 1 was cleared on the first sweep; 3 is visited now.
        assert_eq!(p.victim(&mut |_| true), Some(k(1)));
    }
}
