//! Eviction policies. A policy only orders expert keys; the store owns the bytes, the pins and
//! the accounting. Every policy here is deterministic: no random hashing state, no clocks.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;

use crate::StoreError;

/// An expert: (layer, expert id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// Layer.
    pub layer: u32,
    /// Expert id.
    pub expert: u32,
}

impl Key {
    /// A key.
    pub fn new(layer: usize, expert: u32) -> Key {
        Key {
            layer: layer as u32,
            expert,
        }
    }
}

/// A hash map with a fixed hasher (SipHash with zero keys), so behaviour never depends on
/// process-random state.
pub(crate) type FixedMap<K, V> =
    HashMap<K, V, BuildHasherDefault<std::collections::hash_map::DefaultHasher>>;
pub(crate) type FixedSet<K> =
    HashSet<K, BuildHasherDefault<std::collections::hash_map::DefaultHasher>>;

/// An eviction policy: it is told what enters, what is used and what leaves the cache, and picks
/// victims among the keys the store says may go.
///
/// Implementations must be deterministic. The store calls every method under its lock.
pub trait Policy: Send {
    /// Short name (`lru`, `s3fifo`, ...).
    fn name(&self) -> &str;
    /// A key became resident.
    fn insert(&mut self, key: Key);
    /// A resident key was used.
    fn hit(&mut self, key: Key);
    /// A key left the cache (evicted, or its read failed).
    fn remove(&mut self, key: Key);
    /// The key to evict next among those for which `evictable` is true; `None` if there is none.
    fn victim(&mut self, evictable: &mut dyn FnMut(Key) -> bool) -> Option<Key>;
    /// A key was asked for (hit or miss) on behalf of `rows` tokens (1 on a decode step; a
    /// prefill chunk asks once for all its tokens routed there), before [`hit`](Policy::hit)
    /// or [`insert`](Policy::insert). Default: nothing.
    fn request(&mut self, _key: Key, _rows: u32) {}
    /// Whether a speculative read of `guess` (prefetch) may evict `victim`, the key
    /// [`victim`](Policy::victim) just picked. Default: yes.
    fn displaces(&self, _guess: Key, _victim: Key) -> bool {
        true
    }
}

/// The policies that ship, by name.
pub const POLICIES: [&str; 5] = ["lfu", "s3fifo", "lru", "fifo", "sieve"];

/// A policy by name (`lfu`, `s3fifo`, `lru`, `fifo`, `sieve`), sized for about `capacity` entries.
pub fn by_name(name: &str, capacity: usize) -> Result<Box<dyn Policy>, StoreError> {
    Ok(match name {
        "lru" => Box::new(Lru::default()),
        "fifo" => Box::new(Fifo::default()),
        "sieve" => Box::new(Sieve::default()),
        "s3fifo" => Box::new(S3Fifo::new(capacity)),
        "lfu" => Box::new(Lfu::new(capacity)),
        other => return Err(StoreError::UnknownPolicy(other.to_owned())),
    })
}

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
        self.victim_main(evictable)
            .or_else(|| self.victim_small(evictable))
    }
}

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

    fn k(e: u32) -> Key {
        Key::new(0, e)
    }

    /// Replays `accesses` through a cache of `cap` entries; returns the hits.
    fn replay(p: &mut dyn Policy, cap: usize, accesses: &[u32]) -> usize {
        let mut resident: std::collections::BTreeSet<u32> = Default::default();
        let mut hits = 0;
        for &a in accesses {
            p.request(k(a), 1);
            if resident.contains(&a) {
                p.hit(k(a));
                hits += 1;
                continue;
            }
            if resident.len() == cap {
                let v = p.victim(&mut |_| true).expect("a victim");
                assert!(
                    resident.remove(&v.expert),
                    "{} evicted non-resident {v:?}",
                    p.name()
                );
                p.remove(v);
            }
            p.insert(k(a));
            resident.insert(a);
        }
        hits
    }

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

    #[test]
    fn fifo_ignores_hits() {
        let mut p = Fifo::default();
        for e in [1, 2, 3] {
            p.insert(k(e));
        }
        p.hit(k(1));
        assert_eq!(p.victim(&mut |_| true), Some(k(1)));
    }

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

    #[test]
    fn pinned_keys_are_never_victims() {
        for name in POLICIES {
            let mut p = by_name(name, 4).unwrap();
            for e in 0..4 {
                p.insert(k(e));
            }
            for _ in 0..3 {
                let v = p.victim(&mut |x| x == k(2));
                assert_eq!(v, Some(k(2)), "{name}");
            }
            assert_eq!(p.victim(&mut |_| false), None, "{name}");
        }
    }

    #[test]
    fn every_policy_survives_a_long_replay_and_skewed_loads_hit() {
        // A skewed stream: expert e with weight 1/(e+1).
        let mut x: u64 = 12345;
        let mut stream = Vec::new();
        for _ in 0..20000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            // Inverse CDF of a truncated 1/(e+1) law over 64 experts.
            let h: f64 = (1..=64).map(|i| 1.0 / i as f64).sum();
            let mut acc = 0.0;
            let mut e = 63;
            for i in 0..64 {
                acc += 1.0 / (i + 1) as f64 / h;
                if u < acc {
                    e = i;
                    break;
                }
            }
            stream.push(e as u32);
        }
        for name in POLICIES {
            let mut p = by_name(name, 16).unwrap();
            let hits = replay(p.as_mut(), 16, &stream);
            let rate = hits as f64 / stream.len() as f64;
            assert!(rate > 0.45, "{name}: hit rate {rate}");
        }
        // S3-FIFO and SIEVE beat FIFO on a skewed stream.
        let fifo = replay(&mut Fifo::default(), 16, &stream);
        assert!(replay(&mut S3Fifo::new(16), 16, &stream) > fifo);
        assert!(replay(&mut Sieve::default(), 16, &stream) > fifo);
    }

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

    #[test]
    fn unknown_policy_is_an_error() {
        assert!(matches!(by_name("arc", 4), Err(StoreError::UnknownPolicy(n)) if n == "arc"));
    }
}
