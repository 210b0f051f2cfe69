//! Searching the grammar for a way to finish: the bytes that complete what was written (so a
//! reply cut by its length still parses), within a budget of parser operations.

use super::*;

/// What a search for a way to finish found.
pub(crate) enum Search {
    /// These bytes finish the grammar.
    Found(Vec<u8>),
    /// None within the bytes allowed (there may be one the search missed).
    NotFound,
    /// It ran out of operations first.
    GaveUp,
}

/// Takes `n` from `ops`; false when there are not that many.
fn spend(ops: &mut usize, n: usize) -> bool {
    match ops.checked_sub(n) {
        Some(rest) => {
            *ops = rest;
            true
        }
        None => false,
    }
}

/// Parser operations one search during generation may spend (about 4,096 bytes of a JSON
/// completion, fewer of a Lark one): searching costs time on every step, so a grammar whose
/// completions are long and costly to find is not checked.
pub const SEARCH_OPS: usize = 16 << 10;

/// Parser operations the search for a grammar's smallest sentence may spend when it compiles.
pub const SMALLEST_OPS: usize = 256 << 10;

/// The most a lexer may hold while a search goes on, in bytes: a search that explores more of
/// the grammar gives up.
pub const SEARCH_LEXER_BYTES: u64 = 32 << 20;

/// Bytes tried, in this order, when the search for a completion has no better guide: closing
/// what is open, then the shortest values.
const PREFERRED: &[u8] = b"\"}])>,:0 nft[{-";

impl Constraint {
    /// Whether `bytes`, one single-byte token each, finish the grammar from here: the tokens
    /// and an end-of-sequence after them are checked in one speculative walk, nothing taken.
    pub(crate) fn finishes(&mut self, bytes: &[u8]) -> bool {
        let mut tokens = Vec::with_capacity(bytes.len() + 1);
        for &b in bytes {
            match self.texts.byte_token[b as usize] {
                Some(t) => tokens.push(t),
                None => return false,
            }
        }
        tokens.push(self.eos[0]);
        self.m.validate_tokens(&tokens).ok() == Some(tokens.len())
    }

    /// Looks for a way to finish the grammar from here in at most `limit` bytes, one
    /// single-byte token each: at each step the byte the JSON guide would write next, else one
    /// after which the grammar may end, else the first the grammar allows of [`PREFERRED`] and
    /// then of every byte in order. Leaves the constraint as it was. Spends at most `ops`
    /// parser operations (each a token checked, taken or tested for the end): a search that
    /// would spend more gives up.
    pub(crate) fn completion(&mut self, limit: usize, ops: usize) -> Search {
        let mut guide = self.json.clone();
        let mut out = Vec::new();
        let mut left = ops;
        let found = loop {
            if !spend(&mut left, 1) {
                break Search::GaveUp;
            }
            match self.m.is_accepting() {
                Ok(true) => break Search::Found(Vec::new()),
                Ok(false) => {}
                Err(_) => break Search::NotFound,
            }
            if out.len() >= limit.min(MAX_COMPLETION) {
                break Search::NotFound;
            }
            let b = match self.next_byte(guide.as_ref(), &mut left) {
                Ok(Some(b)) => b,
                Ok(None) => break Search::NotFound,
                Err(()) => break Search::GaveUp,
            };
            let Some(t) = self.texts.byte_token[b as usize] else {
                break Search::NotFound;
            };
            if !spend(&mut left, 1) {
                break Search::GaveUp;
            }
            if self.m.consume_token(t).is_err() {
                break Search::NotFound;
            }
            if self.lexer_bytes() > SEARCH_LEXER_BYTES {
                out.push(b);
                break Search::GaveUp;
            }
            out.push(b);
            if let Some(g) = &mut guide {
                g.push(&[b]);
            }
        };
        if self.m.rollback(out.len()).is_err() {
            return Search::NotFound;
        }
        match found {
            Search::Found(_) => Search::Found(out),
            other => other,
        }
    }

    /// The byte the completion search takes next (see [`Constraint::completion`]); `Err` when
    /// `ops` runs out first.
    fn next_byte(
        &mut self,
        guide: Option<&close::JsonPrefix>,
        ops: &mut usize,
    ) -> Result<Option<u8>, ()> {
        let texts = self.texts.clone();
        let allowed = |m: &mut Matcher, b: u8, ops: &mut usize| -> Result<bool, ()> {
            let Some(t) = texts.byte_token[b as usize] else {
                return Ok(false);
            };
            if !spend(ops, 1) {
                return Err(());
            }
            Ok(m.validate_tokens(&[t]).ok() == Some(1))
        };
        if let Some(b) = guide
            .and_then(|g| g.suffix())
            .and_then(|s| s.first().copied())
            && allowed(&mut self.m, b, ops)?
        {
            return Ok(Some(b));
        }
        // What the grammar forces (a required key, a literal's rest) costs one operation.
        if !spend(ops, 1) {
            return Err(());
        }
        if let Some(&b) = self.m.compute_ff_bytes().first()
            && texts.byte_token[b as usize].is_some()
        {
            return Ok(Some(b));
        }
        let mut order: Vec<u8> = PREFERRED.to_vec();
        order.extend((0..=255u8).filter(|b| !PREFERRED.contains(b)));
        let mut bytes = Vec::new();
        for b in order {
            if allowed(&mut self.m, b, ops)? {
                bytes.push(b);
            }
        }
        // A byte after which the grammar may end, if there is one; else the first allowed.
        for &b in bytes.iter().take(64) {
            let Some(t) = texts.byte_token[b as usize] else {
                continue;
            };
            if !spend(ops, 2) {
                return Err(());
            }
            if self.m.consume_token(t).is_ok() {
                let ends = self.m.is_accepting().unwrap_or(false);
                let _ = self.m.rollback(1);
                if ends {
                    return Ok(Some(b));
                }
            }
        }
        Ok(bytes.first().copied())
    }
}
