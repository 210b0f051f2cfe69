//! Sessions: one conversation's KV cache, and the generations run on it one at a time through
//! the shared generation loop ([`crate::generate`]).

use std::path::Path;
use std::time::Instant;

use sluice_model::State;

use crate::Error;
use crate::draft::{Held, Speculation};
use crate::engine::{Engine, Prompt, SlotClaim};
use crate::generate::{self, Seq, Step, Token, check_options};
use crate::options::{FinishReason, GenerateOptions};
use crate::stats::GenerationStats;

/// A session: a KV cache and the tokens in it. Generations continue from what the session has
/// seen (a chat keeps its history).
#[derive(Debug)]
pub struct Session {
    /// Held for the session's life: its place in the memory plan.
    _claim: SlotClaim,
    engine: Engine,
    state: State,
    history: Vec<u32>,
    /// Draft positions the state holds beyond the chosen tokens (a generation dropped while
    /// its draft was being checked leaves some), cut back before the next generation.
    held: Held,
}

impl Engine {
    /// A new session (an empty KV cache).
    ///
    /// Under a memory budget the plan holds the KV cache and recurrent state of
    /// [`crate::EngineBuilder::sequences`] sequences (default 1), and each open session takes one of
    /// them until it is dropped (a [`crate::Batcher`] takes as many as it is wide).
    /// Opening more fails at once with [`Error::Sequences`], so that the sessions' state
    /// never grows past the budget; it never waits. With [`crate::Memory::Unlimited`] any number of
    /// sessions may be open. Sessions open at the same time share the expert cache: their
    /// steps take turns for room in it, in the order they ask, so each one completes.
    pub fn session(&self) -> Result<Session, Error> {
        Ok(Session::new(self.clone(), self.claim(1)?))
    }
}

impl Session {
    pub(crate) fn new(engine: Engine, claim: SlotClaim) -> Session {
        Session {
            _claim: claim,
            state: engine.model().new_state(),
            engine,
            history: Vec::new(),
            held: Held::default(),
        }
    }

    /// Cuts back draft positions a dropped generation left ([`Held::settle`]).
    fn settle(&mut self) {
        self.held.settle(&mut self.state, self.engine.model());
    }

    /// Writes the session — its tokens and state (KV cache, recurrent state) — to `path`, with
    /// `extra` bytes of the caller's (a chat keeps its messages there): to a temporary file
    /// beside it, then renamed over it. The format is in `saved.rs` and docs/ARCHITECTURE.md.
    pub fn save(&mut self, path: &Path, extra: &[u8]) -> Result<(), Error> {
        self.settle();
        crate::saved::write(
            path,
            &self.engine.fingerprint()?,
            &crate::saved::Saved {
                numerics: self.engine.model().numerics(),
                tokens: self.history.clone(),
                state: self.state.to_bytes(),
                extra: extra.to_vec(),
            },
        )
    }

    /// Replaces what the session holds with a file [`Session::save`] wrote, and returns its
    /// extra bytes. A file that is not a session file, is of another model or numeric mode, is
    /// cut short or fails its checksum is refused ([`Error::Usage`], one line naming it) and the session is
    /// left as it was. A following [`Session::generate_full`] whose prompt starts with the saved
    /// tokens computes only the rest.
    pub fn load(&mut self, path: &Path) -> Result<Vec<u8>, Error> {
        let saved = crate::saved::read(path, &self.engine.fingerprint()?)?;
        let numerics = self.engine.model().numerics();
        if saved.numerics != numerics {
            return Err(Error::Usage(format!(
                "{}: the session was computed with --numerics {}, this run uses {numerics} (its state would not be this run's)",
                path.display(),
                saved.numerics
            )));
        }
        let cfg = self.engine.model().config();
        let mut state = State::from_bytes(cfg, &saved.state).map_err(|e| {
            Error::Usage(format!(
                "{}: the saved state cannot be used: {e}",
                path.display()
            ))
        })?;
        let fed = state.pos();
        if fed > saved.tokens.len() || saved.tokens.len() > fed + 1 {
            return Err(Error::Usage(format!(
                "{}: the saved state holds {fed} positions for {} tokens",
                path.display(),
                saved.tokens.len()
            )));
        }
        if let Some(&t) = saved.tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
            return Err(Error::Usage(format!(
                "{}: token {t} is outside the vocabulary",
                path.display()
            )));
        }
        // The KV cache it holds is charged inside the budget, as a forward pass would.
        self.engine.model().charge(&mut state).map_err(|e| {
            Error::Usage(format!(
                "{}: the memory budget cannot hold its {fed} positions ({e}): raise --memory",
                path.display()
            ))
        })?;
        self.state = state;
        self.history = saved.tokens;
        self.held = Held::default();
        Ok(saved.extra)
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Tokens in the cache.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Forgets everything (an empty cache).
    pub fn reset(&mut self) {
        self.held = Held::default();
        self.state = self.engine.model().new_state();
        self.history.clear();
    }

