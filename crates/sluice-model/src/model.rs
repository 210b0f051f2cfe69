//! The model: weights, the forward pass over a chunk of tokens, logits.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use sluice_format::Checkpoint;
use sluice_kernels::Codes;
use sluice_store::{
    Blob, ExpertStore, ExpertStoreConfig, IoMode, Piece, Reader, TrunkStore, read_blob,
};

use crate::ModelError;
use crate::config::ModelConfig;
use crate::desc::Description;
use crate::exec::Exec;
use crate::plan::MemoryPlan;
use crate::rope::Rope;
use crate::state::State;
use crate::weights::{FfnSpec, MoeSpec, WeightLayout};

pub use crate::options::{Logits, ModelOptions, PrefillEvent, PrefillOptions, pack_verifier};
pub use crate::plan::KV_PAGE;

pub use sluice_store::policy::{PolicyChoice, PolicyFactory};

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
    cfg: ModelConfig,
    layout: WeightLayout,
    exec: Exec,
    rope: Rope,
    /// The second rotary table ([`ModelConfig::local_rope`]).
    local_rope: Option<Rope>,
    /// The embedding table when pinned; otherwise rows are read per token.
    embed: Option<Arc<Blob>>,
    /// Parts 0..layers are the layers, part `layers` the head.
    trunk: TrunkStore,
    reader: Arc<dyn Reader>,
    embed_bytes_read: AtomicU64,
    experts: Arc<ExpertStore>,
    plan: MemoryPlan,
    prefetch: bool,
    io_mode: IoMode,
    /// Expert reads of O_DIRECT shards go through an io_uring.
    io_uring: bool,
    /// Every expert fits in the cache: a layer's experts are taken as a group and computed
    /// together (see `ffn::schedule`).
    gather_experts: bool,
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
    mtp: Option<crate::mtp::MtpRun>,
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
            .layout
            .layers
            .iter()
            .chain(std::iter::once(&self.layout.head));
        for (i, part) in parts.enumerate() {
            let Some(blob) = self.trunk.try_part(i) else {
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
            let run = crate::mtp::MtpRun::new(&cfg, &layout)?;
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
        Ok(Model {
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
            plan,
            prefetch,
            io_mode,
            io_uring: opts.io_uring,
            gather_experts,
            in_pool,
            span_bytes: AtomicU64::new(0),
            passes: AtomicUsize::new(0),
            generation: None,
            mtp,
        })
    }

    /// The MTP layer's run, when loaded.
    pub(crate) fn mtp_run(&self) -> Option<&crate::mtp::MtpRun> {
        self.mtp.as_ref()
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
        let lease = state.kv.lease.get_or_insert_with(|| self.experts.lease());
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
        self.prefetch
    }

    /// `generation_config.json`, parsed, when the model has one (read once, with the
    /// checkpoint).
    pub fn generation_config(&self) -> Option<&serde_json::Value> {
        self.generation.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Where the weights are.
    pub fn layout(&self) -> &WeightLayout {
        &self.layout
    }

    /// Kernels and threads.
    pub(crate) fn exec(&self) -> &Exec {
        &self.exec
    }

    /// The rotary table.
    pub(crate) fn rope(&self) -> &Rope {
        &self.rope
    }

    pub(crate) fn local_rope(&self) -> Option<&Rope> {
        self.local_rope.as_ref()
    }

    /// Whether a layer's experts are taken as a group (every expert fits; see `ffn::schedule`).
    pub(crate) fn gathers_experts(&self) -> bool {
        self.gather_experts
    }

    /// The instruction set of the kernels in use.
    pub fn isa(&self) -> sluice_kernels::Isa {
        self.exec.kernels().isa()
    }

    /// Compute threads.
    pub fn threads(&self) -> usize {
        self.exec.threads()
    }

    /// The expert store.
    pub fn experts(&self) -> &Arc<ExpertStore> {
        &self.experts
    }

    /// The trunk store.
    pub fn trunk(&self) -> &TrunkStore {
        &self.trunk
    }

    /// Bytes of trunk read from disk after loading (streamed layers and embedding rows).
    pub fn trunk_bytes_read(&self) -> u64 {
        self.trunk.stats().bytes_read + self.embed_bytes_read.load(Ordering::Relaxed)
    }

    /// The embeddings of `tokens`, `[t, hidden]`: from the pinned table, or read row by row.
    pub(crate) fn embed_rows(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let spec = &self.layout.embed_spec;
        let h = self.cfg.hidden;
        let mut hs = vec![0f32; tokens.len() * h];
        let decode = |row: &[u8], out: &mut [f32]| {
            out.copy_from_slice(&sluice_kernels::decode::decode_vec(spec.codes, row, h));
        };
        match &self.embed {
            Some(b) => {
                let m = spec.view(b)?;
                for (i, &id) in tokens.iter().enumerate() {
                    decode(m.row(id as usize), &mut hs[i * h..(i + 1) * h]);
                }
            }
            None => {
                let base = self.layout.embed.pieces[0];
                // Checked when the layout was made.
                let rb = spec.codes.row_bytes(spec.cols).unwrap_or(0) as u64;
                let pieces: Vec<Piece> = tokens
                    .iter()
                    .map(|&id| Piece {
                        shard: base.shard,
                        offset: base.offset + id as u64 * rb,
                        len: rb,
                    })
                    .collect();
                let blob = read_blob(self.reader.as_ref(), &pieces)?;
                self.embed_bytes_read
                    .fetch_add(blob.footprint() as u64, Ordering::Relaxed);
                for i in 0..tokens.len() {
                    decode(blob.piece(i), &mut hs[i * h..(i + 1) * h]);
                }
            }
        }
        Ok(hs)
    }

    /// A fresh sequence state.
    pub fn new_state(&self) -> State {
        State::new(&self.cfg)
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
            score_floats: self.step_score_floats(),
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
        self.experts.begin_step();
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
            let layers = self.cfg.layers;
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

    /// The attention tiles' room in a decode step or a draft's check: the planned scratch's
    /// under a budget (room for tiles of several heads at the full context), the prefill's
    /// without one (nothing to plan for).
    pub(crate) fn step_score_floats(&self) -> usize {
        self.score_floats(self.plan.pool == u64::MAX)
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
            return Ok((span, None, self.step_score_floats()));
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
        let mut lease = self.experts.lease();
        let free = self.experts.capacity().saturating_sub(self.experts.floor());
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
            return Err(ModelError::Internal(format!(
                "forward_batch: {} states for {} tokens",
                states.len(),
                tokens.len()
            )));
        }
        if states.len() > self.plan.sequences {
            return Err(ModelError::Internal(format!(
                "forward_batch: {} sequences, but the memory plan is for {} (ModelOptions::sequences)",
                states.len(),
                self.plan.sequences
            )));
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
            score_floats: self.step_score_floats(),
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
            return Err(ModelError::Internal(format!(
                "forward_batch_rows: {} sequences, but the memory plan is for {} (ModelOptions::sequences)",
                segs.len(),
                self.plan.sequences
            )));
        }
        let mut opts = PassOpts {
            chunk: self.plan.chunk,
            new_step: true,
            on_layer: None,
            score_floats: self.step_score_floats(),
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
        let r = self.run_in_pool(|| self.forward_inner(segs, want, opts, times));
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
            self.exec.install_awake(f)
        } else if self.in_pool {
            self.exec.install(f)
        } else {
            f()
        };
        drop(running);
        r
    }

    /// Lookahead: the experts layer `l`'s router would pick from the current residual stream
    /// (`[t, hidden]`), most confident (largest routing weight, summed over rows) first, as a
    /// hint for prefetch. `None` when `l` has no routed experts.
    pub(crate) fn predict(
        &self,
        l: usize,
        hs: &[f32],
        tokens: &[u32],
    ) -> Result<Option<(usize, Vec<u32>)>, ModelError> {
        if l >= self.cfg.layers || !self.cfg.is_moe(l) {
            return Ok(None);
        }
        // Only when the layer is in memory already: never wait on (or hold) a ring slot here.
        let Some(part) = self.trunk.try_part(l) else {
            return Ok(None);
        };
        let blob: &Blob = &part;
        let spec = &self.layout.layer_specs[l];
        let FfnSpec::Moe(MoeSpec {
            router, bias, hash, ..
        }) = &spec.ffn
        else {
            return Ok(None);
        };
        // A hash-routed layer's experts are known from the tokens: exactly those.
        if let Some(table) = hash {
            let mut ids: Vec<u32> = Vec::new();
            for &tok in tokens {
                ids.extend(table.row(blob, tok as usize, self.cfg.moe.experts)?);
            }
            ids.sort_unstable();
            ids.dedup();
            return Ok(Some((l, ids)));
        }
        let h = self.cfg.hidden;
        let w = spec.post_norm.to_f32(blob);
        let mut xn = vec![0f32; hs.len()];
        for (x, o) in hs.chunks_exact(h).zip(xn.chunks_exact_mut(h)) {
            self.exec.kernels().rmsnorm(x, &w, self.cfg.eps, o);
        }
        let ne = self.cfg.moe.router_width();
        let mut logits = vec![0f32; (hs.len() / h) * ne];
        self.exec.matmul(&router.view(blob)?, &xn, &mut logits);
        let bias = bias.map(|b| b.to_f32(blob));
        let mut score: BTreeMap<u32, f32> = BTreeMap::new();
        for lg in logits.chunks_exact_mut(ne) {
            for (e, w) in crate::ffn::route(&self.cfg, lg, bias.as_deref()) {
                // Zero-compute experts have nothing to read.
                if (e as usize) < self.cfg.moe.experts {
                    *score.entry(e).or_default() += w;
                }
            }
        }
        let mut ranked: Vec<(u32, f32)> = score.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(Some((l, ranked.into_iter().map(|p| p.0).collect())))
    }
}

/// Counts a forward pass as running until dropped (also when the pass unwinds).
struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
