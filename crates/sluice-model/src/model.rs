//! The model: weights, the forward pass over a chunk of tokens, logits.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use sluice_format::Checkpoint;
use sluice_kernels::Codes;
use sluice_store::{ExpertStore, ExpertStoreConfig, IoMode, Piece, Reader, TrunkStore, read_blob};

use crate::ModelError;
use crate::config::ModelConfig;
use crate::desc::Description;
use crate::exec::Exec;
use crate::plan::MemoryPlan;
use crate::rope::Rope;
use crate::state::State;
use crate::weights::WeightLayout;

pub use crate::options::{Logits, ModelOptions, PrefillEvent, PrefillOptions, pack_verifier};
pub use crate::plan::KV_PAGE;

pub use sluice_store::policy::{PolicyChoice, PolicyFactory};

use crate::mtp::MtpRun;
use crate::net::Net;
pub use crate::options::PassTimes;
use crate::pass::PassOpts;

/// What [`Model::prefill`] returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prefilled {
    /// The logits asked for, `[rows, vocab]`.
    pub logits: Vec<f32>,
    /// Tokens of each span, in order.
    pub spans: Vec<usize>,
    /// Where the passes spent their time.
    pub times: PassTimes,
}

/// What a prefill span holds of the pool while it runs, given back on drop.
enum SpanLease<'a> {
    /// Lent by the expert cache (held only to be dropped).
    Pool(#[allow(dead_code)] sluice_store::Lease),
    /// Taken from the room spare beside every expert (passes in the compute pool).
    Spare { counter: &'a AtomicU64, bytes: u64 },
}

impl Drop for SpanLease<'_> {
    fn drop(&mut self) {
        if let SpanLease::Spare { counter, bytes } = self {
            counter.fetch_sub(*bytes, Ordering::AcqRel);
        }
    }
}

/// A loaded model, immutable and shareable across threads; per-sequence state lives in [`State`].
#[derive(Debug)]
pub struct Model {
    /// What a forward pass reads.
    net: Net,
    plan: MemoryPlan,
    io_mode: IoMode,
    /// Expert reads of O_DIRECT shards go through an io_uring.
    io_uring: bool,
    /// Forward passes run inside the compute pool (trunk pinned and every expert fits: nothing
    /// in a pass waits for another session).
    in_pool: bool,
    /// Bytes prefill spans hold of the room spare beside every expert (with `in_pool`).
    span_bytes: AtomicU64,
    /// Forward passes running now (a pass with none beside it runs inside the compute pool).
    passes: AtomicUsize,
    /// `generation_config.json`, when the model has one.
    generation: Option<serde_json::Value>,
    /// The multi-token-prediction layer, when loaded ([`ModelOptions::mtp`]).
    mtp: Option<MtpRun>,
}

impl Model {
    /// Opens the checkpoint in `dir` with every trunk tensor resident and experts read on demand.
    pub fn open(dir: impl AsRef<Path>, opts: ModelOptions) -> Result<Model, ModelError> {
        Model::from_description(Description::open(dir)?, opts)
    }

    /// Builds the runtime of a described model: thread pool, trunk and expert stores, reader.
    pub fn from_description(desc: Description, opts: ModelOptions) -> Result<Model, ModelError> {
        let shards = Arc::new(desc.shards(opts.direct_io)?);
        let Description {
            checkpoint: ck,
            config: cfg,
            layout,
        } = desc;
        let mode = shards.mode();
        let mut opts = opts;
        if let Some(m) = ck.packed()
            && opts.verify_pack
            && opts.verify.is_none()
        {
            opts.verify = Some(pack_verifier(m, &ck.dir().join(&m.file), cfg.layers));
        }
        let mut model = Model::with_reader(cfg, layout, shards, mode, opts)?;
        model.check_finite(&ck)?;
        model.generation = ck.generation_config().cloned();
        Ok(model)
    }

