//! One sequence's decoding loop, shared by sessions and the batcher: sampling, end-of-sequence,
//! streaming decode to whole characters, stop strings.

use sluice_sampler::Sampler;

use crate::Error;
use crate::engine::Engine;
use crate::options::{FinishReason, GenerateOptions};
use sluice_grammar::Next;
use sluice_text::{StreamDecoder, Tokenizer};

/// What the sampler decided.
pub(crate) enum Choice {
    /// A token to emit (and feed, unless the generation is then finished).
    Token(u32),
    /// The generation ends (length, or an end-of-sequence token that is not emitted).
    Finish(FinishReason),
}

/// The decoding state of one sequence.
pub(crate) struct Decoding {
    pub(crate) opts: GenerateOptions,
    sampler: Sampler,
    pub(crate) ids: Vec<u32>,
    decoder: StreamDecoder,
    pending: String,
    pub(crate) text: String,
    pub(crate) finish: Option<FinishReason>,
    /// The grammar the output follows, if any.
    constraint: Option<sluice_grammar::Constraint>,
    /// Under a budget, what the constraint's own lexer is lent by the expert cache.
    lexer_lease: Option<sluice_store::Lease>,
}

/// Grows what a generation's lexer is lent to what it holds now (it grows as the generation
/// explores the grammar); a cache that cannot give that up fails the generation.
fn grow_lexer(l: &mut sluice_store::Lease, c: &sluice_grammar::Constraint) -> Result<(), Error> {
    let want = c.lexer_bytes();
    if want > l.bytes() {
        l.grow_to(want).map_err(|e| {
            Error::Usage(format!(
                "the grammar's lexer grew to {:.1} MiB and the expert cache cannot give that up ({e}): raise --memory or simplify the grammar",
                want as f64 / (1u64 << 20) as f64
            ))
        })?;
    }
    Ok(())
}

/// Stop strings must be non-empty: an empty one would match before any text, so every
/// generation would end at once. The same rule in `run`, `batch`, `serve` and the library.
pub(crate) fn check_stops(stop: &[String]) -> Result<(), Error> {
    if stop.iter().any(String::is_empty) {
        return Err(Error::Usage(
            "stop: an empty stop string would end every generation at once; give non-empty strings"
                .into(),
        ));
    }
    Ok(())
}

impl Decoding {
    pub(crate) fn new(engine: &Engine, opts: &GenerateOptions) -> Result<Decoding, Error> {
        check_stops(&opts.stop)?;
        // Compiled once (by the caller); each generation starts its own copy, its lexer's
        // memory lent by the expert cache under a budget.
        let constraint = opts.grammar.as_ref().map(|g| g.compiled.start());
        let lexer_lease = match (&constraint, engine.budget()) {
            (Some(c), Some(_)) => {
                let mut l = engine.model().experts().lease();
                grow_lexer(&mut l, c)?;
                Some(l)
            }
            _ => None,
        };
        Ok(Decoding {
            opts: opts.clone(),
            sampler: Sampler::new(opts.sampling.clone())?,
            ids: Vec::new(),
            decoder: StreamDecoder::new(),
            pending: String::new(),
            text: String::new(),
            finish: None,
            constraint,
            lexer_lease,
        })
    }

