//! One forward pass over segments (one sequence's tokens each) sharing every row-wise step:
//! embeddings, per layer attention (per segment, against its own cache) and the feed-forward
//! block (over all rows), then the head for the rows whose logits are wanted.
//!
//! The pass is layer-major: each layer runs over every row before the next begins, so a layer's
//! routed experts are fetched once for the union of what all the rows chose (a prefill span of
//! thousands of tokens reads each expert once). What each call inside a layer works with is
//! bounded by `chunk` rows: attention runs chunk by chunk against the cache the earlier chunks
//! wrote, and the products of dense blocks and experts take at most `chunk` rows at a time.
//! Every row's arithmetic is the same whatever the chunk, so the output bits are too.

use std::borrow::Cow;
use std::cell::Cell;
use std::time::Instant;

use sluice_store::{Blob, Guess};

use crate::ModelError;
use crate::config::ModelConfig;
use crate::ffn::{Ahead, MidGuess, MoeLayer, Run, glu_rows};
use crate::net::Net;
use crate::options::{Logits, PassTimes};
use crate::residual::{Mixing, Stream};
use crate::rope::Angles;
use crate::state::State;
use crate::weights::{FfnSpec, LayerSpec};

/// The geometry of a pass: where each segment's rows start, its first position and angles.
struct Pass<'c> {
    /// The configuration its layers are read with: the model's, or for a pass of the
    /// multi-token-prediction layer the model's with that layer after the last
    /// (`MtpRun::cfg`).
    cfg: &'c ModelConfig,
    /// Lookahead may guess the next layers' experts (not in a draft pass).
    ahead: bool,
    /// Rows.
    t: usize,
    /// Each row's token.
    tokens: Vec<u32>,
    /// Row where each segment starts, and the total at the end.
    starts: Vec<usize>,
    /// Each segment's first position.
    pos0s: Vec<usize>,
    /// Each segment's rotary angles, per chunk of `chunk` rows.
    angles: Vec<Vec<Angles>>,
    /// The same for the second rotary table, when the model has one.
    local_angles: Option<Vec<Vec<Angles>>>,
    /// Per segment and chunk, the last full sparse-attention layer's top-k.
    sparse: Vec<Vec<std::cell::RefCell<Option<crate::attention::dsa::Selection>>>>,
    /// Rows each call inside a layer takes at most.
    chunk: usize,
    /// Floats of attention scores its tiles may hold at once.
    score_floats: usize,
    /// Every segment has at most one token (a decode step).
    single_token_steps: bool,
    /// Lookahead runs on every layer: prefetch is on and this is a decode step.
    lookahead: bool,
    /// Intermediate tensors are recorded for a single sequence only.
    single: bool,
    /// Some segment records its routes.
    recording_routes: bool,
    /// Seconds spent in attention and in routed experts (fetch and products).
    attention_seconds: Cell<f64>,
    expert_seconds: Cell<f64>,
}

type Segs<'s, 'a, 'b> = [(&'a mut State, &'b [u32])];

/// How a forward pass is run: rows per call inside a layer, whether it starts a new step of
/// the expert store's counters, and who hears of each finished layer.
pub(crate) struct PassOpts<'f> {
    /// Rows each call inside a layer takes at most (at least 1).
    pub chunk: usize,
    /// Counts as a new forward step in the expert store's figures (a prefill of several spans
    /// is one step: its touched experts are the prompt's).
    pub new_step: bool,
    /// Called with each layer's index once the layer has run over every row.
    pub on_layer: Option<&'f mut (dyn FnMut(usize) + Send)>,
    /// Floats of attention scores the pass's tiles may hold at once.
    pub score_floats: usize,
}

