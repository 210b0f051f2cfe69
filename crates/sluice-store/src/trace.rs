//! Expert request traces, and replaying them offline through any policy or through Belady's
//! optimal (clairvoyant) policy.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::path::Path;

use crate::StoreError;
use crate::policy::{FixedMap, Key, Policy};

/// One expert request: in forward step `step`, layer `layer` asked for `expert` on behalf of
/// `rows` tokens. Requests of the same (step, layer) are pinned together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TraceEvent {
    /// Forward step (a prefill chunk or a decoded token).
    pub step: u64,
    /// Layer.
    pub layer: u32,
    /// Expert id.
    pub expert: u32,
    /// Tokens of the step routed to the expert (1 on a decode step; a prefill chunk asks once
    /// for many). Policies that count popularity ([`Policy::request`]) weigh by it.
    pub rows: u32,
}

impl TraceEvent {
    fn key(&self) -> Key {
        Key {
            layer: self.layer,
            expert: self.expert,
        }
    }
    fn group(&self) -> (u64, u32) {
        (self.step, self.layer)
    }
}

/// Writes a trace as text, one `step layer expert` line per request.
pub fn write_trace(path: &Path, events: &[TraceEvent]) -> Result<(), StoreError> {
    let io = |e| StoreError::Write {
        path: path.to_path_buf(),
        source: e,
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    writeln!(f, "# sluice expert trace: step layer expert rows").map_err(io)?;
    for e in events {
        writeln!(f, "{} {} {} {}", e.step, e.layer, e.expert, e.rows).map_err(io)?;
    }
    f.flush().map_err(io)
}

/// Reads a trace written by [`write_trace`] (a missing fourth column, `rows`, reads as 1).
pub fn read_trace(path: &Path) -> Result<Vec<TraceEvent>, StoreError> {
    let io = |e| StoreError::Io {
        path: path.to_path_buf(),
        offset: 0,
        source: e,
    };
    let f = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
    let mut out = Vec::new();
    for (n, line) in f.lines().enumerate() {
        let line = line.map_err(io)?;
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let v: Vec<u64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let fields = line.split_whitespace().count();
        if !(3..=4).contains(&v.len())
            || v.len() != fields
            || v[1..].iter().any(|&x| x > u32::MAX as u64)
        {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line {}: expected `step layer expert [rows]`", n + 1),
            )));
        }
        out.push(TraceEvent {
            step: v[0],
            layer: v[1] as u32,
            expert: v[2] as u32,
            rows: v.get(3).map_or(1, |&r| r as u32),
        });
    }
    Ok(out)
}

/// Hits and requests of a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimResult {
    /// Requests found resident.
    pub hits: u64,
    /// All requests.
    pub requests: u64,
}

impl SimResult {
    /// Hits ÷ requests.
    pub fn hit_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }
}

/// Replays a trace through `policy` with room for `capacity` experts. The experts of one
/// (step, layer) group are pinned while the group is served.
pub fn simulate(policy: &mut dyn Policy, trace: &[TraceEvent], capacity: usize) -> SimResult {
    let mut resident: BTreeSet<Key> = BTreeSet::new();
    let mut r = SimResult::default();
    let mut i = 0;
    while i < trace.len() {
        let g = trace[i].group();
        let mut pinned: BTreeSet<Key> = BTreeSet::new();
        while i < trace.len() && trace[i].group() == g {
            let k = trace[i].key();
            r.requests += 1;
            policy.request(k, trace[i].rows);
            if resident.contains(&k) {
                r.hits += 1;
                policy.hit(k);
            } else {
                while resident.len() >= capacity.max(1) {
                    match policy.victim(&mut |v| !pinned.contains(&v)) {
                        Some(v) => {
                            resident.remove(&v);
                            policy.remove(v);
                        }
                        None => break,
                    }
                }
                if resident.len() < capacity.max(1) {
                    resident.insert(k);
                    policy.insert(k);
                }
            }
            pinned.insert(k);
            i += 1;
        }
    }
    r
}

