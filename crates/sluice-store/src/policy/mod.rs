//! Eviction policies. A policy only orders expert keys; the store owns the bytes, the pins and
//! the accounting. Every policy here is deterministic: no random hashing state, no clocks.
//!
//! One file per policy; [`PolicyChoice`] names them (parsed once, at the edge, with
//! [`FromStr`]) and builds them. To add one: a file with a type implementing [`Policy`], and a
//! variant of [`PolicyChoice`] with its name, in [`PolicyChoice::ALL`] and
//! [`PolicyChoice::make`].

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::BuildHasherDefault;
use std::str::FromStr;
use std::sync::Arc;

use crate::StoreError;

mod fifo;
mod lfu;
mod lru;
mod s3fifo;
mod sieve;

pub use fifo::Fifo;
pub use lfu::Lfu;
pub use lru::Lru;
pub use s3fifo::S3Fifo;
pub use sieve::Sieve;

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

/// Makes a policy for a cache of about `n` experts.
pub type PolicyFactory = Arc<dyn Fn(usize) -> Box<dyn Policy> + Send + Sync>;

/// Which eviction policy the expert cache uses: one that ships, or one of your own.
///
/// The shipped ones parse from and print as their names (`lfu`, `s3fifo`, `lru`, `fifo`,
/// `sieve`); [`ALL`](PolicyChoice::ALL) lists them.
#[derive(Clone, Default)]
pub enum PolicyChoice {
    /// LFU with aging ([`Lfu`]), the default.
    #[default]
    Lfu,
    /// S3-FIFO ([`S3Fifo`]).
    S3Fifo,
    /// Least recently used ([`Lru`]).
    Lru,
    /// First in, first out ([`Fifo`]).
    Fifo,
    /// SIEVE ([`Sieve`]).
    Sieve,
    /// A policy of your own, made for a cache of about `n` experts.
    Custom(PolicyFactory),
}

impl PolicyChoice {
    /// The policies that ship, the default first.
    pub const ALL: [PolicyChoice; 5] = [
        PolicyChoice::Lfu,
        PolicyChoice::S3Fifo,
        PolicyChoice::Lru,
        PolicyChoice::Fifo,
        PolicyChoice::Sieve,
    ];

    /// The policies that ship, as [`ALL`](PolicyChoice::ALL).
    pub fn all() -> impl Iterator<Item = PolicyChoice> {
        PolicyChoice::ALL.into_iter()
    }

    /// A policy of your own: `make(n)` builds one for a cache of about `n` experts.
    pub fn custom(make: impl Fn(usize) -> Box<dyn Policy> + Send + Sync + 'static) -> PolicyChoice {
        PolicyChoice::Custom(Arc::new(make))
    }

    /// The name it parses from (`custom` for a policy of your own, which parses from nothing).
    pub fn name(&self) -> &'static str {
        match self {
            PolicyChoice::Lfu => "lfu",
            PolicyChoice::S3Fifo => "s3fifo",
            PolicyChoice::Lru => "lru",
            PolicyChoice::Fifo => "fifo",
            PolicyChoice::Sieve => "sieve",
            PolicyChoice::Custom(_) => "custom",
        }
    }

    /// The policy, sized for a cache of about `capacity` experts.
    pub fn make(&self, capacity: usize) -> Box<dyn Policy> {
        match self {
            PolicyChoice::Lfu => Box::new(Lfu::new(capacity)),
            PolicyChoice::S3Fifo => Box::new(S3Fifo::new(capacity)),
            PolicyChoice::Lru => Box::new(Lru::default()),
            PolicyChoice::Fifo => Box::new(Fifo::default()),
            PolicyChoice::Sieve => Box::new(Sieve::default()),
            PolicyChoice::Custom(make) => make(capacity),
        }
    }
}

/// The names of the policies that ship, comma-separated (for messages).
pub(crate) fn known() -> String {
    PolicyChoice::ALL.map(|p| p.name()).join(", ")
}

impl FromStr for PolicyChoice {
    type Err = StoreError;

