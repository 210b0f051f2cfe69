//! Batched decoding: several sequences step together, so each expert read from disk serves every
//! sequence that routed to it. Sequences join and leave the batch as they start and finish
//! (continuous batching). Each sequence's output is bit-identical to running it alone: the
//! kernels compute a row the same way however many rows share a call.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Deserialize;
use sluice_model::State;

use crate::Error;
use crate::draft::{Held, Speculation};
use crate::engine::{Engine, Prompt};
use crate::generate::{self, Step, Token};
use crate::options::{FinishReason, GenerateOptions};
use crate::stats::GenerationStats;
use sluice_text::Message;

/// A prompt owned by a job.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub enum OwnedPrompt {
    /// Raw text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
    /// Chat messages, rendered with the model's chat template.
    Chat(Vec<Message>),
}

impl OwnedPrompt {
    pub(crate) fn as_prompt(&self) -> Prompt<'_> {
        match self {
            OwnedPrompt::Text(t) => Prompt::Text(t),
            OwnedPrompt::Ids(i) => Prompt::Ids(i),
            OwnedPrompt::Chat(m) => Prompt::Chat(m),
        }
    }
}

/// A finished sequence.
#[derive(Clone, Debug)]
pub struct Finished {
    /// The prompt's ids.
    pub prompt_ids: Vec<u32>,
    /// Generated ids.
    pub ids: Vec<u32>,
    /// Generated text.
    pub text: String,
    /// Why it ended.
    pub finish: FinishReason,
    /// Figures (expert counters are the engine's over the sequence's span, shared with the
    /// sequences decoding beside it).
    pub stats: GenerationStats,
}

/// What a job reports, in order: tokens, then `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// A generated token and the text it completes.
    Token(Token),
    /// The sequence finished (boxed: its stats make it ten times a token's size).
    Done(Box<Finished>),
    /// The sequence failed; nothing follows.
    Failed(Error),
}

/// Receives a job's events; returning `false` cancels the job (the client went away).
pub type Sink = Box<dyn FnMut(Event) -> bool + Send>;

struct Job {
    ids: Vec<u32>,
    opts: GenerateOptions,
    sink: Sink,
}

struct Seq {
    job: Job,
    state: State,
    history: Vec<u32>,
    /// The sequence's generation, stepped by the shared loop.
    g: generate::Seq,
    logits: Vec<f32>,
    /// Speculative decoding's drafts between passes, and what the state holds beyond the
    /// chosen tokens.
    spec: Speculation,
    held: Held,
    /// A failure was reported or the client left: no `Done` follows.
    ended: bool,
}

/// Counters shared between a batcher and its worker.
#[derive(Default)]
struct Counters {
    /// Sequences being decoded now.
    active: AtomicUsize,
    /// Jobs queued and not yet started.
    queued: AtomicUsize,
    /// Sequences that finished normally.
    finished: AtomicU64,
    /// Sequences whose sink gave up (the client went away).
    cancelled: AtomicU64,
    /// Sequences that failed.
    failed: AtomicU64,
    /// Jobs refused at submission (bad options, a prompt that does not fit, ids outside the
    /// vocabulary).
    rejected: AtomicU64,
}

/// A batcher's counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BatcherStats {
    /// Sequences being decoded now.
    pub active: usize,
    /// Jobs waiting for a slot.
    pub queued: usize,
    /// Sequences that finished normally.
    pub finished: u64,
    /// Sequences dropped because their receiver went away.
    pub cancelled: u64,
    /// Sequences that ended with an error.
    pub failed: u64,
    /// Jobs refused when submitted: bad options, a prompt that does not fit the context, token
    /// ids outside the vocabulary. They never ran, so they are not `failed`.
    pub rejected: u64,
}

/// Runs jobs on an engine in batches of up to `max_batch` sequences, on a thread of its own.
pub struct Batcher {
    /// The sequences of the memory plan this batcher decodes, held for its life.
    _claim: crate::engine::SlotClaim,
    engine: Engine,
    tx: Mutex<Option<Sender<Job>>>,
    worker: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    max_batch: usize,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Batcher(max {}, {} active)",
            self.max_batch,
            self.active()
        )
    }
}

