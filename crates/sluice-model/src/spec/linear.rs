//! Linear layers as checkpoints store them: plain (F32, BF16, F16), FP8 E4M3 with block
//! scales, compressed-tensors pack-quantized INT4 and MXFP4 — recognised from the checkpoint
//! and the model's `quantization_config` together, and checked against the `[rows, cols]` the
//! model needs. The one place the loader knows a stored format.

use sluice_format::{Checkpoint, Dtype};
use sluice_kernels::Codes;

use super::builder::{Ctx, check_dtype, check_shape, mat, scale_type, tensor_err};
use super::{MatSpec, PartLayout, ScaleSpec};
use crate::ModelError;
use crate::quant::{CtScheme, Quantization, Stored};

/// A linear layer's weight as the checkpoint stores it.
#[derive(Clone, Debug)]
pub(super) enum Linear {
    /// `weight` in F32, BF16 or F16.
    Plain { weight: String },
    /// `weight` in FP8 E4M3 with `weight_scale_inv` per block.
    Fp8 {
        weight: String,
        scale: String,
        block: (usize, usize),
    },
    /// compressed-tensors pack-quantized INT4: `weight_packed`, `weight_scale`, `weight_shape`.
    Int4 {
        packed: String,
        scale: String,
        shape: String,
        group: usize,
    },
    /// compressed-tensors MXFP4: `weight_packed`, `weight_scale`.
    Mxfp4 { packed: String, scale: String },
    /// FP4 in an `fp8` checkpoint (`expert_dtype: fp4`, DeepSeek-V4): `weight` in I8, two
    /// E2M1 codes per byte, and `weight_scale_inv` per 32 columns.
    Fp4 { weight: String, scale: String },
}

impl Linear {
    /// The tensors read into the blob. INT4's `weight_shape` is checked at load, not kept.
    pub(super) fn names(&self) -> Vec<String> {
        match self {
            Linear::Plain { weight } => vec![weight.clone()],
            Linear::Fp8 { weight, scale, .. } | Linear::Fp4 { weight, scale } => {
                vec![weight.clone(), scale.clone()]
            }
            Linear::Int4 { packed, scale, .. } | Linear::Mxfp4 { packed, scale } => {
                vec![packed.clone(), scale.clone()]
            }
        }
    }
}

/// Reads `weight_shape` (I64 as compressed-tensors writes it, or I32) of a packed weight.
fn read_weight_shape(ck: &Checkpoint, name: &str) -> Result<Vec<i64>, ModelError> {
    let t = ck.tensor(name)?;
    check_dtype(t, &[Dtype::I64, Dtype::I32], "weight_shape")?;
    check_shape(t, &[2], "")?;
    let bytes = ck.read(t)?;
    Ok(match t.dtype {
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            .collect(),
    })
}

impl<'a> Ctx<'a> {
    /// How the linear layer `module` (its weight is `{module}.weight` when plain) is stored,
    /// as the quantization config and the checkpoint say together.
    pub(super) fn linear(&self, module: &str) -> Result<Linear, ModelError> {
        let ck = self.ck;
        let weight = format!("{module}.weight");
        match self.m.linear(module, true)? {
            Stored::ByDtype => {
                let t = ck.tensor(&weight)?;
                if let (Dtype::I8, Quantization::Fp8 { fp4: true, .. }) = (t.dtype, self.quant) {
                    let scale = format!("{module}.weight_scale_inv");
                    if ck.get(&scale).is_none() {
                        return Err(tensor_err(
                            &scale,
                            format!("missing: `{weight}` is FP4 (I8) and needs its scales"),
                        ));
                    }
                    return Ok(Linear::Fp4 { weight, scale });
                }
                if t.dtype != Dtype::F8E4M3 {
                    return Ok(Linear::Plain { weight });
                }
                let Quantization::Fp8 {
                    block_rows,
                    block_cols,
                    ..
                } = *self.quant
                else {
                    return Err(tensor_err(
                        &weight,
                        "F8_E4M3 weight, but config.json has no quantization_config with \
                         quant_method fp8 (the block size is unknown)",
                    ));
                };
                let scale = format!("{module}.weight_scale_inv");
                if ck.get(&scale).is_none() {
                    return Err(tensor_err(
                        &scale,
                        format!("missing: `{weight}` is F8_E4M3 and needs its block scales"),
                    ));
                }
                Ok(Linear::Fp8 {
                    weight,
                    scale,
                    block: (block_rows, block_cols),
                })
            }
            Stored::Plain => {
                let packed = format!("{module}.weight_packed");
                if ck.get(&weight).is_none() && ck.get(&packed).is_some() {
                    return Err(tensor_err(
                        &weight,
                        format!(
                            "missing: the checkpoint stores `{packed}`, but quantization_config \
                             does not target `{module}` (it is ignored or in no group)"
                        ),
                    ));
                }
                Ok(Linear::Plain { weight })
            }
            Stored::Packed(g) => {
                let packed = format!("{module}.weight_packed");
                let scale = format!("{module}.weight_scale");
                let fmt = match g.scheme {
                    CtScheme::PackInt4 { .. } => "pack-quantized",
                    CtScheme::Mxfp4 => "mxfp4-pack-quantized",
                };
                for n in [&packed, &scale] {
                    if ck.get(n).is_none() {
                        return Err(tensor_err(
                            n,
                            format!(
                                "missing: quantization_config group `{}` ({fmt}) targets `{module}`",
                                g.name
                            ),
                        ));
                    }
                }
                Ok(match g.scheme {
                    CtScheme::PackInt4 { group } => {
                        let shape = format!("{module}.weight_shape");
                        if ck.get(&shape).is_none() {
                            return Err(tensor_err(
                                &shape,
                                format!(
                                    "missing: quantization_config group `{}` ({fmt}) targets \
                                     `{module}`",
                                    g.name
                                ),
                            ));
                        }
                        Linear::Int4 {
                            packed,
                            scale,
                            shape,
                            group,
                        }
                    }
                    CtScheme::Mxfp4 => Linear::Mxfp4 { packed, scale },
                })
            }
        }
    }

