//! Zero-initialised heap buffers with a chosen alignment (for O_DIRECT).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

use crate::StoreError;

/// A heap buffer whose start is aligned to `align` bytes, zeroed at allocation.
///
/// Large buffers come from `calloc`-like zeroed pages, so untouched bytes cost no resident memory.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Option<Layout>,
}

// SAFETY: the buffer owns its allocation exclusively; `&AlignedBuf` only gives `&[u8]`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access is read-only.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zero bytes aligned to `align` (a power of two).
    pub fn zeroed(len: usize, align: usize) -> Result<AlignedBuf, StoreError> {
        let layout = Layout::from_size_align(len, align.max(1))
            .map_err(|_| StoreError::Alloc { bytes: len as u64 })?;
        if len == 0 {
            // A dangling but aligned pointer is valid for a zero-length slice.
            let ptr =
                NonNull::new(align.max(1) as *mut u8).ok_or(StoreError::Alloc { bytes: 0 })?;
            return Ok(AlignedBuf {
                ptr,
                len: 0,
                layout: None,
            });
        }
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(StoreError::Alloc { bytes: len as u64 })?;
        Ok(AlignedBuf {
            ptr,
            len,
            layout: Some(layout),
        })
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
        // SAFETY: `ptr` is valid for `len` initialised (zeroed or written) bytes for our lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `zeroed` with exactly this layout and not freed before.
            unsafe { dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes at {:p})", self.len, self.ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for (len, align) in [(0, 4096), (1, 4096), (8192, 4096), (100, 512), (3, 1)] {
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