impl Batcher {
    /// A batcher over `engine` stepping at most `max_batch` sequences together. The engine's
    /// memory plan must cover that many sequences ([`crate::EngineBuilder::sequences`]), so
    /// their KV caches stay inside the budget.
    pub fn new(engine: Engine, max_batch: usize) -> Result<Batcher, Error> {
        let planned = engine.plan().sequences;
        if max_batch == 0 || max_batch > planned {
            return Err(Error::Usage(format!(
                "a batch of {max_batch} sequences needs an engine planned for {max_batch} (EngineBuilder::sequences); this one is planned for {planned}"
            )));
        }
        let claim = engine.claim(max_batch)?;
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let e = engine.clone();
        let c = Arc::clone(&counters);
        let max = max_batch;
        let worker = std::thread::Builder::new()
            .name("sluice-batcher".into())
            .spawn(move || run(&e, &rx, max, &c))
            .map_err(|source| Error::Thread {
                name: "sluice-batcher",
                source,
            })?;
        Ok(Batcher {
            _claim: claim,
            engine,
            tx: Mutex::new(Some(tx)),
            worker: Some(worker),
            counters,
            max_batch: max,
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Sequences being decoded now.
    pub fn active(&self) -> usize {
        self.counters.active.load(Ordering::Relaxed)
    }

    /// The counters: sequences active, queued, finished, cancelled and failed.
    pub fn stats(&self) -> BatcherStats {
        let c = &self.counters;
        BatcherStats {
            active: c.active.load(Ordering::Relaxed),
            queued: c.queued.load(Ordering::Relaxed),
            finished: c.finished.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
        }
    }

    /// The largest batch.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Queues a job. The prompt is encoded and the options checked here, so mistakes come back
    /// at once (input errors, [`Error::is_input_error`], counted as `rejected`; a stopped
    /// batcher gives [`Error::BatcherStopped`]); everything after arrives through `sink`.
    pub fn submit(
        &self,
        prompt: &OwnedPrompt,
        opts: GenerateOptions,
        sink: Sink,
    ) -> Result<(), Error> {
        let r = self.submit_checked(prompt, opts, sink);
        if let Err(e) = &r
            && e.is_input_error()
        {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn submit_checked(
        &self,
        prompt: &OwnedPrompt,
        opts: GenerateOptions,
        sink: Sink,
    ) -> Result<(), Error> {
        generate::check_options(&opts)?;
        let mut opts = opts;
        let ids = self.engine.encode(&prompt.as_prompt())?;
        if opts.cache_prefix.is_none()
            && let OwnedPrompt::Chat(m) = prompt
        {
            opts.cache_prefix = self.engine.chat_system_end(m, &ids);
        }
        if ids.is_empty() {
            return Err(Error::Usage("empty prompt".into()));
        }
        let vocab = self.engine.model().config().vocab;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::Usage(format!(
                "token id {id} is outside the vocabulary of {vocab}"
            )));
        }
        let context = self.engine.model().max_positions();
        if ids.len() + opts.max_tokens > context {
            return Err(Error::Usage(format!(
                "prompt of {} tokens plus max_tokens {} exceeds the context of {context}",
                ids.len(),
                opts.max_tokens
            )));
        }
        let tx = self.tx.lock().map_err(|_| Error::BatcherStopped)?;
        let tx = tx.as_ref().ok_or(Error::BatcherStopped)?;
        self.counters.queued.fetch_add(1, Ordering::Relaxed);
        tx.send(Job { ids, opts, sink }).map_err(|_| {
            self.counters.queued.fetch_sub(1, Ordering::Relaxed);
            Error::BatcherStopped
        })
    }

    /// Runs a job to the end on the calling thread's behalf, collecting its result.
    pub fn generate(&self, prompt: &OwnedPrompt, opts: GenerateOptions) -> Result<Finished, Error> {
        let (tx, rx) = mpsc::channel();
        self.submit(
            prompt,
            opts,
            Box::new(move |e| {
                let _ = tx.send(e);
                true
            }),
        )?;
        for e in rx {
            match e {
                Event::Token(_) => {}
                Event::Done(f) => return Ok(*f),
                Event::Failed(e) => return Err(e),
            }
        }
        // The worker dropped the job without a word: it stopped.
        Err(Error::BatcherStopped)
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn run(engine: &Engine, rx: &Receiver<Job>, max: usize, c: &Counters) {
    let model = engine.model();
    let mut active: Vec<Seq> = Vec::new();
    let mut closed = false;
    loop {
        // Admit new sequences while there is room; block only when idle.
        while active.len() < max && !closed {
            let job = if active.is_empty() {
                match rx.recv() {
                    Ok(j) => j,
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
            } else {
                match rx.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            };
            c.queued.fetch_sub(1, Ordering::Relaxed);
            match start(engine, job) {
                Some(s) => active.push(s),
                None => {
                    c.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if active.is_empty() {
            if closed {
                return;
            }
            continue;
        }
        c.active.store(active.len(), Ordering::Relaxed);

        // One step: every sequence picks its token; the ones that go on are fed together.
        let mut feed: Vec<usize> = Vec::new();
        let mut done: Vec<usize> = Vec::new();
        for (i, s) in active.iter_mut().enumerate() {
            // Positions of chosen tokens (the state may hold a draft beyond them).
            let pos = s.history.len();
            let stepped = s.g.step(engine, &mut s.logits, &mut s.history, pos);
            let goes_on = matches!(stepped, Ok(Step::Token { feed: true, .. }));
            if !goes_on {
                s.spec.drop(&mut s.g, &mut s.held, &mut s.state, model);
            }
            match stepped {
                Err(e) => {
                    (s.job.sink)(Event::Failed(e));
                    s.ended = true;
                    c.failed.fetch_add(1, Ordering::Relaxed);
                    done.push(i);
                }
                Ok(Step::End(tail)) => {
                    if let Some(t) = tail
                        && !(s.job.sink)(Event::Token(t))
                    {
                        s.ended = true;
                        c.cancelled.fetch_add(1, Ordering::Relaxed);
                    }
                    done.push(i);
                }
                Ok(Step::Token { token, feed: more }) => {
                    if !(s.job.sink)(Event::Token(token)) {
                        // The client went away: drop the sequence, free its slot.
                        s.ended = true;
                        c.cancelled.fetch_add(1, Ordering::Relaxed);
                        done.push(i);
                        continue;
                    }
                    if more {
                        let id = s.history.last().copied().unwrap_or(0);
                        match s
                            .spec
                            .chosen(id, &mut s.g, &mut s.held, &mut s.state, model)
                        {
                            // The draft was right: the next logits are at hand.
                            Some(next) => s.logits = next,
                            None => feed.push(i),
                        }
                    } else {
                        // Finished at this token, or at max_tokens: end now (a session ends
                        // at its next step; the same tail either way).
                        if let Some(t) = s.g.end(engine, FinishReason::Length) {
                            (s.job.sink)(Event::Token(t));
                        }
                        done.push(i);
                    }
                }
            }
        }
        // Feed the chosen tokens (and drafts) together: one pass, each layer's experts fetched
        // once for the union of the rows' choices.
        let t0 = Instant::now();
        let (results, extra, pass_secs) =
            feed_step(model, engine.prefill_chunk(), &mut active, &feed);
        let secs = t0.elapsed().as_secs_f64();
        let per = secs / feed.len().max(1) as f64;
        for (i, r) in results {
            let s = &mut active[i];
            s.g.add_decode_seconds(per);
            // (The drafter weighs the pass alone: making drafts is timed apart.)
            s.spec.timed(extra, pass_secs);
            match r {
                Ok(l) => s.logits = l,
                Err(e) => {
                    (s.job.sink)(Event::Failed(e));
                    s.ended = true;
                    c.failed.fetch_add(1, Ordering::Relaxed);
                    done.push(i);
                }
            }
        }
        // Retire finished sequences (report those that ended normally).
        done.sort_unstable();
        done.dedup();
        for &i in done.iter().rev() {
            let mut s = active.swap_remove(i);
            if s.ended {
                continue;
            }
            c.finished.fetch_add(1, Ordering::Relaxed);
            engine.prefix().store_finished(model, &s.history, &s.state);
            let stats = s.g.stats(engine, &s.state);
            let f = Finished {
                prompt_ids: s.job.ids.clone(),
                ids: std::mem::take(&mut s.g.d.ids),
                text: std::mem::take(&mut s.g.d.text),
                finish: s.g.d.finish.unwrap_or(FinishReason::Length),
                stats,
            };
            (s.job.sink)(Event::Done(Box::new(f)));
        }
        c.active.store(active.len(), Ordering::Relaxed);
    }
}

/// A fed sequence's index into the batch and its next logits.
type Fed = (usize, Result<Vec<f32>, Error>);

/// Feeds each sequence in `feed` (ascending indices into `active`) its pass's tokens — the
/// chosen tokens its state lacks and its draft ([`Speculation::segment`]) — in one batched
/// pass, and returns each sequence's next logits, the rows beyond one per sequence and the
/// pass's seconds (making the drafts not included). If the
/// pass fails (every state is then as it was), each sequence runs alone so a fault ends only
/// the sequences it touches.
fn feed_step(
    model: &sluice_model::Model,
    chunk: usize,
    active: &mut [Seq],
    feed: &[usize],
) -> (Vec<Fed>, usize, f64) {
    if feed.is_empty() {
        return (Vec::new(), 0, 0.0);
    }
    // The pass's rows stay within what the plan's scratch holds: the chunk, shared out.
    let share = (chunk.max(feed.len()) / feed.len()).max(1);
    let mut segs: Vec<(Vec<u32>, usize)> = Vec::with_capacity(feed.len());
    for &i in feed {
        let s = &mut active[i];
        segs.push(
            s.spec
                .segment(&s.g, &s.history, &mut s.held, &s.state, model, share),
        );
    }
    let extra: usize = segs.iter().map(|(t, _)| t.len() - 1).sum();
    let t_pass = Instant::now();
    let mut fed = vec![false; active.len()];
    for &i in feed {
        fed[i] = true;
    }
    let batched = {
        let mut parts: Vec<(&mut State, &[u32])> = active
            .iter_mut()
            .zip(&fed)
            .filter(|(_, f)| **f)
            .map(|(s, _)| &mut s.state)
            .zip(&segs)
            .map(|(st, (t, _))| (st, t.as_slice()))
            .collect();
        if extra == 0 {
            let mut states: Vec<&mut State> = parts.into_iter().map(|(s, _)| s).collect();
            let ids: Vec<u32> = segs.iter().map(|(t, _)| t[0]).collect();
            model.forward_batch(&mut states, &ids)
        } else {
            model.forward_batch_rows(&mut parts)
        }
    };
    let v = model.config().vocab;
    let results = match batched {
        Ok(l) => {
            let mut at = 0;
            feed.iter()
                .zip(&segs)
                .map(|(&i, (t, drafted))| {
                    let n = t.len() * v;
                    let rows = &l[at..at + n];
                    at += n;
                    (i, Ok(active[i].spec.take_rows(rows, v, *drafted)))
                })
                .collect()
        }
        Err(_) => feed
            .iter()
            .zip(&segs)
            .map(|(&i, (t, drafted))| {
                let s = &mut active[i];
                let r = s
                    .spec
                    .run_alone(model, &mut s.state, &mut s.held, t, *drafted)
                    .map(|(next, _)| next)
                    .map_err(Error::from);
                (i, r)
            })
            .collect(),
    };
    (results, extra, t_pass.elapsed().as_secs_f64())
}

/// Prefills a new sequence; reports a failure through its sink.
fn start(engine: &Engine, mut job: Job) -> Option<Seq> {
    let mut state = engine.model().new_state();
    let mut history = Vec::new();
    // The batcher returns no logits: only the last position's are computed.
    let spec = Speculation::new(job.opts.draft);
    let boundary = job.opts.cache_prefix;
    match generate::prefill(
        engine,
        &mut state,
        &mut history,
        &job.ids,
        &job.opts,
        false,
        boundary,
    ) {
        Ok(p) => Some(Seq {
            job,
            state,
            history,
            g: p.seq,
            logits: p.last,
            spec,
            held: Held::default(),
            ended: false,
        }),
        Err(e) => {
            (job.sink)(Event::Failed(e));
            None
        }
    }
}