impl Net {
    /// The forward pass over segments; `want` applies per segment.
    pub(crate) fn forward_inner(
        &self,
        segs: &mut Segs<'_, '_, '_>,
        want: Logits,
        opts: &mut PassOpts<'_>,
        times: &mut PassTimes,
    ) -> Result<Vec<f32>, ModelError> {
        let t_start = Instant::now();
        let cfg = self.config();
        let chunk = opts.chunk.max(1);
        if segs.iter().all(|s| s.1.is_empty()) {
            return Ok(Vec::new());
        }
        if let Some(&bad) = segs
            .iter()
            .flat_map(|s| s.1.iter())
            .find(|&&id| id as usize >= cfg.vocab)
        {
            return Err(ModelError::Token {
                id: bad,
                vocab: cfg.vocab,
            });
        }
        let pass = self.new_pass(cfg, segs, chunk, opts.score_floats, 0, true);
        if opts.new_step {
            self.experts().begin_step();
        }
        // A hash-routed first layer's experts are known from the tokens: read them now.
        if self.prefetch()
            && cfg.is_hash_routed(0)
            && let Some((l, ids)) = self.predict(0, &[], &pass.tokens)?
        {
            self.experts().prefetch(l, &ids);
        }

        let hs = self.embed_rows(&pass.tokens)?;
        record(&pass, segs, || ("embeddings".into(), hs.clone()));
        let mut stream = Stream::new(cfg.residual, hs, cfg.hidden);
        // A shortcut MoE's routed sum, on its way to the end of the next layer.
        let mut carry = None;
        for l in 0..cfg.layers {
            carry = self.layer(&pass, segs, &mut stream, l, carry)?;
            if let Some(f) = opts.on_layer.as_mut() {
                f(l);
            }
        }
        if let Some(c) = carry {
            stream.add_ffn(&c);
        }
        for (state, toks) in segs.iter_mut() {
            state.pos += toks.len();
        }
        let t_head = Instant::now();
        let logits = self.head(&pass, segs, &stream, want)?;
        let head = t_head.elapsed().as_secs_f64();
        let (attention, experts) = (pass.attention_seconds.get(), pass.expert_seconds.get());
        *times += PassTimes {
            attention,
            experts,
            head,
            other: (t_start.elapsed().as_secs_f64() - attention - experts - head).max(0.0),
        };
        Ok(logits)
    }

    /// Runs the layers of `cfg` after the model's own (the MTP layer of
    /// `MtpRun::cfg`) over one segment whose input rows are `x` (`[t, hidden]`; with
    /// hyper-connections the streams, `[t, n, hidden]`),
    /// rotary positions `offset` after its state's, with no lookahead; returns their output
    /// rows. The state's position is not advanced.
    pub(crate) fn run_layers(
        &self,
        cfg: &ModelConfig,
        segs: &mut Segs<'_, '_, '_>,
        offset: usize,
        x: Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        let pass = self.new_pass(cfg, segs, self.chunk, self.step_score_floats, offset, false);
        let mut stream = Stream::entering(cfg.residual, x, cfg.hidden);
        let mut carry = None;
        for l in self.config().layers..cfg.layers {
            carry = self.layer(&pass, segs, &mut stream, l, carry)?;
        }
        if let Some(c) = carry {
            stream.add_ffn(&c);
        }
        Ok(stream.output().to_vec())
    }

