//! The prefix cache: the state of recent prompts (KV cache, recurrent state, the next
//! position's logits), kept inside an explicit share of the memory budget, so that a session
//! or request whose prompt starts like an earlier one (a system prompt, few-shot examples, a
//! document asked several questions, the earlier turns of a chat) computes only the rest.
//!
//! Entries are whole prompts, and finished generations (the prompt and the reply, without next
//! logits, kept only where there is room), so that a conversation's next turn sent whole starts
//! from its reply. A lookup takes the entry sharing the longest prefix with the new
//! prompt and a copy of its state cut back to that prefix; a KV cache can be cut anywhere, a
//! recurrent state (KDA, gated DeltaNet) only at its end or where its latest pass began, so for
//! those models an entry serves prompts that extend it. A prompt equal to an entry takes its
//! logits too and runs no pass at all. Output is the same bits as a cold run: the positions a
//! copy holds are those the prompt would have computed (chunking and spans change no bit).
//!
//! Under a budget the memory plan gives the cache a share of the pool
//! ([`sluice_model::MemoryPlan::prefix_cache`]) on top of what the KV caches and the expert
//! floor need, so entries never stand in a sequence's way; the entries' bytes are lent by the
//! expert cache, like KV pages, which uses the share while they do not. The least recently
//! used entries go first.

use std::sync::Mutex;

use serde::Serialize;
use sluice_model::{Model, State};
use sluice_store::Lease;

/// Bytes an entry is counted for beyond its state, tokens and logits (its bookkeeping).
const ENTRY_OVERHEAD: u64 = 256;

/// The prefix cache's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PrefixCacheStats {
    /// The most it may hold (0: off).
    pub limit_bytes: u64,
    /// Bytes held now.
    pub bytes: u64,
    /// Entries held now.
    pub entries: usize,
    /// Prompts looked up.
    pub lookups: u64,
    /// Of those, started from an entry.
    pub hits: u64,
    /// Prompt tokens whose state came from an entry (not computed).
    pub cached_tokens: u64,
    /// Entries stored.
    pub stored: u64,
    /// Entries dropped to make room (or replaced by one that covers them).
    pub evicted: u64,
}

/// A state taken from the cache: the positions it holds (a prefix of the prompt), and when it
/// holds the whole prompt, the logits of the position after it.
pub(crate) struct Hit {
    pub(crate) state: State,
    pub(crate) tokens: usize,
    pub(crate) logits: Option<Vec<f32>>,
}

struct Entry {
    tokens: Vec<u32>,
    state: State,
    /// The logits after the last token (a prompt's; a finished generation's state has none).
    logits: Option<Vec<f32>>,
    bytes: u64,
    used: u64,
}

#[derive(Default)]
struct Entries {
    list: Vec<Entry>,
    bytes: u64,
    tick: u64,
    /// Under a budget: the bytes lent by the expert cache for the entries.
    lease: Option<Lease>,
    stats: PrefixCacheStats,
}

/// The cache (see the module's text).
pub(crate) struct PrefixCache {
    limit: u64,
    budgeted: bool,
    inner: Mutex<Entries>,
}

