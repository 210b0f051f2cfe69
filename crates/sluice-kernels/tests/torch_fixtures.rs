//! Decoding of FP8 E4M3, INT4 pack-quantized and MXFP4 weights against the values torch,
//! compressed-tensors and transformers produce (`tests/data/kernel_fixtures.safetensors`, made
//! by `tools/reference/kernel_fixtures.py`), on every ISA.
//!
//! Each dequantized value is read back through [`Kernels::matmul`] with a one-hot activation:
//! the contract then computes `fma(fma(code, 1, 0), scale, 0)`, which is `code × scale` rounded
//! once, as torch's `w.float() * scale` is. One difference is expected and allowed: a sum that
//! starts from `+0` cannot end at `−0`, so a `−0` weight reads back as `+0`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use sluice_format::Dtype;
use sluice_format::safetensors::parse_header;
use sluice_kernels::decode::E4M3_TABLE;
use sluice_kernels::{Codes, Kernels, Matrix, ScaleType, Scales, scalar};

/// A tiny safetensors reader over the validated header.
struct Fixture {
    bytes: Vec<u8>,
    tensors: BTreeMap<String, (Dtype, Vec<usize>, usize, usize)>,
}

impl Fixture {
    fn load() -> Fixture {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kernel_fixtures.safetensors");
        let bytes = std::fs::read(&path).expect("fixture file");
        let header = parse_header(&bytes, bytes.len() as u64, &path).expect("valid header");
        let tensors = header
            .tensors
            .into_iter()
            .map(|t| {
                (
                    t.name,
                    (t.dtype, t.shape, t.offset as usize, t.len as usize),
                )
            })
            .collect();
        Fixture { bytes, tensors }
    }