    /// The geometry of a pass over `segs` read with `cfg`, rotary positions `offset` after
    /// each state's own; `ahead`: lookahead may guess the next layers' experts.
    fn new_pass<'c>(
        &self,
        cfg: &'c ModelConfig,
        segs: &Segs<'_, '_, '_>,
        chunk: usize,
        score_floats: usize,
        offset: usize,
        ahead: bool,
    ) -> Pass<'c> {
        let tokens: Vec<u32> = segs.iter().flat_map(|s| s.1.iter().copied()).collect();
        let mut starts = Vec::with_capacity(segs.len() + 1);
        starts.push(0usize);
        for (_, toks) in segs.iter() {
            starts.push(starts.last().copied().unwrap_or(0) + toks.len());
        }
        let single_token_steps = starts.windows(2).all(|w| w[1] - w[0] <= 1);
        let angles_of = |rope: &crate::rope::Rope| -> Vec<Vec<Angles>> {
            segs.iter()
                .map(|(s, toks)| {
                    (0..toks.len())
                        .step_by(chunk)
                        .map(|c0| {
                            Angles::new(rope, offset + s.pos + c0, chunk.min(toks.len() - c0))
                        })
                        .collect()
                })
                .collect()
        };
        Pass {
            cfg,
            ahead,
            t: tokens.len(),
            tokens,
            single_token_steps,
            lookahead: ahead && self.prefetch() && single_token_steps,
            starts,
            pos0s: segs.iter().map(|(s, _)| s.pos).collect(),
            angles: angles_of(self.rope()),
            local_angles: self.local_rope().map(angles_of),
            sparse: segs
                .iter()
                .map(|(_, toks)| {
                    (0..toks.len().div_ceil(chunk))
                        .map(|_| std::cell::RefCell::new(None))
                        .collect()
                })
                .collect(),
            chunk,
            score_floats,
            single: segs.len() == 1,
            recording_routes: segs.iter().any(|(s, _)| s.routes.is_some()),
            attention_seconds: Cell::new(0.0),
            expert_seconds: Cell::new(0.0),
        }
    }

    /// RMSNorm of each `[hidden]` row of `src` with weights `w`.
    pub(crate) fn norm_rows(&self, src: &[f32], w: &[f32]) -> Vec<f32> {
        let (h, eps) = (self.config().hidden, self.config().eps);
        let mut x = vec![0f32; src.len()];
        for (s, o) in src.chunks_exact(h).zip(x.chunks_exact_mut(h)) {
            self.exec().kernels().rmsnorm(s, w, eps, o);
        }
        x
    }

    pub(crate) fn mixing(&self) -> Mixing<'_> {
        Mixing {
            k: self.exec().kernels(),
            eps: self.config().eps,
            hidden: self.config().hidden,
        }
    }

    /// Layer `l`: attention, then the feed-forward block, each added to the stream, then what
    /// the layer before carried ([`crate::config::MoeConfig::shortcut`]). Returns what this
    /// layer carries to the next.
    fn layer(
        &self,
        pass: &Pass<'_>,
        segs: &mut Segs<'_, '_, '_>,
        stream: &mut Stream,
        l: usize,
        carried_in: Option<Vec<f32>>,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        let cfg = pass.cfg;
        let part = self.trunk().part(self.part_of(l))?;
        // Stream the next layer (or layer 0 for the next step) while this one computes.
        self.trunk().prefetch(if l + 1 < cfg.layers {
            self.part_of(l + 1)
        } else {
            0
        });
        let blob: &Blob = &part;
        let spec = self.layer_spec(l);
        let mixing = self.mixing();
        let res = spec.mix.as_ref();
        let x = self.norm_rows(
            &stream.before_attention(&mixing, res.map(|w| &w[0]), blob, l)?,
            &spec.input_norm.to_f32(blob),
        );
        let t0 = Instant::now();
        let a = self.attend(pass, segs, l, spec, blob, &x)?;
        pass.attention_seconds
            .set(pass.attention_seconds.get() + t0.elapsed().as_secs_f64());
        if pass.lookahead {
            keep_attention(pass, segs, l, &a, cfg.hidden);
        }
        stream.add_attention(l, a);
        let mlp_in = stream.before_ffn(&mixing, res.map(|w| &w[1]), blob)?;
        let (f, carry) = self.feed_forward(pass, segs, l, spec, blob, &mlp_in)?;
        drop(mlp_in);
        stream.add_ffn(&f);
        if let Some(c) = carried_in {
            stream.add_ffn(&c);
        }
        let out = stream.output();
        // NaN or infinite weights in a streamed layer or an expert end the request here
        // rather than producing garbage tokens.
        if out.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::NonFinite { layer: l });
        }
        record(pass, segs, || (format!("layer{l}.output"), out.to_vec()));
        // The late guess of the next layer's experts, from this layer's output: the next
        // router's input but for its attention (estimated by the token before's). Reads
        // start now, overlapping that attention; a hash-routed layer was known already.
        if pass.lookahead
            && l + 1 < cfg.layers
            && !cfg.is_hash_routed(l + 1)
            && out.len() == pass.t * cfg.hidden
            && self.experts().wants_guess(Guess::Late)
        {
            let x = lookahead_input(pass, segs, l + 1, out, cfg.hidden);
            if let Some((nl, ids)) = self.predict(l + 1, &x, &pass.tokens)? {
                self.experts().prefetch_guess(Guess::Late, nl, &ids);
            }
        }
        if let Some(b) = stream.blocks() {
            let h = cfg.hidden;
            record(pass, segs, || {
                let mut br = Vec::with_capacity(pass.t * b.len() * h);
                for i in 0..pass.t {
                    for blk in b {
                        br.extend_from_slice(&blk[i * h..(i + 1) * h]);
                    }
                }
                (format!("layer{l}.block_residual"), br)
            });
        }
        Ok(carry)
    }

    /// Layer `l`'s attention over the normed rows `x`, per segment against its own cache, in
    /// calls of at most `chunk` rows (each after the earlier ones have written the cache).
    fn attend(
        &self,
        pass: &Pass<'_>,
        segs: &mut Segs<'_, '_, '_>,
        l: usize,
        spec: &LayerSpec,
        blob: &Blob,
        x: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = pass.cfg;
        let h = cfg.hidden;
        let starts = &pass.starts;
        let mut out = Vec::with_capacity(x.len());
        let source = cfg.layer_plan[l].attention.kv_source();
        for (si, (state, toks)) in segs.iter_mut().enumerate() {
            // A layer reading an earlier one's cache: that layer has run over every row.
            let (before, this) = state.layers.split_at_mut(self.state_index(l));
            let latent = match source {
                Some(s) => Some(before.get(s).and_then(|c| c.latent()).ok_or_else(|| {
                    ModelError::Mismatch {
                        what: format!("layer {l} shares a cache layer {s} lacks"),
                    }
                })?),
                None => None,
            };
            for (ci, c0) in (0..toks.len()).step_by(pass.chunk).enumerate() {
                let c1 = (c0 + pass.chunk).min(toks.len());
                let cx = crate::attention::Ctx {
                    sparse: &pass.sparse[si][ci],
                    latent,
                    exec: self.exec(),
                    rope: self.rope(),
                    angles: &pass.angles[si][ci],
                    local: self
                        .local_rope()
                        .zip(pass.local_angles.as_ref())
                        .map(|(r, a)| (r, &a[si][ci])),
                    hidden: h,
                    eps: cfg.eps,
                    pass_start: pass.pos0s[si],
                    score_floats: pass.score_floats,
                };
                let rows = starts[si] + c0..starts[si] + c1;
                let a = cfg.layer_plan[l].attention.forward(
                    &cx,
                    &spec.attn,
                    blob,
                    &mut this[0],
                    pass.pos0s[si] + c0,
                    &x[rows.start * h..rows.end * h],
                )?;
                if out.is_empty() && rows.len() == pass.t {
                    return Ok(a);
                }
                out.extend_from_slice(&a);
            }
        }
        Ok(out)
    }

    /// Layer `l`'s feed-forward block over `src` (its input before the norm), routes recorded
    /// into the segments that ask for them: what it adds now, and what it carries to the end
    /// of the next layer.
    fn feed_forward(
        &self,
        pass: &Pass<'_>,
        segs: &mut Segs<'_, '_, '_>,
        l: usize,
        spec: &LayerSpec,
        blob: &Blob,
        src: &[f32],
    ) -> Result<(Vec<f32>, Option<Vec<f32>>), ModelError> {
        let cfg = pass.cfg;
        let x = self.norm_rows(src, &spec.post_norm.to_f32(blob));
        // Lookahead only on decode steps (one token per sequence): a prefill chunk's
        // predicted union adds the mispredicted experts of every token to what the chunk
        // reads (measured 7-11% more bytes than the experts it touched at 64 tokens) and
        // brought no measurable speed.
        // A hash-routed layer's experts are known exactly from the tokens, so they are read
        // ahead in a prefill too. A learned router is guessed while the store finds it worth
        // it (`ExpertStore::wants_guess`).
        let next = if pass.ahead
            && self.prefetch()
            && (cfg.is_hash_routed(l + 1)
                || (pass.single_token_steps && self.experts().wants_guess(Guess::Early)))
        {
            let x = lookahead_input(pass, segs, l + 1, src, cfg.hidden);
            self.predict(l + 1, &x, &pass.tokens)?
        } else {
            None
        };
        match &spec.ffn {
            FfnSpec::Dense(m) => {
                if let Some((nl, ids)) = &next {
                    self.experts().prefetch(*nl, ids);
                }
                Ok((
                    glu_rows(self.exec(), m, blob, &x, cfg.mlp_act_of(l), pass.chunk)?,
                    None,
                ))
            }
            FfnSpec::Moe(moe_spec) => {
                // Routes come back with their row index as position.
                let mut routes = pass.recording_routes.then(Vec::new);
                // The mid guess: the next layer's router input estimated from this layer's
                // input plus what its experts computed so far, made while it waits for reads.
                let guess_mid = pass.lookahead
                    && l + 1 < cfg.layers
                    && !cfg.is_hash_routed(l + 1)
                    && self.experts().wants_guess(Guess::Mid);
                let ro: &Segs<'_, '_, '_> = segs;
                let mid = |partial: &[f32]| -> Result<(), ModelError> {
                    let mut base = src.to_vec();
                    for (b, &p) in base.iter_mut().zip(partial) {
                        *b += p;
                    }
                    let x = lookahead_input(pass, ro, l + 1, &base, cfg.hidden);
                    if let Some((nl, ids)) = self.predict(l + 1, &x, &pass.tokens)? {
                        self.experts().prefetch_guess(Guess::Mid, nl, &ids);
                    }
                    Ok(())
                };
                let ahead = Ahead {
                    early: next.as_ref(),
                    mid: guess_mid.then_some(&mid as &MidGuess<'_>),
                };
                let layer = MoeLayer {
                    exec: self.exec(),
                    cfg,
                    layer: l,
                    spec: moe_spec,
                    blob,
                    store: self.experts(),
                    experts: self.expert_specs_of(l),
                };
                let run = Run {
                    ahead,
                    gather: self.gathers_experts(),
                    rows_per_call: pass.chunk,
                    expert_seconds: &pass.expert_seconds,
                };
                let y = layer.forward(&x, &pass.tokens, routes.as_mut(), run)?;
                let starts = &pass.starts;
                for mut r in routes.into_iter().flatten() {
                    let si = starts.partition_point(|&s| s <= r.pos) - 1;
                    r.pos = pass.pos0s[si] + (r.pos - starts[si]);
                    if let Some(v) = segs[si].0.routes.as_mut() {
                        v.push(r);
                    }
                }
                Ok((y.now, y.carried))
            }
        }
    }

    /// The final norm and lm_head over the rows whose logits are wanted.
    fn head(
        &self,
        pass: &Pass<'_>,
        segs: &mut Segs<'_, '_, '_>,
        stream: &Stream,
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = self.config();
        let head = &self.layout().head_spec;
        let head_blob = self.trunk().part(cfg.layers)?;
        let mixing = self.mixing();
        // The rows sequences keep for drafting ([`State::keep_hidden`]): final-normed, or the
        // streams themselves for an MTP layer that takes them.
        for (si, (state, _)) in segs.iter_mut().enumerate() {
            let (s0, s1) = (pass.starts[si], pass.starts[si + 1]);
            let keep = state.hidden.keep.min(s1 - s0);
            if keep == 0 {
                continue;
            }
            let first = pass.pos0s[si] + (s1 - keep - s0);
            let width = cfg.mtp_row_width();
            if cfg.mtp_streams().is_some() {
                state
                    .hidden
                    .put(first, stream.raw_rows(s1 - keep..s1, width), width);
                continue;
            }
            let fin = stream.final_rows(&mixing, head.mix.as_ref(), &head_blob, s1 - keep..s1)?;
            let xn = self.norm_rows(&fin, &head.norm.to_f32(&head_blob));
            state.hidden.put(first, &xn, width);
        }
        // The rows whose logits are wanted, as runs of consecutive rows.
        let runs: Vec<std::ops::Range<usize>> = match want {
            Logits::All => std::iter::once(0..pass.t).collect(),
            Logits::Last => pass
                .starts
                .windows(2)
                .filter(|w| w[1] > w[0])
                .map(|w| w[1] - 1..w[1])
                .collect(),
            Logits::None => return Ok(Vec::new()),
        };
        let n_rows: usize = runs.iter().map(|r| r.len()).sum();
        let mut final_in: Vec<f32> = Vec::with_capacity(n_rows * cfg.hidden);
        for rows in runs {
            final_in.extend(stream.final_rows(&mixing, head.mix.as_ref(), &head_blob, rows)?);
        }
        let xn = self.norm_rows(&final_in, &head.norm.to_f32(&head_blob));
        if pass.single
            && let Some(d) = segs[0].0.debug.as_mut()
        {
            d.push(("final_norm_input".into(), final_in));
            d.push(("final_hidden".into(), xn.clone()));
        }
        let logits = self.lm_head_rows(&xn, &head_blob)?;
        Ok(logits)
    }
}

