//! The expert store: routed experts read in place from the shards behind an in-memory cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::StoreError;
use crate::io::{Blob, Piece, Reader, read_blob};

/// Serves the bytes of routed experts by (layer, expert id).
#[derive(Debug)]
pub struct ExpertStore {
    reader: Arc<dyn Reader>,
    specs: Vec<Vec<Vec<Piece>>>,
    cache: Mutex<HashMap<(usize, u32), Arc<Blob>>>,
}

impl ExpertStore {
    /// A store over `reader` where `specs[layer][expert]` lists the pieces of one expert (layers
    /// without routed experts have an empty list).
    pub fn new(reader: Arc<dyn Reader>, specs: Vec<Vec<Vec<Piece>>>) -> ExpertStore {
        ExpertStore {
            reader,
            specs,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The pieces of one expert.
    pub fn spec(&self, layer: usize, expert: u32) -> Result<&[Piece], StoreError> {
        self.specs
            .get(layer)
            .and_then(|l| l.get(expert as usize))
            .map(Vec::as_slice)
            .ok_or(StoreError::NoSuchExpert { layer, expert })
    }

    /// How many experts of `layer` can be pinned at once (the model fetches at most this many
    /// per call).
    pub fn max_pinned(&self, _layer: usize) -> usize {
        usize::MAX
    }

    /// The bytes of the given experts of a layer, in the order asked. The returned handles pin
    /// the bytes in memory until dropped.
    pub fn fetch(&self, layer: usize, experts: &[u32]) -> Result<Vec<Arc<Blob>>, StoreError> {
        let mut out = Vec::with_capacity(experts.len());
        for &e in experts {
            let spec = self.spec(layer, e)?;
            if let Some(b) = self.cache.lock().map_err(|_| poisoned())?.get(&(layer, e)) {
                out.push(Arc::clone(b));
                continue;
            }
            let b = Arc::new(read_blob(self.reader.as_ref(), spec)?);
            self.cache
                .lock()
                .map_err(|_| poisoned())?
                .insert((layer, e), Arc::clone(&b));
            out.push(b);
        }
        Ok(out)
    }
}

fn poisoned() -> StoreError {
    StoreError::Shared("expert cache lock poisoned by a panic in another thread".into())
}
