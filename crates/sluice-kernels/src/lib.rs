//! sluice's arithmetic.
//!
//! Every number sluice computes goes through this crate, and every stored weight format is
//! defined here: the coding of a stored dtype ([`Codes::for_dtype`], [`ScaleType::for_dtype`]),
//! exact decoding ([`decode`], [`Kernels::decode_row`]), products of packed weight matrices
//! with f32 activations ([`Kernels::matmul`]), the transposed products that accumulate decoded
//! rows ([`Kernels::matmul_xw`] for matrices stored `[in, out]`, [`Kernels::absorb`] for
//! multi-head latent attention, [`Kernels::weighted_sum`] for attention's `probs · V`), and the
//! row ops of a transformer (RMSNorm,
//! softmax, SwiGLU, SiTU-GLU, sigmoid, tanh, softplus, L2 norm, RoPE, top-k, the short causal
//! convolution and the delta-rule step of Kimi Delta Attention). Because sluice promises byte-identical output at
//! every memory budget, thread count and CPU, there is one numeric contract (see [`scalar`]) and
//! every implementation meets it bit for bit: the scalar code is the specification; the
//! AVX2+FMA and AVX-512 paths return exactly its bits.
//!
//! # Dispatch
//!
//! The instruction set is chosen once, at run time ([`Isa::best`]), and carried as a value: a
//! [`Kernels`] can only be made for an ISA this CPU has ([`Kernels::new`] checks
//! [`Isa::is_available`]), so holding one is the capability the SIMD code relies on, and any
//! available ISA can be forced (tests, benches and the CLI do). Every method checks its slice
//! lengths, then calls the implementation of its ISA: the scalar functions of [`scalar`], or
//! (on x86-64 only) `#[target_feature]` functions compiled for AVX2+FMA+F16C or AVX-512
//! F/BW/VL/DQ. Nothing is compiled for the build machine's CPU (no `target-cpu=native`).
//! Kernels are single-threaded over a range of output rows (the transposed products: output
//! columns); the caller splits them across threads, so the thread count cannot change a bit.
//!
//! # How the SIMD paths keep the contract
//!
//! - The 16 lanes of the contract are one zmm (AVX-512) or two ymm (AVX2); each lane
//!   accumulates its columns in order with one fused multiply-add each, from `+0.0`, the last
//!   block padded with weights and activations that are `+0.0` exactly as the scalar code pads
//!   them; the 16 lane sums go through the same pairwise tree.
//! - A decoder may put a block's 16 columns in any fixed lane order (the nibble formats use the
//!   order a variable shift of a broadcast word gives); the activations are permuted the same
//!   way and the lane sums put back in column order before the tree.
//! - Several output rows and activation rows share loads and decoding, never an accumulator:
//!   a result does not depend on the row range, the batch, or the tile the pair fell in.
//! - Codes and scales decode exactly (the decoders are checked against torch,
//!   compressed-tensors and transformers in the tests), and `exp` is written as the same IEEE
//!   operations in vector form.
//!
//! The one thing not reproduced is the payload of a NaN: where a result is NaN it is NaN on every
//! path, but which operand's payload (and sign) survives depends on instruction operand order
//! that the compiler chooses.
//!
//! ```
//! use sluice_kernels::{Codes, Isa, Kernels, Matrix};
//! let k = Kernels::new(Isa::best()).unwrap();
//! let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
//! let m = Matrix::dense(Codes::F32, &w, 2, 2).unwrap();
//! let mut y = [0.0f32; 2];
//! k.matmul(&m, &[1.0, 1.0], &mut y, 0..2);
//! assert_eq!(y, [3.0, 7.0]);
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

pub mod decode;
pub mod gguf;
pub mod int8;
mod matrix;
pub mod probe;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::fmt;
use std::ops::Range;

pub use matrix::{Codes, Matrix, ScaleType, Scales};

/// Errors of this crate: a matrix whose bytes do not fit its declared layout, or an ISA this CPU
/// lacks.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum KernelError {
    /// The bytes given do not match the declared shape and coding.
    #[error("{0}")]
    Layout(String),
    /// The instruction set is not available on this CPU.
    #[error("instruction set `{0}` is not available on this CPU")]
    Unavailable(Isa),
}

/// An instruction set a kernel implementation targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable scalar code: the specification.
    Scalar,
    /// x86-64 AVX2 with FMA (and F16C, which every AVX2 CPU has).
    Avx2,
    /// x86-64 AVX-512 (F, BW, VL, DQ).
    Avx512,
}