/// Belady's optimal replacement on a trace: on a miss with a full cache, evict the resident
/// expert (not pinned by the current group) whose next request is furthest away.
pub fn belady(trace: &[TraceEvent], capacity: usize) -> SimResult {
    let n = trace.len();
    let mut next = vec![u64::MAX; n];
    let mut last: FixedMap<Key, usize> = FixedMap::default();
    for i in (0..n).rev() {
        let k = trace[i].key();
        if let Some(&j) = last.get(&k) {
            next[i] = j as u64;
        }
        last.insert(k, i);
    }
    // Resident keys ordered by their next use.
    let mut by_next: BTreeSet<(u64, Key)> = BTreeSet::new();
    let mut next_of: FixedMap<Key, u64> = FixedMap::default();
    let mut r = SimResult::default();
    let cap = capacity.max(1);
    let mut i = 0;
    while i < n {
        let g = trace[i].group();
        let mut pinned: BTreeSet<Key> = BTreeSet::new();
        while i < n && trace[i].group() == g {
            let k = trace[i].key();
            r.requests += 1;
            if let Some(old) = next_of.remove(&k) {
                r.hits += 1;
                by_next.remove(&(old, k));
            } else if by_next.len() >= cap {
                let victim = by_next
                    .iter()
                    .rev()
                    .find(|(_, v)| !pinned.contains(v))
                    .copied();
                if let Some((nv, v)) = victim {
                    by_next.remove(&(nv, v));
                    next_of.remove(&v);
                }
            }
            if by_next.len() < cap {
                by_next.insert((next[i], k));
                next_of.insert(k, next[i]);
            }
            pinned.insert(k);
            i += 1;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Lru, PolicyChoice};

    /// Issue 18 class 10: a failed trace write said "read at offset 0".
    #[test]
    fn a_failed_write_says_write() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("missing-dir/trace.txt");
        let e = write_trace(&p, &[]).unwrap_err().to_string();
        assert!(e.contains("trace.txt: write: "), "{e}");
        assert!(!e.contains("read"), "{e}");
    }

    fn ev(step: u64, experts: &[u32]) -> Vec<TraceEvent> {
        experts
            .iter()
            .map(|&e| TraceEvent {
                step,
                layer: 0,
                expert: e,
                rows: 1,
            })
            .collect()
    }

    #[test]
    fn belady_textbook() {
        // Classic sequence, one request per step, 3 frames: Belady gives 9 faults of 20.
        let seq = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1];
        let t: Vec<TraceEvent> = seq
            .iter()
            .enumerate()
            .flat_map(|(s, &e)| ev(s as u64, &[e]))
            .collect();
        let b = belady(&t, 3);
        assert_eq!(b.requests, 20);
        assert_eq!(b.requests - b.hits, 9);
        // LRU gives 12 faults on the same sequence.
        let l = simulate(&mut Lru::default(), &t, 3);
        assert_eq!(l.requests - l.hits, 12);
    }

    #[test]
    fn belady_bounds_every_policy() {
        let mut x: u64 = 99;
        let mut t = Vec::new();
        for step in 0..3000u64 {
            for layer in 0..4u32 {
                let mut chosen = BTreeSet::new();
                while chosen.len() < 4 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let u = ((x >> 33) % 1000) as u32;
                    chosen.insert(if u < 600 { u % 8 } else { u % 32 });
                }
                t.extend(chosen.into_iter().map(|e| TraceEvent {
                    step,
                    layer,
                    expert: e,
                    rows: 1 + e % 3,
                }));
            }
        }
        for cap in [8, 16, 48, 96] {
            let b = belady(&t, cap);
            for name in PolicyChoice::ALL {
                let s = simulate(name.make(cap).as_mut(), &t, cap);
                assert_eq!(s.requests, b.requests);
                assert!(
                    s.hits <= b.hits,
                    "{name} at {cap}: {} > Belady {}",
                    s.hits,
                    b.hits
                );
            }
        }
    }

    #[test]
    fn trace_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.txt");
        let t = vec![
            TraceEvent {
                step: 0,
                layer: 1,
                expert: 7,
                rows: 1,
            },
            TraceEvent {
                step: 3,
                layer: 2,
                expert: 0,
                rows: 40,
            },
        ];
        write_trace(&p, &t).unwrap();
        assert_eq!(read_trace(&p).unwrap(), t);
        // Traces written before the rows column read with one row per request.
        std::fs::write(&p, "# old\n0 1 7\n").unwrap();
        assert_eq!(read_trace(&p).unwrap(), t[..1]);
        for bad in [
            "1 2\n",
            "1 2 3 4 5\n",
            "1 2 x\n",
            "1 2 3 x\n",
            "1 2 3 4294967296\n",
        ] {
            std::fs::write(&p, bad).unwrap();
            assert!(read_trace(&p).is_err(), "{bad:?}");
        }
    }
}
