//! Zero-initialised buffers with a chosen alignment (for O_DIRECT).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

use crate::StoreError;

/// Buffers at least this large are memory maps of their own.
pub const MAP_THRESHOLD: usize = 64 << 10;

enum Storage {
    /// A zero-length buffer: a dangling, aligned pointer.
    Empty(NonNull<u8>),
    /// From the global allocator.
    Heap(NonNull<u8>, Layout),
    /// An anonymous memory map.
    Map(memmap2::MmapMut),
}

/// A buffer whose start is aligned to `align` bytes, zeroed at allocation.
///
/// Buffers of [`MAP_THRESHOLD`] bytes or more are anonymous memory maps: page-aligned, zero
/// pages that cost nothing until written, and returned to the operating system the moment they
/// are dropped. (Through the allocator, freed expert buffers linger in per-thread arenas and the
/// process's resident memory drifts far above its budget.)
pub struct AlignedBuf {
    storage: Storage,
    len: usize,
}

// SAFETY: the buffer owns its memory exclusively; `&AlignedBuf` only gives `&[u8]`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access is read-only.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zero bytes aligned to `align` (a power of two).
    pub fn zeroed(len: usize, align: usize) -> Result<AlignedBuf, StoreError> {
        let err = || StoreError::Alloc { bytes: len as u64 };
        let align = align.max(1);
        if !align.is_power_of_two() {
            return Err(err());
        }
        if len == 0 {
            // A dangling but aligned pointer is valid for a zero-length slice.
            let ptr = NonNull::new(align as *mut u8).ok_or_else(err)?;
            return Ok(AlignedBuf {
                storage: Storage::Empty(ptr),
                len: 0,
            });
        }
        if len >= MAP_THRESHOLD && align <= rustix::param::page_size() {
            let map = memmap2::MmapMut::map_anon(len).map_err(|_| err())?;
            // Huge pages where the kernel has them: one fault per 2 MiB instead of per 4 KiB
            // when a read first fills the buffer. Only a hint; refusal changes nothing.
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            return Ok(AlignedBuf {
                storage: Storage::Map(map),
                len,
            });
        }
        let layout = Layout::from_size_align(len, align).map_err(|_| err())?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(err)?;
        Ok(AlignedBuf {
            storage: Storage::Heap(ptr, layout),
            len,
        })
    }

    /// Whether the first byte sits at a multiple of `align`.
    pub fn is_aligned_to(&self, align: usize) -> bool {
        (self.as_slice().as_ptr() as usize).is_multiple_of(align.max(1))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.storage {
            Storage::Map(m) => m,
            // SAFETY: the pointer is valid for `len` initialised (zeroed or written) bytes for as
            // long as `self` lives (zero bytes for `Empty`).
            Storage::Heap(p, _) | Storage::Empty(p) => unsafe {
                std::slice::from_raw_parts(p.as_ptr(), self.len)
            },
        }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Map(m) => m,
            // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access.
            Storage::Heap(p, _) | Storage::Empty(p) => unsafe {
                std::slice::from_raw_parts_mut(p.as_ptr(), self.len)
            },
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Storage::Heap(p, layout) = self.storage {
            // SAFETY: allocated in `zeroed` with exactly this layout and not freed before.
            unsafe { dealloc(p.as_ptr(), layout) }
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AlignedBuf({} bytes at {:p})",
            self.len,
            self.as_slice().as_ptr()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for (len, align) in [
            (0, 4096),
            (1, 4096),
            (8192, 4096),
            (100, 512),
            (3, 1),
            (1 << 20, 4096),
            (MAP_THRESHOLD, 64),
        ] {
            let mut b = AlignedBuf::zeroed(len, align).unwrap();
            assert_eq!(b.as_slice().as_ptr() as usize % align, 0);
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(7);
            assert!(b.as_slice().iter().all(|&x| x == 7));
        }
        assert!(AlignedBuf::zeroed(16, 3).is_err());
    }
}