impl Isa {
    /// Every ISA this crate knows, in order of preference from lowest.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// Lower-case name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Parses a name as the CLI spells it.
    pub fn from_name(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == s)
    }

    /// Whether this CPU can run the ISA, and the environment does not cap it: with
    /// `SLUICE_MAX_ISA` set to an ISA's name (`scalar`, `avx2`), the ones above it count as
    /// unavailable — how the test suite runs a CPU with AVX-512 as one with AVX2 only.
    pub fn is_available(self) -> bool {
        static CAP: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
        let cap = *CAP.get_or_init(|| {
            std::env::var("SLUICE_MAX_ISA")
                .ok()
                .and_then(|v| Isa::from_name(&v))
        });
        if cap.is_some_and(|c| self > c) {
            return false;
        }
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && Isa::Avx2.is_available()
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every ISA this CPU can run.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// The fastest ISA this CPU can run.
    pub fn best() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|i| i.is_available())
            .unwrap_or(Isa::Scalar)
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Calls the implementation of `$f` for the ISA of a [`Kernels`].
macro_rules! dispatch {
    ($k:expr, $f:ident($($arg:expr),*)) => {
        match $k.isa {
            Isa::Scalar => scalar_op::$f($($arg),*),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Kernels` is only built for an available ISA (`Kernels::new`,
            // `Kernels::best`), and the caller has checked the lengths the kernel relies on.
            Isa::Avx2 => unsafe { x86::avx2::$f($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx512 => unsafe { x86::avx512::$f($($arg),*) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => scalar_op::$f($($arg),*),
        }
    };
}

/// The scalar specification under the names the dispatch uses.
mod scalar_op {
    pub(crate) use crate::scalar::{
        absorb, axpy, decode_row, dot, matmul, matmul_xw, rmsnorm, silu_mul, softmax, sum,
        weighted_sum,
    };

    pub(crate) fn sigmoid(x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = crate::scalar::sigmoid(*v));
    }

    pub(crate) fn silu(x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = crate::scalar::silu(*v));
    }

    pub(crate) fn exp(x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = crate::scalar::exp(*v));
    }
}

/// Which arithmetic the products of quantized GGUF weights use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// Every weight decoded exactly to f32 and multiplied by f32 activations (the contract of
    /// [`scalar`]): transformers' numerics on the dequantized weights.
    #[default]
    Exact,
    /// Activations quantized to 8 bits and exact integer dot products ([`int8`]), for the
    /// formats that have one; the rest as [`Numerics::Exact`].
    Int8,
}

impl Numerics {
    /// Every mode.
    pub const ALL: [Numerics; 2] = [Numerics::Exact, Numerics::Int8];

    /// The name the CLI and the stats use.
    pub fn name(self) -> &'static str {
        match self {
            Numerics::Exact => "exact",
            Numerics::Int8 => "int8",
        }
    }

    /// Parses a name as the CLI spells it.
    pub fn from_name(s: &str) -> Option<Numerics> {
        Numerics::ALL.into_iter().find(|n| n.name() == s)
    }
}

impl fmt::Display for Numerics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The kernels for one instruction set and numeric mode. Holding one proves the ISA is
/// available: it is the capability token the SIMD paths rely on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernels {
    isa: Isa,
    numerics: Numerics,
}

impl Default for Kernels {
    fn default() -> Self {
        Kernels {
            isa: Isa::best(),
            numerics: Numerics::Exact,
        }
    }
}

impl Kernels {
    /// Kernels for `isa`, if this CPU has it.
    pub fn new(isa: Isa) -> Result<Kernels, KernelError> {
        if isa.is_available() {
            Ok(Kernels {
                isa,
                numerics: Numerics::Exact,
            })
        } else {
            Err(KernelError::Unavailable(isa))
        }
    }

    /// Kernels for the fastest ISA this CPU has.
    pub fn best() -> Kernels {
        Kernels::default()
    }

    /// The ISA in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The same kernels in numeric mode `numerics`.
    pub fn with_numerics(self, numerics: Numerics) -> Kernels {
        Kernels { numerics, ..self }
    }

    /// The numeric mode.
    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    /// Matrix product over a range of output rows.
    ///
    /// `x` holds `b` activation rows of `m.cols()` values; `y` receives `b` rows of
    /// `rows.len()` values: `y[i, r − rows.start] = m[r] · x[i]`. Each value follows the
    /// contract of [`scalar`], whatever `b`, the range or the ISA.
    ///
    /// # Panics
    /// When `x.len()` is not a multiple of `m.cols()`, `y.len()` is not `b × rows.len()`, or
    /// `rows` runs past `m.rows()`.
    pub fn matmul(&self, m: &Matrix<'_>, x: &[f32], y: &mut [f32], rows: Range<usize>) {
        let cols = m.cols();
        assert!(
            rows.start <= rows.end && rows.end <= m.rows(),
            "row range {rows:?} outside {} rows",
            m.rows()
        );
        let batch = x
            .len()
            .checked_div(cols)
            .unwrap_or(y.len() / rows.len().max(1));
        assert!(
            cols == 0 || x.len() == batch * cols,
            "activations of {} values for {cols} columns",
            x.len()
        );
        assert_eq!(
            y.len(),
            batch * rows.len(),
            "output of {} values for {batch} x {} rows",
            y.len(),
            rows.len()
        );
        if cols == 0 {
            // No arithmetic: defer to the specification for what is written.
            return scalar::matmul(m, x, y, rows);
        }
        if let Codes::Block(f) = m.codes() {
            if self.numerics == Numerics::Int8
                && let Some(kind) = int8::ActKind::for_format(f)
            {
                return int8::matmul_with(self, f, kind, m, x, y, rows);
            }
            return gguf::matmul(self, f, m, x, y, rows);
        }
        dispatch!(self, matmul(m, x, y, rows))
    }

    /// Columns `cols` of row `r` of `m` decoded to f32 (see [`scalar::decode_row`]): the stored
    /// values, times their group's scale for quantized codings.
    ///
    /// # Panics
    /// When `r` is not a row of `m`, `cols` runs past `m.cols()`, or `out.len() != cols.len()`.
    pub fn decode_row(&self, m: &Matrix<'_>, r: usize, cols: Range<usize>, out: &mut [f32]) {
        assert!(r < m.rows(), "row {r} outside {} rows", m.rows());
        check_cols(m, &cols);
        assert_eq!(
            out.len(),
            cols.len(),
            "decode_row into {} values for {} columns",
            out.len(),
            cols.len()
        );
        if let Codes::Block(_) = m.codes() {
            return scalar::decode_row(m, r, cols, out);
        }
        dispatch!(self, decode_row(m, r, cols, out))
    }

    /// The transposed product `y = x · W` over a range of output columns, for a matrix stored
    /// `[in, out]` (`in = m.rows()`, `out = m.cols()`; GPT-OSS's fused experts). `x` holds `b`
    /// activation rows of `m.rows()` values; `y` receives `b` rows of `cols.len()` values,
    /// `y[i, o − cols.start] = Σ_r x[i, r] · m[r, o]`, each accumulated over `r` in order with
    /// one fma per term from `+0.0` (see [`scalar::matmul_xw`]). A value depends only on its
    /// column, so the caller may split the columns across threads.
    ///
    /// # Panics
    /// When `cols` runs past `m.cols()`, `x.len()` is not `b × m.rows()` or `y.len()` is not
    /// `b × cols.len()` for one `b`.
    pub fn matmul_xw(&self, m: &Matrix<'_>, x: &[f32], y: &mut [f32], cols: Range<usize>) {
        check_cols(m, &cols);
        let n_in = m.rows();
        let batch = y
            .len()
            .checked_div(cols.len())
            .unwrap_or(x.len().checked_div(n_in).unwrap_or(0));
        assert!(
            x.len() == batch * n_in && y.len() == batch * cols.len(),
            "matmul_xw: activations of {} values and output of {} for [{n_in}, {}] over {} columns",
            x.len(),
            y.len(),
            m.cols(),
            cols.len()
        );
        if let Codes::Block(_) = m.codes() {
            return scalar::matmul_xw(m, x, y, cols);
        }
        dispatch!(self, matmul_xw(m, x, y, cols))
    }

    /// `out[b] = Σ_i x[b, i] · m[rows.start + i, :]`: the transposed product over a range of
    /// rows (multi-head latent attention's weight absorption) for each of `b` activation rows
    /// (`x` holds `b` rows of `rows.len()` values, `out` `b` rows of `m.cols()`), each
    /// accumulated row by row from `+0.0` with one fma per term (see [`scalar::absorb`]). A row's
    /// result does not depend on the others: a prefill's queries of one head go in one call,
    /// and each weight is decoded once for all of them.
    ///
    /// # Panics
    /// When `rows` runs past `m.rows()`, or `x` and `out` are not whole rows of `rows.len()`
    /// and `m.cols()` values, as many of each.
    pub fn absorb(&self, m: &Matrix<'_>, rows: Range<usize>, x: &[f32], out: &mut [f32]) {
        assert!(
            rows.start <= rows.end && rows.end <= m.rows(),
            "row range {rows:?} outside {} rows",
            m.rows()
        );
        let batch = match m.cols() {
            0 => x.len().checked_div(rows.len()).unwrap_or(0),
            c => out.len() / c,
        };
        assert!(
            out.len() == batch * m.cols() && x.len() == batch * rows.len(),
            "absorb: {} weights for {} rows into {} values for {} columns",
            x.len(),
            rows.len(),
            out.len(),
            m.cols()
        );
        if batch == 0 {
            return;
        }
        if let Codes::Block(_) = m.codes() {
            return scalar::absorb(m, rows, x, out);
        }
        dispatch!(self, absorb(m, rows, x, out))
    }

    /// `out[d] = Σ_j p[j] · v[j, d]` (attention's `probs · V`), accumulated from `+0.0` in
    /// position order with one fma per term (see [`scalar::weighted_sum`]). `v` holds at least
    /// `p.len()` rows of `dim` values; rows past them are not read.
    ///
    /// # Panics
    /// When `out.len() != dim` or `v` holds fewer than `p.len() × dim` values.
    pub fn weighted_sum(&self, p: &[f32], v: &[f32], dim: usize, out: &mut [f32]) {
        assert!(
            out.len() == dim && p.len().checked_mul(dim).is_some_and(|n| n <= v.len()),
            "weighted_sum of {} rows of {dim} from {} values into {}",
            p.len(),
            v.len(),
            out.len()
        );
        dispatch!(self, weighted_sum(p, v, dim, out))
    }

    /// `a · b` by the contract.
    ///
    /// # Panics
    /// When the lengths differ.
    pub fn dot(&self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot of unequal lengths");
        dispatch!(self, dot(a, b))
    }

    /// `y[i] = fma(a, x[i], y[i])`.
    ///
    /// # Panics
    /// When the lengths differ.
    pub fn axpy(&self, a: f32, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "axpy of unequal lengths");
        dispatch!(self, axpy(a, x, y))
    }

    /// RMSNorm (see [`scalar::rmsnorm`]).
    ///
    /// # Panics
    /// When the lengths differ.
    pub fn rmsnorm(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        assert!(
            x.len() == w.len() && x.len() == out.len(),
            "rmsnorm of unequal lengths"
        );
        dispatch!(self, rmsnorm(x, w, eps, out))
    }

    /// Softmax in place (see [`scalar::softmax`]).
    pub fn softmax(&self, x: &mut [f32]) {
        dispatch!(self, softmax(x))
    }

    /// `out[i] = silu(gate[i]) × up[i]`.
    ///
    /// # Panics
    /// When the lengths differ.
    pub fn silu_mul(&self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        assert!(
            gate.len() == up.len() && gate.len() == out.len(),
            "silu_mul of unequal lengths"
        );
        dispatch!(self, silu_mul(gate, up, out))
    }

    /// Sum of `x` in the contract's lane order (see [`scalar::sum`]).
    pub fn sum(&self, x: &[f32]) -> f32 {
        dispatch!(self, sum(x))
    }

    /// `x[i] = sigmoid(x[i])` (see [`scalar::sigmoid`]).
    pub fn sigmoid(&self, x: &mut [f32]) {
        dispatch!(self, sigmoid(x))
    }

    /// `x[i] = silu(x[i])` (see [`scalar::silu`]).
    pub fn silu(&self, x: &mut [f32]) {
        dispatch!(self, silu(x))
    }

    /// `x[i] = exp(x[i])` (see [`scalar::exp`]).
    pub fn exp(&self, x: &mut [f32]) {
        dispatch!(self, exp(x))
    }

    // The ops below are dispatched to the scalar specification on every ISA (or, for the
    // products of `kda_step` and `l2norm`, to `axpy` and `dot`, which every ISA computes alike).

    /// `x[i] = tanh(x[i])` (see [`scalar::tanh`]).
    pub fn tanh(&self, x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = scalar::tanh(*v));
    }

    /// `x[i] = softplus(x[i])` (see [`scalar::softplus`]).
    pub fn softplus(&self, x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = scalar::softplus(*v));
    }

    /// SiTU-GLU (see [`scalar::situ_mul`]).
    ///
    /// # Panics
    /// When the lengths differ.
    pub fn situ_mul(
        &self,
        gate: &[f32],
        up: &[f32],
        beta: f32,
        linear_beta: Option<f32>,
        out: &mut [f32],
    ) {
        assert!(
            gate.len() == up.len() && gate.len() == out.len(),
            "situ_mul of unequal lengths"
        );
        scalar::situ_mul(gate, up, beta, linear_beta, out)
    }

    /// L2 normalisation (see [`scalar::l2norm`]).
    ///
    /// # Panics
    /// When the lengths differ.
    pub fn l2norm(&self, x: &[f32], eps: f32, out: &mut [f32]) {
        assert_eq!(x.len(), out.len(), "l2norm of unequal lengths");
        let r = (self.dot(x, x) + eps).sqrt();
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v / r;
        }
    }

    /// `x[i] = x[i] × σ(gate[i])` (see [`scalar::mul_sigmoid`]).
    ///
    /// # Panics
    /// When the lengths differ.
    pub fn mul_sigmoid(&self, x: &mut [f32], gate: &[f32]) {
        assert_eq!(x.len(), gate.len(), "mul_sigmoid of unequal lengths");
        scalar::mul_sigmoid(x, gate)
    }

    /// A causal depthwise convolution with SiLU for one position (see [`scalar::conv_silu`]).
    ///
    /// # Panics
    /// When `window` and `w` are not `[k, out.len()]` alike.
    pub fn conv_silu(&self, window: &[f32], w: &[f32], out: &mut [f32]) {
        assert!(
            window.len() == w.len() && !out.is_empty() && w.len().is_multiple_of(out.len()),
            "conv_silu: window {} and taps {} for {} channels",
            window.len(),
            w.len(),
            out.len()
        );
        scalar::conv_silu(window, w, out)
    }

    /// One token of Kimi Delta Attention for one head (see [`scalar::kda_step`]).
    ///
    /// # Panics
    /// When `state` is not `[k.len(), v.len()]` or the other lengths disagree.
    #[allow(clippy::too_many_arguments)]
    pub fn kda_step(
        &self,
        state: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        decay: &[f32],
        beta: f32,
        u: &mut [f32],
        out: &mut [f32],
    ) {
        let (dk, dv) = (k.len(), v.len());
        assert!(
            state.len() == dk * dv
                && q.len() == dk
                && decay.len() == dk
                && u.len() == dv
                && out.len() == dv,
            "kda_step: state {} for [{dk}, {dv}]",
            state.len()
        );
        u.fill(0.0);
        for ((row, &a), &ki) in state.chunks_exact_mut(dv).zip(decay).zip(k) {
            for s in row.iter_mut() {
                *s *= a;
            }
            self.axpy(ki, row, u);
        }
        for (d, &vj) in u.iter_mut().zip(v) {
            *d = (vj - *d) * beta;
        }
        out.fill(0.0);
        for ((row, &ki), &qi) in state.chunks_exact_mut(dv).zip(k).zip(q) {
            self.axpy(ki, u, row);
            self.axpy(qi, row, out);
        }
    }
}

/// Panics unless `cols` is a range of columns of `m`.
fn check_cols(m: &Matrix<'_>, cols: &Range<usize>) {
    assert!(
        cols.start <= cols.end && cols.end <= m.cols(),
        "column range {cols:?} outside {} columns",
        m.cols()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isa_names() {
        for i in Isa::ALL {
            assert_eq!(Isa::from_name(i.name()), Some(i));
        }
        assert_eq!(Isa::from_name("neon"), None);
        assert!(Isa::available().contains(&Isa::Scalar));
        assert!(Isa::best().is_available());
    }

    #[test]
    fn matmul_batch_and_range() {
        let k = Kernels::new(Isa::Scalar).unwrap();
        let w: Vec<u8> = (0..12).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let m = Matrix::dense(Codes::F32, &w, 3, 4).unwrap();
        let x = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0];
        let mut y = [0f32; 4];
        k.matmul(&m, &x, &mut y, 1..3);
        assert_eq!(y, [4.0 + 7.0, 8.0 + 11.0, 5.0, 9.0]);
    }

    #[test]
    fn layout_errors() {
        assert!(Matrix::dense(Codes::F32, &[0; 7], 1, 2).is_err());
        assert!(Matrix::dense(Codes::Int4, &[0; 1], 1, 2).is_err());
        let s = Scales {
            data: &[0; 2],
            ty: ScaleType::BF16,
            group_cols: 24,
            group_rows: 1,
        };
        assert!(Matrix::quantized(Codes::Int4, &[0; 16], 1, 32, s).is_err());
        let s = Scales {
            data: &[0; 2],
            ty: ScaleType::BF16,
            group_cols: 32,
            group_rows: 1,
        };
        assert!(Matrix::quantized(Codes::Int4, &[0; 16], 1, 32, s).is_ok());
        assert!(Matrix::quantized(Codes::Int4, &[0; 16], 1, 31, s).is_err());
    }
}