    /// Starts a generation from `prompt` appended to what the session has seen. Tokens come
    /// from the returned iterator.
    pub fn generate(
        &mut self,
        prompt: Prompt<'_>,
        opts: &GenerateOptions,
    ) -> Result<Generation<'_>, Error> {
        let ids = self.engine.encode(&prompt)?;
        match (&prompt, opts.cache_prefix) {
            (Prompt::Chat(m), None) => {
                let opts = GenerateOptions {
                    cache_prefix: self.engine.chat_system_end(m, &ids),
                    ..opts.clone()
                };
                self.generate_ids(ids, &opts)
            }
            _ => self.generate_ids(ids, opts),
        }
    }

    /// Starts a generation from `prompt` taken as the *whole* context (typically a chat
    /// rendered with every turn so far). The session keeps the KV cache of the longest prefix it
    /// shares with what it has seen and processes only the rest; the result is the same as on a
    /// fresh session.
    pub fn generate_full(
        &mut self,
        prompt: Prompt<'_>,
        opts: &GenerateOptions,
    ) -> Result<Generation<'_>, Error> {
        let ids = self.engine.encode(&prompt)?;
        self.settle();
        let mut keep = crate::prefix::common(&self.history, &ids);
        // Keep only positions the cache holds (the last sampled token of a generation is not fed
        // until the next call), and feed at least one token to get the next logits.
        keep = keep.min(self.state.pos());
        if keep == ids.len() {
            keep = keep.saturating_sub(1);
        }
        let model = self.engine.model();
        if self.state.truncate(keep).is_err() {
            // A recurrent state (KDA) cannot step back to an arbitrary prefix: start over,
            // which gives the same bits.
            keep = 0;
            self.state = model.new_state();
        }
        self.history.truncate(keep);
        self.generate_ids(ids[keep..].to_vec(), opts)
    }

    /// Starts a generation from token ids appended to the session's history.
    pub fn generate_ids(
        &mut self,
        ids: Vec<u32>,
        opts: &GenerateOptions,
    ) -> Result<Generation<'_>, Error> {
        if ids.is_empty() && self.history.is_empty() {
            return Err(Error::Usage("empty prompt".into()));
        }
        check_options(opts)?;
        self.settle();
        let model = self.engine.model();
        // The last token of the previous generation was sampled but not fed: it goes first.
        let fed = self.state.pos();
        let mut feed: Vec<u32> = self.history[fed..].to_vec();
        self.history.truncate(fed);
        feed.extend_from_slice(&ids);
        // The boundary as a position of the whole context.
        let boundary = opts
            .cache_prefix
            .filter(|&b| b < ids.len())
            .map(|b| fed + feed.len() - ids.len() + b);
        if feed.is_empty() {
            // Nothing new: recompute the last position's logits. A recurrent state (KDA) steps
            // back only to where its latest pass began; otherwise the whole history runs again
            // (the same bits: chunking changes none).
            let last = fed - 1;
            if self.state.truncate(last).is_ok() {
                feed.push(self.history[last]);
                self.history.truncate(last);
            } else {
                self.state = model.new_state();
                feed = std::mem::take(&mut self.history);
            }
        }
        let p = generate::prefill(
            &self.engine,
            &mut self.state,
            &mut self.history,
            &feed,
            opts,
            opts.keep_logits,
            boundary,
        )?;
        Ok(Generation {
            session: self,
            seq: p.seq,
            next_logits: Some(p.last),
            prompt_ids: ids,
            prompt_logits: p.prompt_logits,
            step_logits: Vec::new(),
            spec: Speculation::new(opts.draft),
            kept: false,
        })
    }
}

/// A running generation: an iterator of tokens.
pub struct Generation<'s> {
    session: &'s mut Session,
    seq: Seq,
    next_logits: Option<Vec<f32>>,
    prompt_ids: Vec<u32>,
    prompt_logits: Vec<f32>,
    step_logits: Vec<f32>,
    /// Speculative decoding's drafts between passes.
    spec: Speculation,
    /// The finished state was offered to the prefix cache.
    kept: bool,
}

impl std::fmt::Debug for Generation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Generation({} tokens)", self.seq.d.ids.len())
    }
}

