//! Writing float32 `.npy` files (NumPy format 1.0).

use std::io::Write;
use std::path::Path;

/// Writes `data` as a C-order float32 array of shape `[rows, cols]`.
pub fn write_f32(path: &Path, data: &[f32], rows: usize, cols: usize) -> std::io::Result<()> {
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let mut f = std::fs::File::create(path)?;
    f.write_all(&out)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    #[test]
    fn header_is_aligned() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.npy");
        super::write_f32(&p, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3).unwrap();
        let b = std::fs::read(&p).unwrap();
        assert_eq!(&b[..6], b"\x93NUMPY");
        let hl = u16::from_le_bytes([b[8], b[9]]) as usize;
        assert_eq!((10 + hl) % 64, 0);
        assert!(
            std::str::from_utf8(&b[10..10 + hl])
                .unwrap()
                .contains("'shape': (2, 3)")
        );
        assert_eq!(b.len(), 10 + hl + 24);
        assert_eq!(
            f32::from_le_bytes(b[10 + hl..14 + hl].try_into().unwrap()),
            1.0
        );
    }
}
