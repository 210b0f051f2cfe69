//! Shared helpers of the integration tests: a small deterministic RNG, value and matrix
//! generators that reach the awkward corners (±0, subnormals, large magnitudes, NaN, Inf), and
//! bit comparison.

#![allow(dead_code)]

use proptest::test_runner::{Config, FileFailurePersistence};
use sluice_kernels::decode::{f32_to_bf16, scale_at};
use sluice_kernels::{Codes, Isa, Kernels, Matrix, ScaleType, Scales, scalar};

/// Proptest configuration: `PROPTEST_CASES` cases when set, else `default`; failures are
/// persisted in `proptest-regressions/<file>` (relative to the crate) and replayed first.
pub fn config(default: u32, file: &'static str) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(file))),
        ..Config::default()
    }
}

/// Every SIMD ISA this CPU has (the scalar path is the reference they are compared with).
pub fn simd_kernels() -> Vec<Kernels> {
    Isa::available()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .map(|i| Kernels::new(i).expect("available"))
        .collect()
}

/// The scalar specification.
pub fn spec() -> Kernels {
    Kernels::new(Isa::Scalar).expect("scalar is always available")
}

/// Bit equality, except that any NaN equals any NaN: NaN payloads are not part of the
/// contract (x86 propagates the NaN of whichever operand the compiler placed first).
pub fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Asserts `same` element-wise, naming the first difference.
pub fn assert_same(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            same(g, w),
            "{what}: element {i}: got {g:e} ({:#010x}), want {w:e} ({:#010x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// SplitMix64.
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// How wild the generated values are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Ordinary magnitudes only.
    Tame,
    /// Mostly ordinary, with ±0, subnormals and large magnitudes mixed in (no NaN or Inf).
    Edges,
    /// Anything, NaN and Inf included.
    Wild,
    /// Every value ±0 or tiny: results that are zero or round to zero, where signs matter.
    Zeros,
}

/// One f32 drawn according to `mode`.
pub fn value(rng: &mut Rng, mode: Mode) -> f32 {
    let ordinary = |rng: &mut Rng| (rng.unit() * 2.0 - 1.0) * 4.0;
    match mode {
        Mode::Tame => ordinary(rng),
        Mode::Edges => match rng.below(16) {
            0 => 0.0,
            1 => -0.0,
            2 => f32::from_bits(rng.below(0x0080_0000) as u32 | ((rng.next() as u32) & 1) << 31),
            3 => ordinary(rng) * 1e30,
            4 => ordinary(rng) * 1e-30,
            5 => f32::MIN_POSITIVE * if rng.below(2) == 0 { 1.0 } else { -1.0 },
            _ => ordinary(rng),
        },
        Mode::Wild => match rng.below(12) {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => f32::from_bits(rng.next() as u32),
            _ => value(rng, Mode::Edges),
        },
        Mode::Zeros => match rng.below(4) {
            0 => 0.0,
            1 => -0.0,
            2 => f32::from_bits(1 + rng.below(16) as u32),
            _ => -f32::from_bits(1 + rng.below(16) as u32),
        },
    }
}