    /// Refuses a model whose resident trunk holds NaN or infinite weights, naming the tensor
    /// (streamed layers and experts are caught when they are used: see `forward`).
    fn check_finite(&self, ck: &Checkpoint) -> Result<(), ModelError> {
        let parts = self
            .net
            .layout
            .layers
            .iter()
            .chain(std::iter::once(&self.net.layout.head));
        for (i, part) in parts.enumerate() {
            let Some(blob) = self.net.trunk.try_part(i) else {
                continue;
            };
            for name in part.names() {
                let (Some(t), Some(piece)) = (ck.get(name), part.piece_of(name)) else {
                    continue;
                };
                let Some(codes) = Codes::for_dtype(t.dtype) else {
                    continue;
                };
                if let Some(at) = sluice_kernels::decode::first_non_finite(codes, blob.piece(piece))
                {
                    return Err(ModelError::Tensor {
                        tensor: name.to_owned(),
                        msg: format!(
                            "{}: element {at} is NaN or infinite",
                            ck.shards()[t.shard].path.display()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Builds a model whose bytes come from `reader` (tests inject faults this way).
    pub fn with_reader(
        cfg: ModelConfig,
        layout: WeightLayout,
        reader: Arc<dyn Reader>,
        io_mode: IoMode,
        opts: ModelOptions,
    ) -> Result<Model, ModelError> {
        let mtp = if opts.mtp {
            if opts.verify.is_some() {
                return Err(ModelError::Mtp(
                    "a pack does not keep the MTP layers; run the checkpoint itself".into(),
                ));
            }
            let run = MtpRun::new(&cfg, &layout)?;
            crate::mtp::check_copies(&layout, reader.as_ref())?;
            Some(run)
        } else {
            None
        };
        // The plan comes first: nothing large is allocated for a budget that cannot work.
        let plan = crate::desc::plan(&cfg, &layout, reader.as_ref(), &opts)?;
        let slots = (plan.expert_cache / plan.expert_bytes.max(1)) as usize;
        let policy = opts.policy.make(slots);
        let store_cfg = ExpertStoreConfig {
            // The whole pool: KV pages are lent out of it as sequences grow.
            capacity: plan.pool,
            policy,
            readers: opts.readers,
            uring: opts.io_uring,
            record_trace: opts.record_trace,
            prefetch_precision: opts.prefetch_precision,
        };
        // The MTP layer's experts are layer `layers` of the store.
        let mut expert_pieces = layout.experts.clone();
        if let (Some(_), Some(m)) = (&mtp, &layout.mtp) {
            expert_pieces.extend(m.experts.first().cloned());
        }
        let experts = Arc::new(ExpertStore::new(
            Arc::clone(&reader),
            expert_pieces,
            store_cfg,
        )?);
        experts.set_floor(plan.expert_floor);
        let embed = if plan.embed.1 {
            Some(Arc::new(read_blob(reader.as_ref(), &layout.embed.pieces)?))
        } else {
            None
        };
        let mut parts: Vec<Vec<Piece>> = layout.layers.iter().map(|p| p.pieces.clone()).collect();
        parts.push(layout.head.pieces.clone());
        let mut pin: Vec<bool> = plan.layers.iter().map(|l| l.1).collect();
        pin.push(true);
        // The MTP layer and its input projection and norms after the head, pinned.
        if let (Some(_), Some(m)) = (&mtp, &layout.mtp) {
            for part in m.layers.first().into_iter().chain(m.heads.first()) {
                parts.push(part.pieces.clone());
                pin.push(true);
            }
        }
        if let Some(v) = &opts.verify {
            // Streamed parts and the embedding table are checked once at load as well as on
            // every read (pinned parts are checked as they are read, just below).
            if let Some(e) = &embed {
                v(cfg.layers + 1, e)?;
            } else {
                v(
                    cfg.layers + 1,
                    &read_blob(reader.as_ref(), &layout.embed.pieces)?,
                )?;
            }
            for (i, _) in plan.layers.iter().enumerate().filter(|(_, l)| !l.1) {
                v(i, &read_blob(reader.as_ref(), &parts[i])?)?;
            }
        }
        let trunk = TrunkStore::new(
            Arc::clone(&reader),
            parts,
            &pin,
            plan.ring_slots,
            opts.verify.clone(),
        )?;
        let exec = Exec::new(opts.kernels, opts.threads)?;
        let mut rope = Rope::new(&cfg.rope);
        if let Some(alpha) = &layout.head_spec.rope_alpha {
            let head = trunk.part(cfg.layers)?;
            rope.learn(&alpha.to_f32(&head));
        }
        let local_rope = cfg.local_rope.as_ref().map(Rope::new);
        // Prefetch is pointless when every expert fits (even beside full-context KV caches,
        // which also keeps the gathered path, and passes run in the pool, from ever waiting
        // for room).
        let prefetch = opts.prefetch && !plan.all_experts_fit();
        let gather_experts = plan.all_experts_fit();
        let in_pool = plan.trunk_resident() && gather_experts;
        let step_score_floats = if plan.pool == u64::MAX {
            crate::attention::PREFILL_TILE_SCORE_FLOATS
        } else {
            plan.step_score_floats
        };
        let net = Net {
            cfg,
            layout,
            exec,
            rope,
            local_rope,
            embed,
            trunk,
            reader,
            embed_bytes_read: AtomicU64::new(0),
            experts,
            prefetch,
            gather_experts,
            chunk: plan.chunk.max(1),
            step_score_floats,
        };
        Ok(Model {
            net,
            plan,
            io_mode,
            io_uring: opts.io_uring,
            in_pool,
            span_bytes: AtomicU64::new(0),
            passes: AtomicUsize::new(0),
            generation: None,
            mtp,
        })
    }

    /// Whether the MTP layer is loaded ([`crate::ModelOptions::mtp`]).
    pub fn has_mtp(&self) -> bool {
        self.mtp.as_ref().is_some()
    }

    /// A fresh state (KV cache) for the MTP layer, when it is loaded.
    pub fn new_mtp_state(&self) -> Option<State> {
        self.mtp.as_ref().map(|r| State::new(&r.state_cfg))
    }

    /// Runs the MTP layer over `t` rows after the positions `state` holds: row `i` is the
    /// model's final-normed hidden state at a position (`hidden`, `[t, hidden]`; for
    /// DeepSeek-V4's layer the streams after the model's last layer, `[t, hc_mult, hidden]`:
    /// [`ModelConfig::mtp_row_width`] floats per row, what [`State::hidden_rows`] keeps) and
    /// the token that follows it (`tokens[i]`), at rotary position `offset + state.pos() + i`
    /// (the MTP state may start after the model's position 0). Appends to the MTP layer's
    /// cache; returns the logits of the last row (the token after `tokens[t − 1]`, as the MTP
    /// layer predicts it) and every row's output, of the same width, as a further step takes
    /// it as its hidden state (normed or not, as the layer's kind wants). On error the state is
    /// as it was.
    pub fn mtp_forward(
        &self,
        state: &mut State,
        offset: usize,
        hidden: &[f32],
        tokens: &[u32],
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let Some(run) = self.mtp.as_ref() else {
            return Err(ModelError::Mtp("the MTP layer is not loaded".into()));
        };
        let cfg = self.net.config();
        let (w, t) = (cfg.mtp_row_width(), tokens.len());
        if t == 0 || hidden.len() != t * w {
            return Err(ModelError::Call {
                call: "mtp_forward",
                msg: format!("{t} tokens and {} hidden floats", hidden.len()),
            });
        }
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= cfg.vocab) {
            return Err(ModelError::Token {
                id: bad,
                vocab: cfg.vocab,
            });
        }
        let pos0 = state.pos();
        self.reserve_kv_per(state, pos0 + t, run.kv_per_position)?;
        let r = self.run_in_pool(|| self.net.mtp_inner(run, state, offset, hidden, tokens));
        if r.is_err() {
            state.rollback(pos0);
        }
        r
    }

    /// The memory plan in force.
    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// Positions one sequence may hold: the planned context, or fewer when the budget's pool
    /// cannot hold that much KV cache beside the expert cache's floor.
    pub fn max_positions(&self) -> usize {
        self.plan.context_fit
    }

    /// Charges `state`'s KV cache for `positions` positions, in pages of [`KV_PAGE`] positions
    /// taken from the expert cache (which evicts by its policy to give them up), and gives
    /// its buffers exactly that room. Nothing to do past the context: the pass refuses it.
    fn reserve_kv(&self, state: &mut State, positions: usize) -> Result<(), ModelError> {
        self.reserve_kv_per(state, positions, self.plan.kv_per_position)
    }

    /// [`Model::reserve_kv`] for a state of `per` bytes a position (the MTP layer's).
    pub(crate) fn reserve_kv_per(
        &self,
        state: &mut State,
        positions: usize,
        per: u64,
    ) -> Result<(), ModelError> {
        if positions <= state.kv.positions || positions > self.plan.context || per == 0 {
            return Ok(());
        }
        let paged = positions.div_ceil(KV_PAGE) * KV_PAGE;
        let lease = state
            .kv
            .lease
            .get_or_insert_with(|| self.net.experts.lease());
        let mut got = paged.min(self.plan.context);
        if lease.grow_to(got as u64 * per).is_err() {
            // Without the rest of the page, if that much still fits.
            got = positions;
            lease
                .grow_to(got as u64 * per)
                .map_err(|_| ModelError::KvFull {
                    positions,
                    held: (lease.bytes() / per) as usize,
                })?;
        }
        state.reserve_positions(got);
        Ok(())
    }

    /// Charges a state made outside a forward pass (a copy from the prefix cache, a loaded
    /// session) for the positions it holds, as a pass would: KV pages lent by the expert cache.
    /// Fails with [`ModelError::KvFull`] when the pool cannot give them up.
    pub fn charge(&self, state: &mut State) -> Result<(), ModelError> {
        self.reserve_kv(state, state.pos())
    }

    /// How shards are read.
    pub fn io_mode(&self) -> IoMode {
        self.io_mode
    }

    /// How expert reads are issued, as stats report it: `io_uring` where they are queued on
    /// one (O_DIRECT shards with [`ModelOptions::io_uring`]), else the mode's name (`direct`
    /// or `buffered`: reader threads).
    pub fn io_name(&self) -> &'static str {
        if self.io_uring && self.io_mode == IoMode::Direct {
            "io_uring"
        } else {
            self.io_mode.name()
        }
    }

    /// Whether lookahead prefetch runs.
    pub fn prefetch(&self) -> bool {
        self.net.prefetch
    }

    /// `generation_config.json`, parsed, when the model has one (read once, with the
    /// checkpoint).
    pub fn generation_config(&self) -> Option<&serde_json::Value> {
        self.generation.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.net.cfg
    }

    /// Where the weights are.
    pub fn layout(&self) -> &WeightLayout {
        &self.net.layout
    }

    /// The instruction set of the kernels in use.
    pub fn isa(&self) -> sluice_kernels::Isa {
        self.net.exec.kernels().isa()
    }

    /// The numeric mode of products with quantized weights.
    pub fn numerics(&self) -> sluice_kernels::Numerics {
        self.net.exec.kernels().numerics()
    }

    /// Compute threads.
    pub fn threads(&self) -> usize {
        self.net.exec.threads()
    }

    /// The expert store.
    pub fn experts(&self) -> &Arc<ExpertStore> {
        &self.net.experts
    }

    /// The trunk store.
    pub fn trunk(&self) -> &TrunkStore {
        &self.net.trunk
    }

    /// Bytes of trunk read from disk after loading (streamed layers and embedding rows).
    pub fn trunk_bytes_read(&self) -> u64 {
        self.net.trunk.stats().bytes_read + self.net.embed_bytes_read.load(Ordering::Relaxed)
    }

    /// A fresh sequence state.
    pub fn new_state(&self) -> State {
        State::new(&self.net.cfg)
    }

    /// Runs `tokens` through the model after the positions already in `state`, appending to its
    /// cache. Returns the logits asked for, `[rows, vocab]` row-major. On error the state is left
    /// as it was before the call.
    ///
    /// The pass is layer-major over all of `tokens` (each layer's experts are read once for
    /// all of them) and its activations grow with their number: for a prompt, [`Model::prefill`]
    /// picks spans that fit the memory plan.
    pub fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let mut opts = PassOpts {
            chunk: self.plan.chunk,
            new_step: true,
            on_layer: None,
            score_floats: self.net.step_score_floats,
        };
        self.forward_segments(
            &mut [(state, tokens)],
            want,
            &mut opts,
            &mut PassTimes::default(),
        )
    }

    /// Runs a prompt through the model after the positions already in `state`: in spans as
    /// long as the memory plan allows ([`MemoryPlan::prefill_span`], shorter when the pool has
    /// less room at the time), each layer over a whole span at a time, so that every expert a
    /// span's tokens route to in a layer is read once for all of them. The activations of a
    /// span beyond the plan's scratch are lent by the expert cache for the pass, like KV pages.
    /// `want` applies to the whole prompt: [`Logits::Last`] gives the last token's row,
    /// [`Logits::All`] every row (spans are then at most the plan's chunk, whose scratch holds
    /// their logits).
    ///
    /// `on` hears of each layer run over a span and of each span done (after which the state
    /// holds its tokens). The whole prompt is one step of the expert store's figures, so its
    /// `touched_bytes` are those of the distinct experts the prompt routed to. On error the
    /// state holds the spans done before it (reported by `on`), as it was after the last.
    ///
    /// `opts` can make the calls inside a layer shorter than the plan's chunk and cap the
    /// spans. Output bits are those of [`Model::forward`] over any split of the prompt.
    pub fn prefill(
        &self,
        state: &mut State,
        tokens: &[u32],
        want: Logits,
        opts: PrefillOptions,
        on: &mut (dyn FnMut(&PrefillEvent) + Send),
    ) -> Result<Prefilled, ModelError> {
        self.net.experts.begin_step();
        let chunk = match self.plan.pool {
            u64::MAX => opts.chunk.max(1),
            _ => opts.chunk.clamp(1, self.plan.chunk.max(1)),
        };
        let mut out = Prefilled::default();
        let mut done = 0;
        while done < tokens.len() {
            let rest = (tokens.len() - done).min(opts.max_span.max(1));
            let (span, lease, score_floats) = self.span_for(state, rest, want)?;
            let part = &tokens[done..done + span];
            let last = done + span == tokens.len();
            let w = match want {
                Logits::Last if !last => Logits::None,
                w => w,
            };
            let layers = self.net.cfg.layers;
            let mut on_layer = |layer: usize| {
                on(&PrefillEvent::Layer {
                    done,
                    span,
                    layer,
                    layers,
                })
            };
            let mut opts = PassOpts {
                chunk,
                new_step: false,
                on_layer: Some(&mut on_layer),
                score_floats,
            };
            let logits =
                self.forward_segments(&mut [(&mut *state, part)], w, &mut opts, &mut out.times)?;
            drop(lease);
            out.logits.extend(logits);
            out.spans.push(span);
            done += span;
            on(&PrefillEvent::Span { tokens: span });
        }
        Ok(out)
    }

    /// The attention tiles' room: the prefill's when a pass has it, else the planned
    /// scratch's (never more than the prefill's).
    fn score_floats(&self, wide: bool) -> usize {
        if wide {
            crate::attention::PREFILL_TILE_SCORE_FLOATS
        } else {
            self.plan.step_score_floats
        }
    }

    /// The next prefill span for `rest` tokens, what it holds of the pool while it runs, and
    /// the floats of attention scores its tiles may hold.
    fn span_for(
        &self,
        state: &mut State,
        rest: usize,
        want: Logits,
    ) -> Result<(usize, Option<SpanLease<'_>>, usize), ModelError> {
        // The plan's scratch holds the activations of this many rows, and a decode step's
        // tiles; a span that can also have the larger tiles' room takes it.
        let chunk = self.plan.chunk.max(1);
        let narrow = self.score_floats(false);
        let tiles = ((self.score_floats(true) - narrow) * 4) as u64;
        let mut span = rest.min(self.plan.prefill_span.max(chunk));
        if want == Logits::All {
            span = span.min(chunk);
        }
        if self.plan.pool == u64::MAX {
            return Ok((span, None, self.net.step_score_floats));
        }
        if span <= chunk {
            return Ok((span, None, narrow));
        }
        let per = self.plan.span_bytes_per_token.max(1);
        if self.in_pool {
            // Passes run in the compute pool and must never wait for room: only what is spare
            // beside every expert and full-context KV caches, shared by concurrent prefills.
            let spare = self
                .plan
                .pool
                .saturating_sub(self.plan.kv_cache)
                .saturating_sub(self.plan.all_expert_bytes);
            let mut used = self.span_bytes.load(Ordering::Relaxed);
            loop {
                let free = spare.saturating_sub(used);
                let n = span.min(chunk + usize::try_from(free / per).unwrap_or(usize::MAX));
                if n <= chunk {
                    return Ok((chunk.min(rest), None, narrow));
                }
                let mut bytes = (n - chunk) as u64 * per;
                let wide = free >= bytes + tiles;
                if wide {
                    bytes += tiles;
                }
                match self.span_bytes.compare_exchange(
                    used,
                    used + bytes,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let lease = SpanLease::Spare {
                            counter: &self.span_bytes,
                            bytes,
                        };
                        return Ok((n, Some(lease), self.score_floats(wide)));
                    }
                    Err(now) => used = now,
                }
            }
        }
        // The span's own KV pages first (the prompt needs them whatever the span), then its
        // activations from what the cache can give up above its floor.
        if state.pos + span <= self.max_positions() {
            self.reserve_kv(state, state.pos + span)?;
        }
        let mut lease = self.net.experts.lease();
        let free = self
            .net
            .experts
            .capacity()
            .saturating_sub(self.net.experts.floor());
        span = span.min(chunk + usize::try_from(free / per).unwrap_or(usize::MAX));
        while span > chunk {
            let bytes = (span - chunk) as u64 * per;
            if lease.grow_to(bytes).is_ok() {
                let wide = lease.grow_to(bytes + tiles).is_ok();
                return Ok((span, Some(SpanLease::Pool(lease)), self.score_floats(wide)));
            }
            // Another session took room meanwhile.
            span = (span / 2).max(chunk);
        }
        Ok((span.min(rest), None, narrow))
    }

    /// One decoding step for several sequences at once (batched decoding): `tokens[i]` is fed
    /// to `states[i]`. Returns `[states.len(), vocab]` logits, row `i` for sequence `i`.
    ///
    /// Every layer's routed experts are fetched once for the union of what the rows chose and
    /// each expert runs over the rows that chose it; dense projections, shared experts and the
    /// head run over all rows in one call; attention runs per sequence against its own cache.
    /// Each row is bit-identical to feeding its token alone with [`Model::forward`]. On error
    /// every state is left as it was before the call.
    pub fn forward_batch(
        &self,
        states: &mut [&mut State],
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        if states.len() != tokens.len() {
            return Err(ModelError::Call {
                call: "forward_batch",
                msg: format!("{} states for {} tokens", states.len(), tokens.len()),
            });
        }
        if states.len() > self.plan.sequences {
            return Err(ModelError::Sequences {
                asked: states.len(),
                planned: self.plan.sequences,
            });
        }
        let mut segs: Vec<(&mut State, &[u32])> = states
            .iter_mut()
            .zip(tokens)
            .map(|(s, t)| (&mut **s, std::slice::from_ref(t)))
            .collect();
        let mut opts = PassOpts {
            chunk: self.plan.chunk,
            new_step: true,
            on_layer: None,
            score_floats: self.net.step_score_floats,
        };
        self.forward_segments(
            &mut segs,
            Logits::Last,
            &mut opts,
            &mut PassTimes::default(),
        )
    }

    /// [`Model::forward_batch`] with any number of tokens per sequence (a sequence checking a
    /// draft runs its chosen token and the draft): one pass, each layer's experts fetched once
    /// for the union of every row of every sequence. Returns every row, `[Σ tokens, vocab]`,
    /// sequence after sequence. Each row is bit-identical to feeding its sequence's tokens
    /// alone. On error every state is left as it was before the call.
    pub fn forward_batch_rows(
        &self,
        segs: &mut [(&mut State, &[u32])],
    ) -> Result<Vec<f32>, ModelError> {
        if segs.len() > self.plan.sequences {
            return Err(ModelError::Sequences {
                asked: segs.len(),
                planned: self.plan.sequences,
            });
        }
        let mut opts = PassOpts {
            chunk: self.plan.chunk,
            new_step: true,
            on_layer: None,
            score_floats: self.net.step_score_floats,
        };
        self.forward_segments(segs, Logits::All, &mut opts, &mut PassTimes::default())
    }

    /// Runs each segment's tokens after its state's positions; on error every state goes back
    /// to where it was.
    fn forward_segments(
        &self,
        segs: &mut [(&mut State, &[u32])],
        want: Logits,
        opts: &mut PassOpts<'_>,
        times: &mut PassTimes,
    ) -> Result<Vec<f32>, ModelError> {
        let before: Vec<(usize, Option<usize>)> = segs
            .iter()
            .map(|(s, _)| (s.pos, s.routes.as_ref().map(Vec::len)))
            .collect();
        for (state, toks) in segs.iter_mut() {
            let positions = state.pos + toks.len();
            if positions > self.max_positions() {
                return Err(ModelError::ContextFull {
                    positions,
                    max: self.max_positions(),
                });
            }
            self.reserve_kv(state, positions)?;
        }
        // The whole pass runs on one of the compute threads, so the products inside it split
        // their rows with the other threads directly instead of each one waking the pool from
        // outside and waiting for it (hundreds of times per decoded token; on the 2-vCPU VM of
        // docs/PERFORMANCE.md those wake-ups cost a 50%-budget decode a quarter of its CPU
        // time), when nothing can nest another session's pass under it:
        // - with everything resident: a pass never waits for another session, and with every
        //   expert fitting the experts are gathered (see `ffn::schedule`), so a pass has landed every
        //   read it started before it enters a parallel call;
        // - or when no other pass is running as it starts. Otherwise a pass that can wait for
        //   another session (pins of a full expert cache, trunk ring slots) runs from outside
        //   the pool: a pool thread waiting inside a product may pick up another session's
        //   pass sent to the pool, which would then wait on pins held below it on the same
        //   thread. Passes that start beside one in the pool run from outside and send the pool
        //   only products, which wait for nothing.
        // A pass that starts alone also keeps the pool's other threads awake while it runs
        // (`Exec::install_awake`), so its products never wait for a thread to wake up.
        let times0 = *times;
        let r = self.run_in_pool(|| self.net.forward_inner(segs, want, opts, times));
        // Each sequence is charged its share of the pass, as a batch's decode seconds are.
        let share = (*times - times0).scaled(1.0 / segs.len().max(1) as f64);
        for (state, _) in segs.iter_mut() {
            state.times += share;
        }
        if r.is_err() {
            for ((state, _), (pos0, routes0)) in segs.iter_mut().zip(before) {
                state.rollback(pos0);
                if let (Some(r), Some(n)) = (state.routes.as_mut(), routes0) {
                    r.truncate(n);
                }
            }
        }
        r
    }

    /// Runs a pass `f` where the comment in `forward_segments` says: inside the compute pool
    /// (keeping its threads awake) when it starts alone or everything is resident, else
    /// from outside.
    pub(crate) fn run_in_pool<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let alone = self.passes.fetch_add(1, Ordering::AcqRel) == 0;
        let running = Running(&self.passes);
        let r = if alone {
            self.net.exec.install_awake(f)
        } else if self.in_pool {
            self.net.exec.install(f)
        } else {
            f()
        };
        drop(running);
        r
    }
}

/// Counts a forward pass as running until dropped (also when the pass unwinds).
struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