/// Tokens `a` and `b` share from the start.
pub(crate) fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    /// A cache of at most `limit` bytes (0: off); `budgeted`: its bytes are lent by the expert
    /// cache.
    pub(crate) fn new(limit: u64, budgeted: bool) -> PrefixCache {
        PrefixCache {
            limit,
            budgeted,
            inner: Mutex::new(Entries {
                stats: PrefixCacheStats {
                    limit_bytes: limit,
                    ..Default::default()
                },
                ..Default::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Whether the cache may hold anything (`--prefix-cache` is not 0).
    pub(crate) fn enabled(&self) -> bool {
        self.limit > 0
    }

    /// The figures now.
    pub(crate) fn stats(&self) -> PrefixCacheStats {
        let g = self.lock();
        PrefixCacheStats {
            bytes: g.bytes,
            entries: g.list.len(),
            ..g.stats.clone()
        }
    }

    /// The state of the longest prefix of `prompt` an entry holds, when that is more than the
    /// `have` tokens the caller's state holds already: a copy cut back to it (never the whole
    /// prompt unless the entry is exactly the prompt, whose logits then come with it).
    pub(crate) fn lookup(&self, prompt: &[u32], have: usize) -> Option<Hit> {
        if self.limit == 0 || prompt.is_empty() {
            return None;
        }
        let mut g = self.lock();
        g.stats.lookups += 1;
        // The best entry: the most positions usable, the whole prompt (no pass) first.
        let mut best: Option<(usize, bool, usize)> = None;
        for (i, e) in g.list.iter().enumerate() {
            let c = common(&e.tokens, prompt);
            let exact = c == prompt.len() && e.tokens.len() == prompt.len() && e.logits.is_some();
            // Otherwise one token at least is left to compute the next logits from.
            let n = if exact { c } else { c.min(prompt.len() - 1) };
            if n <= have || !(exact || e.state.can_truncate(n)) {
                continue;
            }
            if best.is_none_or(|(bn, bx, _)| (n, exact) > (bn, bx)) {
                best = Some((n, exact, i));
            }
        }
        let (n, exact, i) = best?;
        g.tick += 1;
        let tick = g.tick;
        let e = &mut g.list[i];
        e.used = tick;
        let state = e.state.prefix(n)?;
        let logits = if exact { e.logits.clone() } else { None };
        g.stats.hits += 1;
        g.stats.cached_tokens += (n - have) as u64;
        Some(Hit {
            state,
            tokens: n,
            logits,
        })
    }

    /// Keeps a copy of `state`, which holds `tokens` and gives `logits` next (a prompt's state;
    /// `None` for a finished generation's, whose next logits were spent), unless an entry
    /// covers it already; entries it covers go, and the least recently used make room. Under a
    /// budget the bytes are lent by the expert cache first; when it cannot give them up the
    /// state is not kept.
    pub(crate) fn store(
        &self,
        model: &Model,
        tokens: &[u32],
        state: &State,
        logits: Option<&[f32]>,
    ) {
        if self.limit == 0
            || tokens.is_empty()
            || state.pos() != tokens.len()
            || state.routes.is_some()
            || state.debug.is_some()
        {
            return;
        }
        let floats = tokens.len() + logits.map_or(0, <[f32]>::len);
        let bytes = state.cache_bytes() as u64 + 4 * floats as u64 + ENTRY_OVERHEAD;
        if bytes > self.limit {
            return;
        }
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        // An entry holding these tokens (and their logits, if these come with them), or more
        // and able to serve them (cut back to all but the last, which is run again for its
        // logits), covers them.
        // A finished generation's state (no logits) covers no prompt's: a repeated prompt keeps
        // starting without a pass.
        let covers = |longer: (&[u32], &State, bool), shorter: (&[u32], bool)| {
            let ((l, s, l_logits), (t, t_logits)) = (longer, shorter);
            (l_logits || !t_logits)
                && l.len() >= t.len()
                && l[..t.len()] == *t
                && (l.len() == t.len() || s.can_truncate(t.len() - 1))
        };
        let new = logits.is_some();
        if let Some(e) = g
            .list
            .iter_mut()
            .find(|e| covers((&e.tokens, &e.state, e.logits.is_some()), (tokens, new)))
        {
            e.used = tick;
            return;
        }
        // Entries this one covers go (a recurrent state goes back only to where its latest
        // pass began, so it covers none but that one) — once it is sure to be kept.
        let covered = |e: &Entry| covers((tokens, state, new), (&e.tokens, e.logits.is_some()));
        let freed: u64 = g.list.iter().filter(|e| covered(e)).map(|e| e.bytes).sum();
        if !new {
            // A finished generation's state is kept only where there is room: it serves a
            // conversation that may never come back, and pushes out no prompt's.
            let want = g.bytes - freed + bytes;
            if want > self.limit || !self.lend(model, &mut g, want) {
                let held = g.bytes;
                self.lend(model, &mut g, held);
                return;
            }
        }
        let before = g.list.len();
        g.list.retain(|e| !covered(e));
        g.stats.evicted += (before - g.list.len()) as u64;
        g.bytes -= freed;
        loop {
            let want = g.bytes + bytes;
            if want <= self.limit && self.lend(model, &mut g, want) {
                break;
            }
            // The least recently used goes.
            let Some(i) = (0..g.list.len()).min_by_key(|&i| g.list[i].used) else {
                self.lend(model, &mut g, 0);
                return;
            };
            let e = g.list.swap_remove(i);
            g.bytes -= e.bytes;
            g.stats.evicted += 1;
        }
        let Some(copy) = state.prefix(tokens.len()) else {
            return;
        };
        g.list.push(Entry {
            tokens: tokens.to_vec(),
            state: copy,
            logits: logits.map(<[f32]>::to_vec),
            bytes,
            used: tick,
        });
        g.bytes += bytes;
        g.stats.stored += 1;
    }

    /// Keeps the state a finished generation leaves (its prompt and what it generated, but the
    /// last token, which was not fed) where there is room without evicting anything: the next
    /// turn of a conversation sent whole (an agent's request carrying the reply and a tool's
    /// result) starts from it.
    pub(crate) fn store_finished(&self, model: &Model, history: &[u32], state: &State) {
        if let Some(tokens) = history.get(..state.pos()) {
            self.store(model, tokens, state, None);
        }
    }

    /// Under a budget, sets the lease to `want` bytes (giving back what is over); false when
    /// the expert cache cannot lend that much. Always true without a budget.
    fn lend(&self, model: &Model, g: &mut Entries, want: u64) -> bool {
        if !self.budgeted {
            return true;
        }
        let lease = g.lease.get_or_insert_with(|| model.experts().lease());
        if want <= lease.bytes() {
            lease.shrink_to(want);
            return true;
        }
        lease.grow_to(want).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::common;

    #[test]
    fn common_counts_the_shared_start() {
        assert_eq!(common(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common(&[], &[1]), 0);
        assert_eq!(common(&[5], &[1]), 0);
    }
}