/// An f16 bit pattern close to `v` (truncating; only needs to be some finite half).
pub fn f32_to_f16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if v.is_nan() {
        return sign | 0x7e00;
    }
    if e >= 31 {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = (b & 0x7f_ffff) | 0x80_0000;
        return sign | (m >> (14 - e)) as u16;
    }
    sign | ((e as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}

/// Stored bytes for `n` elements of `codes`, drawn according to `mode`.
pub fn element_bytes(rng: &mut Rng, codes: Codes, n: usize, mode: Mode) -> Vec<u8> {
    let mut out = Vec::new();
    match codes {
        Codes::F32 => (0..n).for_each(|_| out.extend(value(rng, mode).to_le_bytes())),
        Codes::BF16 => (0..n).for_each(|_| out.extend(f32_to_bf16(value(rng, mode)).to_le_bytes())),
        Codes::F16 => {
            (0..n).for_each(|_| out.extend(f32_to_f16_bits(value(rng, mode)).to_le_bytes()))
        }
        Codes::E4M3 | Codes::I8 => (0..n).for_each(|_| {
            let mut b = rng.byte();
            if mode == Mode::Zeros {
                b &= 0x81; // ±0 or the smallest subnormal
            } else if codes == Codes::E4M3 && mode != Mode::Wild && b & 0x7f == 0x7f {
                b ^= 1; // no NaN unless wild
            }
            out.push(b)
        }),
        Codes::Int4 | Codes::E2M1 => (0..n / 2).for_each(|_| {
            let mut b = rng.byte();
            if mode == Mode::Zeros {
                // INT4 code 8 is 0; E2M1 codes 0 and 8 are ±0, 1 and 9 are ±0.5.
                b = if codes == Codes::Int4 { 0x88 } else { b & 0x99 };
            }
            out.push(b)
        }),
        Codes::Block(f) => panic!("{f:?}: GGUF blocks are tested on gguf-py's fixtures"),
    }
    out
}

/// Scale bytes for `n` scales of `ty`.
pub fn scale_bytes(rng: &mut Rng, ty: ScaleType, n: usize, mode: Mode) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..n {
        let v = match mode {
            Mode::Wild => value(rng, Mode::Wild),
            Mode::Edges => value(rng, Mode::Edges),
            _ => (rng.unit() + 0.01) * if rng.below(2) == 0 { 1.0 } else { -1.0 },
        };
        match ty {
            ScaleType::F32 => out.extend(v.to_le_bytes()),
            ScaleType::BF16 => out.extend(f32_to_bf16(v).to_le_bytes()),
            ScaleType::F16 => out.extend(f32_to_f16_bits(v).to_le_bytes()),
            ScaleType::E8M0 => out.push(match mode {
                Mode::Wild => rng.byte(),
                Mode::Edges => [0, 1, 126, 127, 128, 200, 254][rng.below(7) as usize],
                _ => 110 + rng.below(30) as u8,
            }),
        }
    }
    out
}

/// Everything needed to build a matrix, owning its bytes. The element bytes start at
/// `offset` inside `buf`, so the matrix sees an arbitrarily aligned slice.
#[derive(Clone, Debug)]
pub struct Case {
    pub codes: Codes,
    pub rows: usize,
    pub cols: usize,
    pub buf: Vec<u8>,
    pub offset: usize,
    pub scale_ty: ScaleType,
    pub scales: Vec<u8>,
    pub group_cols: usize,
    pub group_rows: usize,
}

impl Case {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rng: &mut Rng,
        codes: Codes,
        rows: usize,
        cols: usize,
        offset: usize,
        scale_ty: ScaleType,
        group_cols: usize,
        group_rows: usize,
        mode: Mode,
    ) -> Case {
        let mut buf = vec![0xa5u8; offset];
        buf.extend(element_bytes(rng, codes, rows * cols, mode));
        buf.extend([0x5a; 3]); // bytes past the end, never read
        let scales = if codes.is_quantized() {
            let n = rows.div_ceil(group_rows) * cols.div_ceil(group_cols);
            scale_bytes(rng, scale_ty, n, mode)
        } else {
            Vec::new()
        };
        Case {
            codes,
            rows,
            cols,
            buf,
            offset,
            scale_ty,
            scales,
            group_cols,
            group_rows,
        }
    }

    pub fn matrix(&self) -> Matrix<'_> {
        let n = self.codes.row_bytes(self.cols).unwrap() * self.rows;
        let data = &self.buf[self.offset..self.offset + n];
        if self.codes.is_quantized() {
            let s = Scales {
                data: &self.scales,
                ty: self.scale_ty,
                group_cols: self.group_cols,
                group_rows: self.group_rows,
            };
            Matrix::quantized(self.codes, data, self.rows, self.cols, s).unwrap()
        } else {
            Matrix::dense(self.codes, data, self.rows, self.cols).unwrap()
        }
    }
}

/// The exact value of element `(r, j)` of `m` times its scale, in f64.
pub fn weight_f64(m: &Matrix<'_>, r: usize, j: usize) -> f64 {
    let c = scalar::code(m.codes(), m.row(r), j) as f64;
    match m.scales() {
        None => c,
        Some(s) => c * scale_at(s.ty, m.scale_row(r), j / s.group_cols) as f64,
    }
}

pub const ALL_CODES: [Codes; 7] = [
    Codes::F32,
    Codes::BF16,
    Codes::F16,
    Codes::E4M3,
    Codes::Int4,
    Codes::E2M1,
    Codes::I8,
];

pub const ALL_SCALES: [ScaleType; 4] = [
    ScaleType::F32,
    ScaleType::BF16,
    ScaleType::F16,
    ScaleType::E8M0,
];