    /// Picks the next token from `logits` given the tokens the sequence holds.
    ///
    /// Under a grammar the tokens it does not allow get −∞ first, and the grammar's end (its
    /// completion, or an end-of-sequence token it allowed) ends the generation whatever
    /// `stop_at_eos` says. Near `max_tokens` a token after which the grammar could not be
    /// finished in the tokens left is drawn again without it (the distribution is the one the
    /// mask of every such token would give); a generation so steered ends with
    /// [`FinishReason::Length`], its output whole.
    pub(crate) fn choose(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        eos: &[u32],
    ) -> Result<Choice, Error> {
        if self.ids.len() >= self.opts.max_tokens {
            return Ok(Choice::Finish(FinishReason::Length));
        }
        let left = self.opts.max_tokens - self.ids.len();
        let Some(c) = &mut self.constraint else {
            let id = self.sampler.sample(logits, history);
            return Ok(self.emit_id(id, eos));
        };
        let next = c.mask(logits)?;
        if let Some(l) = &mut self.lexer_lease {
            grow_lexer(l, c)?;
        }
        if next == Next::End {
            // Output finished early to fit `max_tokens` was cut short: it says so.
            return Ok(Choice::Finish(if c.steered() {
                FinishReason::Length
            } else {
                FinishReason::Eos
            }));
        }
        // Each refusal leaves one token fewer to draw from, and once every allowed token is
        // refused the plan's first token is taken (it always fits), so this ends. A redraw
        // starts from the row as the first draw got it (a draw applies the penalties in place).
        let saved = c.is_checking().then(|| logits.to_vec());
        let mut refused: Vec<u32> = Vec::new();
        let id = loop {
            let mut id = match &saved {
                Some(row) if !refused.is_empty() => {
                    logits.copy_from_slice(row);
                    for &r in &refused {
                        logits[r as usize] = f32::NEG_INFINITY;
                    }
                    self.sampler.redraw(logits, history)
                }
                _ => self.sampler.sample(logits, history),
            };
            if !c.allows(id) || refused.contains(&id) {
                // Every allowed logit left is −∞ or NaN, so the sampler could not tell them
                // from the masked ones: the lowest allowed id not yet refused, as an argmax
                // over equals would pick; with none left, the plan's.
                match c.first_allowed_except(&refused) {
                    Some(a) => id = a,
                    None => {
                        let p = c.planned_token().ok_or_else(|| {
                            sluice_grammar::Error::Step(
                                "every token the grammar allows was refused".into(),
                            )
                        })?;
                        c.commit(p)?;
                        break p;
                    }
                }
            }
            match c.commit_within(id, left)? {
                sluice_grammar::Commit::Taken => break id,
                sluice_grammar::Commit::Refused => refused.push(id),
            }
        };
        if eos.contains(&id) {
            return Ok(Choice::Finish(FinishReason::Eos));
        }
        Ok(self.emit_id(id, eos))
    }

    /// A token chosen: the end of the generation if it is an end-of-sequence id that ends it.
    fn emit_id(&mut self, id: u32, eos: &[u32]) -> Choice {
        if self.opts.stop_at_eos && eos.contains(&id) {
            return Choice::Finish(FinishReason::Eos);
        }
        self.ids.push(id);
        Choice::Token(id)
    }

    /// Whether the token just chosen needs the next position's logits.
    pub(crate) fn wants_more(&self) -> bool {
        self.finish.is_none() && self.ids.len() < self.opts.max_tokens
    }

    /// The text a chosen token completes, after stop strings (which may finish the generation).
    pub(crate) fn emit(&mut self, tok: Option<&Tokenizer>, id: u32) -> Result<String, Error> {
        let delta = match tok {
            Some(t) => self.decoder.push(t, id)?,
            None => String::new(),
        };
        Ok(self.apply_stops(delta))
    }

    /// Ends the generation; returns text held back (a partial stop string, an unfinished
    /// character).
    pub(crate) fn finish(&mut self, r: FinishReason, tok: Option<&Tokenizer>) -> String {
        if self.finish.is_none() {
            self.finish = Some(r);
        }
        let tail = tok
            .and_then(|t| self.decoder.flush(t).ok())
            .unwrap_or_default();
        let rest = std::mem::take(&mut self.pending) + &tail;
        self.text.push_str(&rest);
        rest
    }

    /// Holds back text that could begin a stop string; ends the generation at one.
    fn apply_stops(&mut self, delta: String) -> String {
        if self.opts.stop.is_empty() {
            self.text.push_str(&delta);
            return delta;
        }
        self.pending.push_str(&delta);
        if let Some(at) = self
            .opts
            .stop
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let out = self.pending[..at].to_owned();
            self.pending.clear();
            self.text.push_str(&out);
            self.finish = Some(FinishReason::Stop);
            return out;
        }
        // Emit everything that cannot be the start of a stop string.
        let mut keep = 0;
        for s in &self.opts.stop {
            for k in (1..s.len().min(self.pending.len() + 1)).rev() {
                if self.pending.is_char_boundary(self.pending.len() - k)
                    && s.starts_with(&self.pending[self.pending.len() - k..])
                {
                    keep = keep.max(k);
                    break;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_owned();
        self.pending.drain(..cut);
        self.text.push_str(&out);
        out
    }
}
