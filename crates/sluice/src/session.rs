//! Sessions: one conversation's KV cache, and the generations run on it one at a time through
//! the shared generation loop ([`crate::generate`]).

use std::collections::VecDeque;
use std::time::Instant;

use sluice_model::{Logits, State};

use crate::Error;
use crate::engine::{Engine, Prompt, SlotClaim};
use crate::generate::{self, FinishReason, GenerateOptions, Seq, Step, Token, check_options};
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
    /// Where the state's latest forward pass began: what a recurrent state can go back to when
    /// draft tokens beyond the chosen ones are dropped ([`Session::settle`]).
    pass_start: usize,
    /// Draft positions the state holds beyond the chosen tokens.
    drafted: usize,
}

impl Session {
    pub(crate) fn new(engine: Engine, claim: SlotClaim) -> Session {
        Session {
            _claim: claim,
            state: engine.model().new_state(),
            engine,
            history: Vec::new(),
            pass_start: 0,
            drafted: 0,
        }
    }

    /// Drops draft positions the state holds beyond the chosen tokens (a generation dropped
    /// while its draft was being checked leaves some). A KV cache is cut back to the chosen
    /// tokens; a recurrent state, which can go back only to where its latest pass began, goes
    /// back there, and the chosen tokens after that run again with the next pass (the same
    /// bits: chunking changes none).
    fn settle(&mut self) {
        if self.drafted == 0 {
            return;
        }
        let keep = self.state.pos() - self.drafted;
        self.drafted = 0;
        if self.state.truncate(keep).is_err() && self.state.truncate(self.pass_start).is_err() {
            // Cannot happen (a state always goes back to its latest pass's start), but a
            // state that cannot is started afresh rather than left holding drafts.
            self.state = self.engine.model().new_state();
        }
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
        self.pass_start = 0;
        self.drafted = 0;
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
        self.generate_ids(ids, opts)
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
        let mut keep = self
            .history
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count();
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
        )?;
        Ok(Generation {
            session: self,
            seq: p.seq,
            next_logits: Some(p.last),
            prompt_ids: ids,
            prompt_logits: p.prompt_logits,
            step_logits: Vec::new(),
            drafter: crate::draft::Drafter::new(opts.draft),
            drafts: VecDeque::new(),
            rows: VecDeque::new(),
            round: (0, 0),
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
    /// Speculative decoding: the drafter, the draft tokens the state holds beyond the chosen
    /// ones (oldest first), the logits of the position after each, and the current draft's
    /// (proposed, accepted).
    drafter: Option<crate::draft::Drafter>,
    drafts: VecDeque<u32>,
    rows: VecDeque<Vec<f32>>,
    round: (usize, usize),
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
                if let Some(&d) = self.drafts.front() {
                    if d == id {
                        // The draft was right: its position is in the state already.
                        self.drafts.pop_front();
                        self.session.drafted = self.drafts.len();
                        self.next_logits = self.rows.pop_front();
                        self.round.1 += 1;
                        if self.drafts.is_empty() {
                            self.end_round();
                        }
                        return Ok(Some(token));
                    }
                    self.drop_drafts();
                }
                self.feed(&engine)?;
                Ok(Some(token))
            }
        }
    }

    /// Runs the chosen tokens the state does not hold yet (the one just chosen, and any a
    /// recurrent state had to drop) and a new draft through the model in one pass, keeping the
    /// logits of the chosen token's position and of each draft token's.
    fn feed(&mut self, engine: &Engine) -> Result<(), Error> {
        let t0 = Instant::now();
        let model = engine.model();
        let state = &mut self.session.state;
        let history = &self.session.history;
        let fed = state.pos();
        let mut tokens = history[fed..].to_vec();
        let draft = match &mut self.drafter {
            // Drafts past what may still be generated, or past the context, are never used.
            Some(d) => {
                let left = self.seq.d.opts.max_tokens - self.seq.d.ids.len();
                let room = model.max_positions().saturating_sub(fed + tokens.len());
                d.propose(history, left.saturating_sub(1).min(room))
            }
            None => Vec::new(),
        };
        tokens.extend_from_slice(&draft);
        self.session.pass_start = fed;
        let pass = Instant::now();
        if draft.is_empty() && tokens.len() == 1 {
            self.next_logits = Some(model.forward(state, &tokens, Logits::Last)?);
        } else {
            let all = model.forward(state, &tokens, Logits::All)?;
            let v = model.config().vocab;
            let first = tokens.len() - 1 - draft.len();
            let mut rows = all.chunks_exact(v).skip(first).map(<[f32]>::to_vec);
            self.next_logits = rows.next();
            self.rows = rows.collect();
            self.drafts = draft.iter().copied().collect();
            self.session.drafted = draft.len();
            self.round = (draft.len(), 0);
        }
        if let Some(d) = &mut self.drafter {
            d.timed(tokens.len(), pass.elapsed().as_secs_f64());
        }
        self.seq.add_decode_seconds(t0.elapsed().as_secs_f64());
        Ok(())
    }

    /// Counts the current draft and tells the drafter how it went.
    fn end_round(&mut self) {
        let (proposed, accepted) = std::mem::take(&mut self.round);
        if proposed > 0 {
            self.seq.note_draft(proposed, accepted);
            if let Some(d) = &mut self.drafter {
                d.outcome(proposed, accepted);
            }
        }
    }

    /// Forgets the draft tokens the state holds beyond the chosen ones
    /// ([`Session::settle`]).
    fn drop_drafts(&mut self) {
        if self.drafts.is_empty() {
            return;
        }
        self.end_round();
        self.drafts.clear();
        self.rows.clear();
        self.session.settle();
    }
}

impl Iterator for Generation<'_> {
    type Item = Result<Token, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.step() {
            Ok(Some(t)) => Some(Ok(t)),
            Ok(None) => None,
            Err(e) => {
                self.seq.fail();
                self.next_logits = None;
                Some(Err(e))
            }
        }
    }
}
