//! x86-64 implementations of the contract: AVX2+FMA (+F16C) and AVX-512 (F, BW, VL, DQ).
//!
//! The algorithms are written once, in [`generic`], over two small traits: [`generic::Vector`]
//! (16 f32 lanes: one zmm for AVX-512, two ymm for AVX2) and [`generic::Codec`] (how one block
//! of 16 stored columns decodes into those lanes). Each ISA module implements the traits with
//! `#[inline(always)]` functions and exposes `#[target_feature]` entry points; everything below
//! an entry point is inlined into it, so the intrinsics are compiled for that ISA only.
//!
//! A decoder may place the 16 columns of a block in its lanes in any fixed order (a
//! *layout*), because every lane is an independent accumulator: the activations are permuted
//! the same way once per call, and the 16 lane sums are put back in column order before the
//! contract's pairwise tree. Lane `i` of the contract still sees exactly columns `i`, `i + 16`,
//! `i + 32`, … in order, so the bits do not change.

/// Evaluates `$body` with the type `$C` standing for the decoder (in the invoking ISA module)
/// of the coding `$codes`.
macro_rules! per_codes {
    ($codes:expr, |$C:ident| $body:expr, else $fallback:expr) => {
        match $codes {
            Codes::F32 => {
                type $C = F32;
                $body
            }
            Codes::BF16 => {
                type $C = Bf16;
                $body
            }
            Codes::F16 => {
                type $C = F16;
                $body
            }
            Codes::E4M3 => {
                type $C = E4m3;
                $body
            }
            Codes::Int4 => {
                type $C = Int4;
                $body
            }
            Codes::E2M1 => {
                type $C = E2m1;
                $body
            }
            Codes::I8 => {
                type $C = I8;
                $body
            }
            // GGUF blocks have no 16-column decoder: `crate::Kernels` sends them to the
            // specification before dispatching, which this repeats.
            Codes::Block(_) => $fallback,
        }
    };
}

/// Declares the `#[target_feature]` entry points of the row decoder and the transposed
/// products of [`generic::xw`] for one ISA: `$v` its vector, `$features` its target
/// features, `$r` the weight rows streamed together for one activation row, `$b` × `$nb` the
/// activation rows × blocks of columns of a tile for several, `$one` the blocks of columns one
/// activation row keeps in registers over a narrow range (see [`generic::xw()`]).
macro_rules! xw_ops {
    ($v:ty, $features:literal, $r:literal, $b:literal, $nb:literal, $one:literal) => {
        /// [`crate::scalar::decode_row`].
        ///
        /// # Safety
        /// The CPU has the ISA; the arguments pass the checks of [`crate::Kernels::decode_row`].
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn decode_row(
            m: &Matrix<'_>,
            r: usize,
            cols: Range<usize>,
            out: &mut [f32],
        ) {
            // SAFETY: the ISA is available and the shapes are checked (this function's
            // contract); each arm decodes the coding it matches.
            unsafe {
                per_codes!(
                    m.codes(),
                    |C| generic::decode_row::<$v, C>(m, r, cols, out),
                    else crate::scalar::decode_row(m, r, cols, out)
                )
            }
        }

        /// `y[b, o − cols.start] = Σ_i x[b, i] · m[rows.start + i, o]` (see [`generic::xw()`]).
        ///
        /// # Safety
        /// The CPU has the ISA; the shapes are as [`generic::xw()`] requires.
        #[target_feature(enable = $features)]
        unsafe fn xw(
            m: &Matrix<'_>,
            rows: Range<usize>,
            x: &[f32],
            y: &mut [f32],
            cols: Range<usize>,
        ) {
            // SAFETY: as in `decode_row`.
            unsafe {
                per_codes!(
                    m.codes(),
                    |C| generic::xw::<$v, C, $r, $b, $nb, $one>(m, rows, x, y, cols),
                    else crate::scalar::xw_rows(m, rows, x, y, cols)
                )
            }
        }

        /// [`crate::scalar::matmul_xw`].
        ///
        /// # Safety
        /// The CPU has the ISA; the arguments pass the checks of [`crate::Kernels::matmul_xw`].
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn matmul_xw(
            m: &Matrix<'_>,
            x: &[f32],
            y: &mut [f32],
            cols: Range<usize>,
        ) {
            // SAFETY: this function's contract is `xw`'s over every row.
            unsafe { xw(m, 0..m.rows(), x, y, cols) }
        }

        /// [`crate::scalar::absorb`].
        ///
        /// # Safety
        /// The CPU has the ISA; the arguments pass the checks of [`crate::Kernels::absorb`].
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn absorb(
            m: &Matrix<'_>,
            rows: Range<usize>,
            x: &[f32],
            out: &mut [f32],
        ) {
            // SAFETY: this function's contract is `xw`'s over every column.
            unsafe { xw(m, rows, x, out, 0..m.cols()) }
        }

        /// [`crate::scalar::weighted_sum`].
        ///
        /// # Safety
        /// The CPU has the ISA; the arguments pass the checks of
        /// [`crate::Kernels::weighted_sum`].
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn weighted_sum(p: &[f32], v: &[f32], dim: usize, out: &mut [f32]) {
            let n = p.len();
            let v = &v[..n * dim];
            // SAFETY: any initialised f32 is four initialised bytes, and `u8` needs no
            // alignment: the bytes of `v`, borrowed for as long as `v`.
            let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), 4 * v.len()) };
            let m = Matrix::dense(Codes::F32, bytes, n, dim).expect("an f32 matrix of n x dim");
            // SAFETY: `m` is `[n, dim]` and `p`, `out` are one activation row of `n` and `dim`
            // values: `xw`'s contract.
            unsafe { xw(&m, 0..n, p, out, 0..dim) }
        }
    };
}

pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod generic;
pub(crate) mod gguf;
pub(crate) mod int8;