    /// One of the policies that ship, by name; the error names the bad value and lists them.
    fn from_str(s: &str) -> Result<PolicyChoice, StoreError> {
        PolicyChoice::all()
            .find(|p| p.name() == s)
            .ok_or_else(|| StoreError::UnknownPolicy(s.to_owned()))
    }
}

impl fmt::Display for PolicyChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl fmt::Debug for PolicyChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// Shipped choices are equal by variant; custom ones when they share the same factory.
impl PartialEq for PolicyChoice {
    fn eq(&self, other: &PolicyChoice) -> bool {
        match (self, other) {
            (PolicyChoice::Custom(a), PolicyChoice::Custom(b)) => Arc::ptr_eq(a, b),
            (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
        }
    }
}

impl Eq for PolicyChoice {}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn k(e: u32) -> Key {
        Key::new(0, e)
    }

    /// Replays `accesses` through a cache of `cap` entries; returns the hits.
    pub(crate) fn replay(p: &mut dyn Policy, cap: usize, accesses: &[u32]) -> usize {
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
    fn pinned_keys_are_never_victims() {
        for name in PolicyChoice::ALL {
            let mut p = name.make(4);
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

    /// A victim exists whenever an evictable key is resident, whatever was hit: S3-FIFO
    /// once answered `None` when every key in its small queue had been hit and its main queue
    /// was empty (the pass promoted them all and stopped), and a request waiting for room then
    /// waited for a wake-up that never came.
    #[test]
    fn a_victim_is_found_whenever_one_is_evictable() {
        for name in PolicyChoice::ALL {
            for n in 1..6u32 {
                for hits in 0..4 {
                    let mut p = name.make(64);
                    for e in 0..n {
                        p.request(k(e), 1);
                        p.insert(k(e));
                        for _ in 0..hits {
                            p.request(k(e), 1);
                            p.hit(k(e));
                        }
                    }
                    for target in 0..n {
                        let v = p.victim(&mut |x| x == k(target));
                        assert_eq!(v, Some(k(target)), "{name}, {n} keys hit {hits} times");
                    }
                    assert!(p.victim(&mut |_| true).is_some(), "{name}");
                }
            }
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
        for name in PolicyChoice::ALL {
            let mut p = name.make(16);
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
    fn unknown_policy_is_an_error_naming_it_and_the_known_ones() {
        let e = "arc".parse::<PolicyChoice>().unwrap_err();
        assert!(matches!(&e, StoreError::UnknownPolicy(n) if n == "arc"));
        assert_eq!(
            e.to_string(),
            "unknown cache policy `arc` (known: lfu, s3fifo, lru, fifo, sieve)"
        );
        // Names are exact: no case folding, no trimming, and a custom policy has none.
        for bad in ["LFU", " lfu", "custom", ""] {
            assert!(bad.parse::<PolicyChoice>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_shipped_policy_round_trips_through_its_name() {
        let names: Vec<String> = PolicyChoice::all().map(|p| p.to_string()).collect();
        assert_eq!(names, ["lfu", "s3fifo", "lru", "fifo", "sieve"]);
        for p in PolicyChoice::ALL {
            assert_eq!(p.to_string().parse::<PolicyChoice>().unwrap(), p);
            // What it makes goes by the same name.
            assert_eq!(p.make(8).name(), p.name());
        }
        assert_eq!(PolicyChoice::default(), PolicyChoice::Lfu);
        // Width and alignment are honoured, as for a `str` (tables line up).
        assert_eq!(format!("[{:>6}]", PolicyChoice::Lru), "[   lru]");
    }

    #[test]
    fn a_custom_choice_makes_its_own_policy() {
        let c = PolicyChoice::custom(|n| Box::new(S3Fifo::new(n)));
        assert_eq!(c.to_string(), "custom");
        assert_eq!(c.make(4).name(), "s3fifo");
        assert_eq!(c, c.clone());
        assert_ne!(c, PolicyChoice::custom(|n| Box::new(S3Fifo::new(n))));
        assert_ne!(c, PolicyChoice::S3Fifo);
    }
}