    /// Checks a linear layer's tensors against the `[rows, cols]` the model needs and records
    /// its spec in `part`.
    pub(super) fn spec(
        &self,
        part: &PartLayout,
        lin: &Linear,
        rows: usize,
        cols: usize,
    ) -> Result<MatSpec, ModelError> {
        let ck = self.ck;
        match lin {
            Linear::Plain { weight } => mat(ck, part, weight, rows, cols),
            Linear::Fp8 {
                weight,
                scale,
                block: (br, bc),
            } => {
                let t = ck.tensor(weight)?;
                check_shape(t, &[rows, cols], "")?;
                let s = ck.tensor(scale)?;
                let ty = scale_type(s, &[Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F8E8M0])?;
                check_shape(
                    s,
                    &[rows.div_ceil(*br), cols.div_ceil(*bc)],
                    &format!(
                        ": one scale per {br}x{bc} block of the [{rows}, {cols}] weight, \
                         the grid rounded up"
                    ),
                )?;
                Ok(MatSpec {
                    piece: part.piece(weight),
                    codes: Codes::E4M3,
                    rows,
                    cols,
                    scales: Some(ScaleSpec {
                        piece: part.piece(scale),
                        ty,
                        group_rows: *br,
                        group_cols: *bc,
                    }),
                    transposed: false,
                    rope_rows: 0,
                })
            }
            Linear::Int4 {
                packed,
                scale,
                shape,
                group,
            } => {
                let ws = read_weight_shape(ck, shape)?;
                if ws != [rows as i64, cols as i64] {
                    return Err(tensor_err(
                        shape,
                        format!("says {ws:?}, but the model needs [{rows}, {cols}]"),
                    ));
                }
                let p = ck.tensor(packed)?;
                check_dtype(p, &[Dtype::I32], "pack-quantized INT4 codes")?;
                if !cols.is_multiple_of(8) {
                    return Err(tensor_err(
                        packed,
                        format!("{cols} columns are not a whole number of int32 words of 8 codes"),
                    ));
                }
                check_shape(
                    p,
                    &[rows, cols / 8],
                    &format!(" (weight_shape [{rows}, {cols}], eight 4-bit codes per int32)"),
                )?;
                let s = ck.tensor(scale)?;
                let ty = scale_type(s, &[Dtype::BF16, Dtype::F16, Dtype::F32])?;
                check_shape(
                    s,
                    &[rows, cols.div_ceil(*group)],
                    &format!(": one scale per {group} columns of [{rows}, {cols}]"),
                )?;
                Ok(MatSpec {
                    piece: part.piece(packed),
                    codes: Codes::Int4,
                    rows,
                    cols,
                    scales: Some(ScaleSpec {
                        piece: part.piece(scale),
                        ty,
                        group_rows: 1,
                        group_cols: *group,
                    }),
                    transposed: false,
                    rope_rows: 0,
                })
            }
            Linear::Mxfp4 { packed, scale }
            | Linear::Fp4 {
                weight: packed,
                scale,
            } => {
                let fp4 = matches!(lin, Linear::Fp4 { .. });
                let p = ck.tensor(packed)?;
                if fp4 {
                    check_dtype(p, &[Dtype::I8], "FP4 codes (expert_dtype fp4)")?;
                } else {
                    check_dtype(p, &[Dtype::U8], "MXFP4 codes")?;
                }
                if !cols.is_multiple_of(2) {
                    return Err(tensor_err(packed, format!("{cols} columns are odd")));
                }
                check_shape(p, &[rows, cols / 2], " (two E2M1 codes per byte)")?;
                let s = ck.tensor(scale)?;
                let ty = if fp4 {
                    // transformers keeps them F32 unless `scale_fmt` is ue8m0.
                    scale_type(s, &[Dtype::F8E8M0, Dtype::F32])?
                } else {
                    scale_type(s, &[Dtype::U8, Dtype::F8E8M0])?
                };
                check_shape(
                    s,
                    &[rows, cols.div_ceil(32)],
                    &format!(": one scale per 32 columns of [{rows}, {cols}]"),
                )?;
                Ok(MatSpec {
                    piece: part.piece(packed),
                    codes: Codes::E2M1,
                    rows,
                    cols,
                    scales: Some(ScaleSpec {
                        piece: part.piece(scale),
                        ty,
                        group_rows: 1,
                        group_cols: 32,
                    }),
                    transposed: false,
                    rope_rows: 0,
                })
            }
        }
    }
}
