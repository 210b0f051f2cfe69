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

pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod generic;
