//! An expert read failing mid-generation ends that request with a typed error, and the same
//! model then serves the next request with correct output.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sluice_format::Checkpoint;
use sluice_model::weights::WeightLayout;
use sluice_model::{Logits, Model, ModelConfig, ModelError, ModelOptions};
use sluice_store::{IoMode, Reader, ShardSet, StoreError};

#[derive(Debug)]
struct Flaky {
    inner: ShardSet,
    /// Fail every read after the trunk has loaded.
    fail: AtomicBool,
}

impl Reader for Flaky {
    fn read_at(&self, shard: u32, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected: device went away"));
        }
        self.inner.read_at(shard, offset, buf)
    }
    fn align(&self, shard: u32) -> usize {
        self.inner.align(shard)
    }
    fn path(&self, shard: u32) -> &Path {
        self.inner.path(shard)
    }
    fn mode(&self, shard: u32) -> IoMode {
        Reader::mode(&self.inner, shard)
    }
}

#[test]
fn failed_expert_reads_end_the_request_then_the_model_recovers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/deepseek_v3-fp32");
    let ck = Checkpoint::open(&dir).unwrap();
    let cfg = ModelConfig::from_json(ck.config(), &dir.join("config.json")).unwrap();
    let layout = WeightLayout::new(&ck, &cfg).unwrap();
    let paths: Vec<_> = ck.shards().iter().map(|s| s.path.clone()).collect();
    let flaky = Arc::new(Flaky {
        inner: ShardSet::open(&paths, true).unwrap(),
        fail: AtomicBool::new(false),
    });
    let mode = Reader::mode(flaky.as_ref(), 0);
    // A small budget so that experts must be read during generation.
    let probe = Model::open(
        &dir,
        ModelOptions {
            context: 64,
            ..Default::default()
        },
    )
    .unwrap();
    let minimum = probe.plan().minimum;
    let opts = ModelOptions {
        memory: Some(minimum + 100_000),
        context: 64,
        threads: 2,
        ..Default::default()
    };
    let model = Model::with_reader(cfg, layout, flaky.clone(), mode, opts).unwrap();

    let prompt = [5u32, 9, 200, 31];
    let clean = {
        let mut st = model.new_state();
        model.forward(&mut st, &prompt, Logits::All).unwrap()
    };

    model.experts().clear();
    flaky.fail.store(true, Ordering::SeqCst);
    let mut st = model.new_state();
    match model.forward(&mut st, &prompt, Logits::All) {
        Err(ModelError::Store(StoreError::Io { source, path, .. })) => {
            assert!(source.to_string().contains("device went away"));
            assert!(
                path.to_string_lossy().contains("safetensors"),
                "{}",
                path.display()
            );
        }
        other => panic!(
            "expected a store I/O error, got {:?}",
            other.map(|l| l.len())
        ),
    }

    // The failed call left the state as it was: the same state serves the retry.
    assert_eq!(st.pos(), 0);
    flaky.fail.store(false, Ordering::SeqCst);
    let again = model.forward(&mut st, &prompt, Logits::All).unwrap();
    assert!(
        again
            .iter()
            .zip(&clean)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    let s = model.experts().stats();
    assert_eq!(s.requests, s.hits + s.misses);
}

/// Kimi K3: an expert read failing in a decode step, after the KDA layers before it have
/// advanced their recurrent state, leaves the state exactly as it was; the retry gives the
/// clean run's bits.
#[test]
fn a_failed_step_leaves_the_recurrent_state_as_it_was() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/kimi/k3/k3-tiny-mxfp4");
    let ck = Checkpoint::open(&dir).unwrap();
    let cfg = ModelConfig::from_json(ck.config(), &dir.join("config.json")).unwrap();
    let layout = WeightLayout::new(&ck, &cfg).unwrap();
    let paths: Vec<_> = ck.shards().iter().map(|s| s.path.clone()).collect();
    let flaky = Arc::new(Flaky {
        inner: ShardSet::open(&paths, true).unwrap(),
        fail: AtomicBool::new(false),
    });
    let mode = Reader::mode(flaky.as_ref(), 0);
    let probe = Model::open(
        &dir,
        ModelOptions {
            context: 64,
            ..Default::default()
        },
    )
    .unwrap();
    let p = probe.plan();
    // The whole trunk pinned (nothing of it is read after loading), few experts cached.
    let opts = ModelOptions {
        memory: Some(p.trunk + p.kv_cache + p.recurrent + p.scratch + 2 * p.per_token_expert_bytes),
        context: 64,
        threads: 2,
        ..Default::default()
    };
    let model = Model::with_reader(cfg, layout, flaky.clone(), mode, opts).unwrap();
    assert!(model.plan().trunk_resident());
    assert!(model.plan().expert_cache < model.plan().all_expert_bytes);

    let prompt = [305u32, 12, 400, 77, 3, 250, 61];
    let clean = {
        let mut st = model.new_state();
        model.forward(&mut st, &prompt, Logits::None).unwrap();
        model.forward(&mut st, &[42], Logits::Last).unwrap()
    };

    let mut st = model.new_state();
    model.forward(&mut st, &prompt, Logits::None).unwrap();
    model.experts().clear();
    flaky.fail.store(true, Ordering::SeqCst);
    assert!(matches!(
        model.forward(&mut st, &[42], Logits::Last),
        Err(ModelError::Store(StoreError::Io { .. }))
    ));
    assert_eq!(st.pos(), prompt.len());
    flaky.fail.store(false, Ordering::SeqCst);
    let again = model.forward(&mut st, &[42], Logits::Last).unwrap();
    assert!(
        again
            .iter()
            .zip(&clean)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
}