    fn raw(&self, name: &str, dtype: Dtype) -> (&[u8], &[usize]) {
        let (d, shape, off, len) = self
            .tensors
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(*d, dtype, "{name} dtype");
        (&self.bytes[*off..off + len], shape)
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        self.raw(name, Dtype::F32)
            .0
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn f64s(&self, name: &str) -> Vec<f64> {
        self.raw(name, Dtype::F64)
            .0
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

fn all_kernels() -> Vec<Kernels> {
    let mut k = simd_kernels();
    k.push(spec());
    k
}

/// `want` with `−0` replaced by `+0` (what a dot product starting from `+0` returns).
fn via_dot(want: &[f32]) -> Vec<f32> {
    want.iter()
        .map(|&v| if v == 0.0 { 0.0 } else { v })
        .collect()
}

/// Row `r` of `m` times the one-hot vector `e_j`, for every `j`: the dequantized row.
fn dequant_row(k: &Kernels, m: &Matrix<'_>, r: usize) -> Vec<f32> {
    let cols = m.cols();
    let mut x = vec![0f32; cols * cols];
    for j in 0..cols {
        x[j * cols + j] = 1.0;
    }
    let mut y = vec![0f32; cols];
    k.matmul(m, &x, &mut y, r..r + 1);
    y
}

/// `m · x` within a relative tolerance of the f64 product torch computed.
fn check_product(k: &Kernels, m: &Matrix<'_>, x: &[f32], want: &[f64], what: &str) {
    let mut y = vec![0f32; m.rows()];
    k.matmul(m, x, &mut y, 0..m.rows());
    for (r, (&g, &w)) in y.iter().zip(want).enumerate() {
        let mag: f64 = (0..m.cols())
            .map(|j| (weight_f64(m, r, j) * x[j] as f64).abs())
            .sum();
        assert!(
            (g as f64 - w).abs() <= 1e-5 * mag + 1e-30,
            "{:?} {what} row {r}: {g} vs torch {w}",
            k.isa()
        );
    }
}

#[test]
fn e4m3_every_code_matches_torch() {
    let f = Fixture::load();
    let codes = f.raw("e4m3.codes", Dtype::U8).0;
    let want = f.f32s("e4m3.values");
    for (i, (&c, &w)) in codes.iter().zip(&want).enumerate() {
        assert_eq!(c as usize, i);
        assert!(
            same(E4M3_TABLE[i], w),
            "code {i:#04x}: {} vs torch {w}",
            E4M3_TABLE[i]
        );
    }
    // The same codes through every lane on every ISA: row i holds code i in column i mod 16
    // and +0 elsewhere, unit scale, activations all 1, so y[i] is the code itself (a NaN code
    // makes its own row NaN and no other).
    let mut w = vec![0u8; 256 * 16];
    for (i, &c) in codes.iter().enumerate() {
        w[i * 16 + i % 16] = c;
    }
    let scale = 1f32.to_le_bytes();
    let s = Scales {
        data: &scale,
        ty: ScaleType::F32,
        group_cols: 16,
        group_rows: 256,
    };
    let m = Matrix::quantized(Codes::E4M3, &w, 256, 16, s).unwrap();
    for k in all_kernels() {
        let mut y = vec![0f32; 256];
        k.matmul(&m, &[1.0; 16], &mut y, 0..256);
        assert_same(&format!("{:?} e4m3 codes", k.isa()), &y, &via_dot(&want));
    }
}

#[test]
fn e4m3_block_scales_match_torch() {
    let f = Fixture::load();
    for name in ["e4m3_rows", "e4m3_cols"] {
        let (w, shape) = f.raw(&format!("{name}.weight"), Dtype::F8E4M3);
        let (rows, cols) = (shape[0], shape[1]);
        let (s, _) = f.raw(&format!("{name}.weight_scale_inv"), Dtype::F32);
        let sc = Scales {
            data: s,
            ty: ScaleType::F32,
            group_cols: 128,
            group_rows: 128,
        };
        let m = Matrix::quantized(Codes::E4M3, w, rows, cols, sc).unwrap();
        let first = {
            let (b, _) = f.raw(&format!("{name}.dequant_first_row"), Dtype::I32);
            i32::from_le_bytes(b.try_into().unwrap()) as usize
        };
        let deq = f.f32s(&format!("{name}.dequant"));
        let x = f.f32s(&format!("{name}.x"));
        let y = f.f64s(&format!("{name}.y"));
        for k in all_kernels() {
            for r in first..rows {
                let got = dequant_row(&k, &m, r);
                let want = &deq[(r - first) * cols..(r - first + 1) * cols];
                assert_same(
                    &format!("{:?} {name} row {r}", k.isa()),
                    &got,
                    &via_dot(want),
                );
            }
            check_product(&k, &m, &x, &y, name);
        }
    }
}

#[test]
fn int4_pack_quantized_matches_compressed_tensors() {
    let f = Fixture::load();
    // compressed-tensors packs along columns into little-endian int32 words: the bytes are
    // sluice's Int4 rows (low nibble = even column, value = nibble − 8).
    let (packed, pshape) = f.raw("int4.weight_packed", Dtype::I32);
    let (values, vshape) = f.raw("int4.values", Dtype::I8);
    let (rows, cols) = (vshape[0], vshape[1]);
    assert_eq!(pshape, [rows, cols / 8]);
    for r in 0..rows {
        for j in 0..cols {
            let q = values[r * cols + j] as i8 as f32;
            assert_eq!(
                scalar::code(Codes::Int4, &packed[r * cols / 2..], j),
                q,
                "({r}, {j})"
            );
        }
    }
    let (s, sshape) = f.raw("int4.weight_scale", Dtype::BF16);
    let sc = Scales {
        data: s,
        ty: ScaleType::BF16,
        group_cols: cols / sshape[1],
        group_rows: 1,
    };
    let m = Matrix::quantized(Codes::Int4, packed, rows, cols, sc).unwrap();
    let deq = f.f32s("int4.dequant");
    let (x, y) = (f.f32s("int4.x"), f.f64s("int4.y"));
    for k in all_kernels() {
        for r in 0..rows {
            let got = dequant_row(&k, &m, r);
            assert_same(
                &format!("{:?} int4 row {r}", k.isa()),
                &got,
                &via_dot(&deq[r * cols..(r + 1) * cols]),
            );
        }
        check_product(&k, &m, &x, &y, "int4");
    }
}

#[test]
fn mxfp4_matches_transformers() {
    let f = Fixture::load();
    let (blocks, bshape) = f.raw("mxfp4.blocks", Dtype::U8);
    let (scales, sshape) = f.raw("mxfp4.scales", Dtype::U8);
    let (rows, cols) = (bshape[0], bshape[1] * 2);
    assert_eq!(sshape, [rows, cols / 32]);
    let sc = Scales {
        data: scales,
        ty: ScaleType::E8M0,
        group_cols: 32,
        group_rows: 1,
    };
    let m = Matrix::quantized(Codes::E2M1, blocks, rows, cols, sc).unwrap();
    let deq = f.f32s("mxfp4.dequant");
    let (x, y) = (f.f32s("mxfp4.x"), f.f64s("mxfp4.y"));
    for k in all_kernels() {
        for r in 0..rows {
            let got = dequant_row(&k, &m, r);
            assert_same(
                &format!("{:?} mxfp4 row {r}", k.isa()),
                &got,
                &via_dot(&deq[r * cols..(r + 1) * cols]),
            );
        }
        check_product(&k, &m, &x, &y, "mxfp4");
    }
}
