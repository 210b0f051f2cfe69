//! S3-FIFO (Yang et al., SOSP 2023).

use std::collections::VecDeque;

use super::{FixedMap, FixedSet, Key, Policy};

/// S3-FIFO (Yang et al., SOSP 2023): a small FIFO (10% of the capacity) that filters one-hit
/// entries, a main FIFO with 2-bit frequencies and reinsertion, and a ghost FIFO of recently
/// evicted keys that sends returning keys straight to main.
#[derive(Debug)]
pub struct S3Fifo {
    small: VecDeque<Key>,
    main: VecDeque<Key>,
    ghost: VecDeque<Key>,
    ghost_set: FixedSet<Key>,
    freq: FixedMap<Key, u8>,
    in_small: FixedSet<Key>,
    small_target: usize,
    ghost_cap: usize,
}

impl S3Fifo {
    /// Sized for about `capacity` entries.
    pub fn new(capacity: usize) -> S3Fifo {
        let capacity = capacity.max(1);
        S3Fifo {
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghost: VecDeque::new(),
            ghost_set: FixedSet::default(),
            freq: FixedMap::default(),
            in_small: FixedSet::default(),
            small_target: capacity.div_ceil(10),
            ghost_cap: capacity,
        }
    }

    fn remember_ghost(&mut self, key: Key) {
        if self.ghost_set.insert(key) {
            self.ghost.push_back(key);
            while self.ghost.len() > self.ghost_cap {
                if let Some(old) = self.ghost.pop_front() {
                    self.ghost_set.remove(&old);
                }
            }
        }
    }

    /// One pass over main: reinsert used entries (decrementing), return the first unused
    /// evictable one.
    fn victim_main(&mut self, evictable: &mut dyn FnMut(Key) -> bool) -> Option<Key> {
        for _ in 0..4 * self.main.len() {
            let k = self.main.pop_front()?;
            let f = self.freq.get(&k).copied().unwrap_or(0);
            if f > 0 || !evictable(k) {
                if let Some(x) = self.freq.get_mut(&k) {
                    *x = x.saturating_sub(1);
                }
                self.main.push_back(k);
                continue;
            }
            self.main.push_front(k);
            return Some(k);
        }
        None
    }

    fn victim_small(&mut self, evictable: &mut dyn FnMut(Key) -> bool) -> Option<Key> {
        for _ in 0..self.small.len() {
            let k = self.small.pop_front()?;
            let f = self.freq.get(&k).copied().unwrap_or(0);
            if f > 0 {
                // Used while in small: promote to main.
                self.in_small.remove(&k);
                self.freq.insert(k, 0);
                self.main.push_back(k);
                continue;
            }
            self.small.push_back(k);
            if evictable(k) {
                return Some(k);
            }
        }
        None
    }
}

impl Policy for S3Fifo {
    fn name(&self) -> &str {
        "s3fifo"
    }
    fn insert(&mut self, key: Key) {
        if self.freq.contains_key(&key) {
            return;
        }
        self.freq.insert(key, 0);
        if self.ghost_set.remove(&key) {
            self.ghost.retain(|&k| k != key);
            self.main.push_back(key);
        } else {
            self.in_small.insert(key);
            self.small.push_back(key);
        }
    }
    fn hit(&mut self, key: Key) {
        if let Some(f) = self.freq.get_mut(&key) {
            *f = (*f + 1).min(3);
        }
    }
    fn remove(&mut self, key: Key) {
        if self.freq.remove(&key).is_none() {
            return;
        }
        if self.in_small.remove(&key) {
            self.small.retain(|&k| k != key);
            self.remember_ghost(key);
        } else {
            self.main.retain(|&k| k != key);
        }
    }
    fn victim(&mut self, evictable: &mut dyn FnMut(Key) -> bool) -> Option<Key> {
        if self.small.len() >= self.small_target
            && let Some(k) = self.victim_small(evictable)
        {
            return Some(k);
        }
        // A pass over small may promote every key it holds to main and find nothing there:
        // main, which now holds them, is asked once more.
        self.victim_main(evictable)
            .or_else(|| self.victim_small(evictable))
            .or_else(|| self.victim_main(evictable))
    }
}
