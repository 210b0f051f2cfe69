//! LFU with aging, the default policy.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::{FixedMap, Key, Policy};

/// LFU over the request history, with aging (the default policy).
///
/// Every request counts, whether it hits or not, weighed by the tokens it serves (a prefill
/// chunk tells which experts its tokens favour), so an expert that keeps being asked for ranks
/// high even while it is not resident; all counts halve every `32 × capacity` requests, so the
/// ranking follows the recent past (a change of topic) without forgetting within a few tokens.
/// The victim is the evictable resident key with the lowest count and, among equal counts, the
/// one inserted last: a newcomer that is no more popular than what is resident leaves first
/// (scan resistance). That is what the cyclic pattern of MoE decoding needs: when one token's
/// experts outnumber the cache, recency policies evict every layer's experts before they come
/// round again and hit nothing, while a frequency ranking keeps a stable, hot subset.
#[derive(Debug)]
pub struct Lfu {
    counts: FixedMap<Key, u32>,
    /// Resident keys by (count, reverse insertion order).
    order: BTreeSet<(u32, Reverse<u64>, Key)>,
    /// Resident key -> its place in `order`.
    place: FixedMap<Key, (u32, Reverse<u64>)>,
    inserted: u64,
    requests: u64,
    period: u64,
}

impl Lfu {
    /// Sized for about `capacity` entries.
    pub fn new(capacity: usize) -> Lfu {
        Lfu {
            counts: FixedMap::default(),
            order: BTreeSet::new(),
            place: FixedMap::default(),
            inserted: 0,
            requests: 0,
            period: (capacity.max(1) as u64).saturating_mul(32),
        }
    }

    fn age(&mut self) {
        self.counts.retain(|_, c| {
            *c /= 2;
            *c > 0
        });
        let old = std::mem::take(&mut self.order);
        for (_, t, k) in old {
            let c = self.counts.get(&k).copied().unwrap_or(0);
            self.order.insert((c, t, k));
            self.place.insert(k, (c, t));
        }
    }
}

impl Policy for Lfu {
    fn name(&self) -> &str {
        "lfu"
    }
    fn request(&mut self, key: Key, rows: u32) {
        let c = self.counts.entry(key).or_insert(0);
        *c = c.saturating_add(rows.max(1));
        let c = *c;
        if let Some((old, t)) = self.place.get(&key).copied() {
            self.order.remove(&(old, t, key));
            self.order.insert((c, t, key));
            self.place.insert(key, (c, t));
        }
        self.requests += 1;
        if self.requests.is_multiple_of(self.period) {
            self.age();
        }
    }
    fn insert(&mut self, key: Key) {
        if self.place.contains_key(&key) {
            return;
        }
        let c = self.counts.get(&key).copied().unwrap_or(0);
        self.inserted += 1;
        let t = Reverse(self.inserted);
        self.order.insert((c, t, key));
        self.place.insert(key, (c, t));
    }
    fn hit(&mut self, _key: Key) {}
    fn remove(&mut self, key: Key) {
        if let Some((c, t)) = self.place.remove(&key) {
            self.order.remove(&(c, t, key));
        }
    }
    fn victim(&mut self, evictable: &mut dyn FnMut(Key) -> bool) -> Option<Key> {
        self.order
            .iter()
            .map(|&(_, _, k)| k)
            .find(|&k| evictable(k))
    }
    /// Only a victim asked for no more often than the guess.
    fn displaces(&self, guess: Key, victim: Key) -> bool {
        let count = |k| self.counts.get(&k).copied().unwrap_or(0);
        count(guess) >= count(victim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Lru;
    use crate::policy::tests::{k, replay};

    #[test]
    fn lfu_keeps_the_popular_and_evicts_the_newest_of_equals() {
        let mut p = Lfu::new(4);
        for e in [1, 2, 3] {
            p.request(k(e), 1);
            p.insert(k(e));
        }
        // 1 asked for again: the most popular. Among 2 and 3 (one request each), 3 came last.
        p.request(k(1), 1);
        p.hit(k(1));
        assert_eq!(p.victim(&mut |_| true), Some(k(3)));
        assert_eq!(p.victim(&mut |x| x != k(3)), Some(k(2)));
        // A key asked for often while not resident enters with its history.
        for _ in 0..5 {
            p.request(k(9), 1);
        }
        p.insert(k(9));
        assert_eq!(p.victim(&mut |x| x != k(3) && x != k(2)), Some(k(1)));
        p.remove(k(3));
        assert_eq!(p.victim(&mut |_| true), Some(k(2)));
    }

    #[test]
    fn lfu_lets_a_guess_displace_only_keys_asked_for_no_more_often() {
        let mut p = Lfu::new(4);
        for _ in 0..3 {
            p.request(k(1), 1);
        }
        p.request(k(2), 1);
        p.request(k(7), 1);
        assert!(p.displaces(k(7), k(2)));
        assert!(!p.displaces(k(7), k(1)));
        assert!(!p.displaces(k(8), k(2)));
        // Other policies have no ranking to protect.
        assert!(Lru::default().displaces(k(8), k(2)));
    }

    #[test]
    fn lfu_counts_age() {
        // Capacity 1: counts halve every 32 requests.
        let mut p = Lfu::new(1);
        for _ in 0..20 {
            p.request(k(1), 1);
        }
        p.insert(k(1));
        for _ in 0..12 {
            p.request(k(2), 1);
        }
        // 32 requests: 20 -> 10 and 12 -> 6.
        assert_eq!(p.counts.get(&k(1)), Some(&10));
        assert_eq!(p.counts.get(&k(2)), Some(&6));
        assert_eq!(p.place.get(&k(1)).map(|p| p.0), Some(10));
        // Twelve more asks after the halving overtake the resident key.
        for _ in 0..12 {
            p.request(k(2), 1);
        }
        p.insert(k(2));
        assert_eq!(p.victim(&mut |_| true), Some(k(1)));
    }

    #[test]
    fn lfu_holds_a_hot_core_under_a_cyclic_scan() {
        // Each round asks for 0..12 in order, plus a hot pair on every other round; the cache
        // holds 8. LRU and FIFO evict everything before it comes round again; LFU keeps 8.
        let mut stream = Vec::new();
        for round in 0..200u32 {
            stream.extend(0..12);
            if round % 2 == 0 {
                stream.extend([0, 1]);
            }
        }
        let lru = replay(&mut Lru::default(), 8, &stream);
        let lfu = replay(&mut Lfu::new(8), 8, &stream);
        let n = stream.len() as f64;
        // LRU only catches the hot pair when it directly follows the round that ended with it.
        assert!((lru as f64) < 0.1 * n, "lru hits {lru} of {n}");
        // Eight of the twelve (or fourteen) asks of a round hit once the counts settle.
        assert!(lfu as f64 > 0.6 * n, "lfu hits {lfu} of {n}");
    }
}