impl Net {
    /// The lm_head over final-normed rows `xn` (`[n, hidden]`), soft-capped when the model
    /// caps its logits: `[n, vocab]`. `head_blob` is the head part.
    pub(crate) fn lm_head_rows(
        &self,
        xn: &[f32],
        head_blob: &Blob,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = self.config();
        let mut logits = vec![0f32; xn.len() / cfg.hidden * cfg.vocab];
        self.exec().matmul(
            &self.layout().head_spec.lm_head.view(head_blob)?,
            xn,
            &mut logits,
        );
        if let Some(c) = cfg.logit_softcap {
            for z in &mut logits {
                *z = (*z / c).tanh() * c;
            }
        }
        Ok(logits)
    }
}

/// Appends the named tensor `f` makes to the single segment's debug record, if it keeps one.
fn record(pass: &Pass<'_>, segs: &mut Segs<'_, '_, '_>, f: impl FnOnce() -> (String, Vec<f32>)) {
    if pass.single
        && let Some(d) = segs[0].0.debug.as_mut()
    {
        d.push(f());
    }
}

/// Keeps each single-token segment's attention output of layer `l` (rows of `a`,
/// `[t, hidden]`) as its lookahead hint for the next step.
fn keep_attention(pass: &Pass<'_>, segs: &mut Segs<'_, '_, '_>, l: usize, a: &[f32], h: usize) {
    if a.len() != pass.t * h {
        return;
    }
    for (si, (state, toks)) in segs.iter_mut().enumerate() {
        if toks.len() != 1 {
            continue;
        }
        let row = pass.starts[si];
        if let Some(kept) = state.last_attention.get_mut(l) {
            kept.clear();
            kept.extend_from_slice(&a[row * h..(row + 1) * h]);
        }
    }
}

/// Lookahead's estimate of layer `next`'s router input from `base` (`[t, hidden]`, the
/// residual stream before `next`'s attention or earlier): each row plus its sequence's
/// attention output of `next` for the token before, when kept (`base` itself when nothing
/// is, or when it is not one row per token). Attention outputs move slowly from token to
/// token; on the trained demo model this lifts the recall of the late guess from 74% to 83%
/// (docs/PERFORMANCE.md).
fn lookahead_input<'a>(
    pass: &Pass<'_>,
    segs: &Segs<'_, '_, '_>,
    next: usize,
    base: &'a [f32],
    h: usize,
) -> Cow<'a, [f32]> {
    let mut x = Cow::Borrowed(base);
    if base.len() != pass.t * h {
        return x;
    }
    for (si, (state, toks)) in segs.iter().enumerate() {
        let kept = state.last_attention.get(next).filter(|a| a.len() == h);
        if let (1, Some(a)) = (toks.len(), kept) {
            let row = pass.starts[si];
            for (v, &d) in x.to_mut()[row * h..(row + 1) * h].iter_mut().zip(a) {
                *v += d;
            }
        }
    }
    x
}