impl Generation<'_> {
    /// The prompt's token ids.
    pub fn prompt_ids(&self) -> &[u32] {
        &self.prompt_ids
    }

    /// Generated ids so far.
    pub fn ids(&self) -> &[u32] {
        &self.seq.d.ids
    }

    /// Generated text so far (up to any stop string).
    pub fn text(&self) -> &str {
        &self.seq.d.text
    }

    /// Why it ended, once it has.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.seq.d.finish
    }

    /// Figures so far.
    pub fn stats(&self) -> GenerationStats {
        self.seq.stats(&self.session.engine, &self.session.state)
    }

    /// Logits of every prompt position then of every step, `[rows, vocab]` (with
    /// `keep_logits`).
    pub fn logits(&self) -> Vec<f32> {
        let mut v = self.prompt_logits.clone();
        v.extend_from_slice(&self.step_logits);
        v
    }

    /// Runs to the end, returning the text.
    pub fn run(&mut self) -> Result<String, Error> {
        for t in self.by_ref() {
            t?;
        }
        Ok(self.seq.d.text.clone())
    }

    /// One step of the shared loop, then this sequence's own forward pass — unless the token
    /// chosen is the draft the state already holds, whose next logits are at hand.
    fn step(&mut self) -> Result<Option<Token>, Error> {
        let engine = self.session.engine.clone();
        if self.seq.d.finish.is_some() {
            self.drop_drafts();
            return Ok(None);
        }
        if self.seq.d.ids.len() >= self.seq.d.opts.max_tokens {
            // max_tokens reached: the last token needed no further logits.
            self.next_logits = None;
            self.drop_drafts();
            return Ok(self.seq.end(&engine, FinishReason::Length));
        }
        let Some(mut logits) = self.next_logits.take() else {
            return Ok(None);
        };
        if self.seq.d.opts.keep_logits {
            self.step_logits.extend_from_slice(&logits);
        }
        // Positions of chosen tokens before this one (the state may hold drafts beyond them).
        let pos = self.session.history.len();
        match self
            .seq
            .step(&engine, &mut logits, &mut self.session.history, pos)?
        {
            Step::End(tail) => {
                self.drop_drafts();
                Ok(tail)
            }
            Step::Token { token, feed } => {
                let Some(id) = token.id.filter(|_| feed) else {
                    self.drop_drafts();
                    return Ok(Some(token));
                };
                let session = &mut *self.session;
                if let Some(next) = self.spec.chosen(
                    id,
                    &mut self.seq,
                    &mut session.held,
                    &mut session.state,
                    engine.model(),
                ) {
                    // The draft was right: its position is in the state already.
                    self.next_logits = Some(next);
                    return Ok(Some(token));
                }
                self.feed(&engine)?;
                Ok(Some(token))
            }
        }
    }

    /// Runs the chosen tokens the state does not hold yet and a new draft through the model
    /// in one pass ([`Speculation::segment`]), keeping the logits of the chosen token's
    /// position and of each draft token's.
    fn feed(&mut self, engine: &Engine) -> Result<(), Error> {
        let t0 = Instant::now();
        let model = engine.model();
        let session = &mut *self.session;
        // (Making the draft is timed apart from the pass, which the drafter weighs alone.)
        let (tokens, drafted) = self.spec.segment(
            &self.seq,
            &session.history,
            &mut session.held,
            &session.state,
            model,
            engine.prefill_chunk(),
        );
        let t_pass = Instant::now();
        let (next, rows) = self.spec.run_alone(
            model,
            &mut session.state,
            &mut session.held,
            &tokens,
            drafted,
        )?;
        self.next_logits = Some(next);
        self.spec.timed(rows - 1, t_pass.elapsed().as_secs_f64());
        self.seq.add_decode_seconds(t0.elapsed().as_secs_f64());
        Ok(())
    }

    /// Forgets the draft the state holds beyond the chosen tokens.
    fn drop_drafts(&mut self) {
        let session = &mut *self.session;
        self.spec.drop(
            &mut self.seq,
            &mut session.held,
            &mut session.state,
            session.engine.model(),
        );
    }
}

impl Iterator for Generation<'_> {
    type Item = Result<Token, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.step() {
            Ok(Some(t)) => Some(Ok(t)),
            Ok(None) => {
                // The end: what the state holds goes to the prefix cache too, once.
                if !std::mem::replace(&mut self.kept, true) {
                    let s = &*self.session;
                    s.engine
                        .prefix()
                        .store_finished(s.engine.model(), &s.history, &s.state);
                }
                None
            }
            Err(e) => {
                self.seq.fail();
                self.next_logits = None;
                Some(Err(e))
            }
        }
    }
}
