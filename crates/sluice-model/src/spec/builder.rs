//! Building a part (a layer, the head, the embedding table, one expert) in one pass: each
//! tensor is named once, by the code that knows its role, with the shape that role needs.
//!
//! The declaring function runs twice. The first run collects the names (and recognises how
//! each linear layer is stored), so that the part's byte ranges can be sorted by file
//! position and adjacent tensors merged into one read; the second run checks every tensor
//! against its role and returns the specs, pointing into the part's pieces. Nothing is read
//! from the shards in the first run.

use std::collections::HashMap;

use sluice_format::{Checkpoint, Dtype, TensorInfo};
use sluice_kernels::gguf::BlockFormat;
use sluice_kernels::{Codes, ScaleType};

use super::linear::Linear;
use super::{MatSpec, PartLayout, TableSpec, VecSpec};
use crate::ModelError;
use crate::quant::{Matcher, Quantization};

/// What every part is built from: the checkpoint and how its weights are quantized.
pub(crate) struct Ctx<'a> {
    pub(crate) ck: &'a Checkpoint,
    pub(crate) quant: &'a Quantization,
    pub(crate) m: Matcher<'a>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(ck: &'a Checkpoint, quant: &'a Quantization) -> Ctx<'a> {
        Ctx {
            ck,
            quant,
            m: Matcher::new(quant),
        }
    }
}

/// Declares the tensors of one part; see the module documentation.
pub(crate) struct PartBuilder<'c, 'a> {
    ctx: &'c Ctx<'a>,
    names: Vec<String>,
    linears: HashMap<String, Linear>,
    /// `Some` on the second run.
    layout: Option<PartLayout>,
}

/// Builds one part: `declare` names its tensors through the builder and returns their specs.
pub(crate) fn build_part<T>(
    ctx: &Ctx<'_>,
    declare: impl Fn(&mut PartBuilder<'_, '_>) -> Result<T, ModelError>,
) -> Result<(PartLayout, T), ModelError> {
    let mut p = PartBuilder {
        ctx,
        names: Vec::new(),
        linears: HashMap::new(),
        layout: None,
    };
    declare(&mut p)?;
    p.layout = Some(PartLayout::new(ctx.ck, &p.names)?);
    let specs = declare(&mut p)?;
    let layout = p.layout.take().unwrap_or_default();
    Ok((layout, specs))
}

impl PartBuilder<'_, '_> {
    /// The checkpoint.
    pub(crate) fn checkpoint(&self) -> &Checkpoint {
        self.ctx.ck
    }

    /// Whether this is the second run (specs are real, tensors may be read and checked).
    pub(crate) fn resolving(&self) -> bool {
        self.layout.is_some()
    }

    fn declare(&mut self, name: &str) {
        if self.layout.is_none() {
            self.names.push(name.to_owned());
        }
    }

    /// A linear layer `module` (`{module}.weight` when plain) of `[rows, cols]`, stored in any
    /// format the checkpoint and `quantization_config` say.
    pub(crate) fn linear(
        &mut self,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<MatSpec, ModelError> {
        match &self.layout {
            None => {
                let lin = self.ctx.linear(module)?;
                self.names.extend(lin.names());
                self.linears.insert(module.to_owned(), lin);
                Ok(MatSpec::dense(0, Codes::F32, rows, cols))
            }
            Some(layout) => {
                let lin = self
                    .linears
                    .get(module)
                    .ok_or_else(|| ModelError::Mismatch {
                        what: format!("{module} was not declared on the first run"),
                    })?;
                self.ctx.spec(layout, lin, rows, cols)
            }
        }
    }

    /// A plain `[rows, cols]` matrix tensor in F32, BF16 or F16 (a router, the embeddings).
    pub(crate) fn matrix(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<MatSpec, ModelError> {
        self.declare(name);
        match &self.layout {
            None => Ok(MatSpec::dense(0, Codes::F32, rows, cols)),
            Some(layout) => mat(self.ctx.ck, layout, name, rows, cols),
        }
    }

    /// A vector tensor of exactly `[len]` in F32, BF16 or F16 (a norm, a bias).
    pub(crate) fn vector(&mut self, name: &str, len: usize) -> Result<VecSpec, ModelError> {
        self.declare(name);
        match &self.layout {
            None => Ok(placeholder(len)),
            Some(layout) => vec(self.ctx.ck, layout, name, len),
        }
    }

    /// A vector stored in any shape of `numel(want)` elements: `[1, n]` projections, `[c, 1, k]`
    /// convolution taps, transformers' `[1, 1, h, 1]` `A_log`. A shape of another rank is
    /// accepted when its element count matches (checkpoints disagree on these singleton
    /// dimensions).
    pub(crate) fn vector_any(&mut self, name: &str, want: &[usize]) -> Result<VecSpec, ModelError> {
        self.declare(name);
        let len: usize = want.iter().product();
        let Some(layout) = &self.layout else {
            return Ok(placeholder(len));
        };
        let t = self.ctx.ck.tensor(name)?;
        let n: usize = t.shape.iter().product();
        if n != len {
            return Err(tensor_err(
                name,
                format!("shape {:?} ({n} elements), expected {want:?}", t.shape),
            ));
        }
        check_dtype(t, &[Dtype::F32, Dtype::BF16, Dtype::F16], "a vector")?;
        Ok(VecSpec {
            piece: layout.piece(name),
            codes: codes_of(t)?,
            len,
            plus_one: false,
            rope_rows: 0,
        })
    }

    /// An integer table of exactly `[rows, cols]` in I32 or I64 (DeepSeek-V4's `tid2eid`).
    pub(crate) fn table(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<TableSpec, ModelError> {
        self.declare(name);
        let Some(layout) = &self.layout else {
            return Ok(TableSpec {
                name: name.to_owned(),
                piece: 0,
                wide: false,
                rows,
                cols,
            });
        };
        let t = self.ctx.ck.tensor(name)?;
        check_shape(t, &[rows, cols], "")?;
        check_dtype(t, &[Dtype::I32, Dtype::I64], "an id table")?;
        Ok(TableSpec {
            // As stored, for messages.
            name: t.name.clone(),
            piece: layout.piece(name),
            wide: t.dtype == Dtype::I64,
            rows,
            cols,
        })
    }

    /// [`PartBuilder::vector`] when the checkpoint has `name`, else `None`.
    pub(crate) fn optional_vector(
        &mut self,
        name: &str,
        len: usize,
    ) -> Result<Option<VecSpec>, ModelError> {
        if self.ctx.ck.get(name).is_none() {
            return Ok(None);
        }
        self.vector(name, len).map(Some)
    }

    /// The first `len` elements of the vector tensor `name` coded `codes`, which the caller
    /// has checked.
    pub(crate) fn vector_as(&mut self, name: &str, codes: Codes, len: usize) -> VecSpec {
        self.declare(name);
        match &self.layout {
            None => placeholder(len),
            Some(layout) => VecSpec {
                piece: layout.piece(name),
                codes,
                len,
                plus_one: false,
                rope_rows: 0,
            },
        }
    }
}

fn placeholder(len: usize) -> VecSpec {
    VecSpec {
        piece: 0,
        codes: Codes::F32,
        len,
        plus_one: false,
        rope_rows: 0,
    }
}

/// The element codes of a vector tensor (F32, BF16 or F16), checked.
pub(crate) fn vector_codes(t: &TensorInfo) -> Result<Codes, ModelError> {
    check_dtype(t, &[Dtype::F32, Dtype::BF16, Dtype::F16], "a vector")?;
    codes_of(t)
}

/// The coding of a plain (dense, unscaled) weight: F32, BF16 or F16.
pub(crate) fn codes_of(t: &TensorInfo) -> Result<Codes, ModelError> {
    Codes::for_dtype(t.dtype)
        .filter(|c| matches!(c, Codes::F32 | Codes::BF16 | Codes::F16))
        .ok_or_else(|| ModelError::Tensor {
            tensor: t.name.clone(),
            msg: format!(
                "dtype {} is not supported for a weight matrix here",
                t.dtype
            ),
        })
}

pub(crate) fn tensor_err(tensor: &str, msg: impl Into<String>) -> ModelError {
    ModelError::Tensor {
        tensor: tensor.to_owned(),
        msg: msg.into(),
    }
}

pub(crate) fn check_shape(t: &TensorInfo, want: &[usize], why: &str) -> Result<(), ModelError> {
    if t.shape != want {
        return Err(tensor_err(
            &t.name,
            format!("shape {:?}, expected {want:?}{why}", t.shape),
        ));
    }
    Ok(())
}

pub(crate) fn check_dtype(t: &TensorInfo, allowed: &[Dtype], role: &str) -> Result<(), ModelError> {
    if !allowed.contains(&t.dtype) {
        let names: Vec<&str> = allowed.iter().map(|d| d.safetensors_name()).collect();
        return Err(tensor_err(
            &t.name,
            format!(
                "dtype {} for {role}, expected {}",
                t.dtype,
                names.join(" or ")
            ),
        ));
    }
    Ok(())
}

/// The scale type of a scale tensor, its dtype one of `allowed`.
pub(crate) fn scale_type(t: &TensorInfo, allowed: &[Dtype]) -> Result<ScaleType, ModelError> {
    check_dtype(t, allowed, "scales")?;
    ScaleType::for_dtype(t.dtype)
        .ok_or_else(|| tensor_err(&t.name, format!("dtype {} is not a scale type", t.dtype)))
}

/// Checks a plain matrix tensor's shape and dtype and records its spec.
pub(crate) fn mat(
    ck: &Checkpoint,
    part: &PartLayout,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<MatSpec, ModelError> {
    let t = ck.tensor(name)?;
    check_shape(t, &[rows, cols], "")?;
    let mut spec = MatSpec::dense(part.piece(name), matrix_codes(t)?, rows, cols);
    if let Some(d) = ck.rope_rows(name) {
        // Rows read in another order go row by row: as GGUF blocks, whatever the type.
        let f = match spec.codes {
            Codes::F32 => BlockFormat::F32,
            Codes::F16 => BlockFormat::F16,
            Codes::BF16 => BlockFormat::BF16,
            Codes::Block(f) => f,
            c => return Err(tensor_err(name, format!("{c:?} rows cannot be reordered"))),
        };
        if d == 0 || !d.is_multiple_of(2) || !rows.is_multiple_of(d) {
            return Err(tensor_err(
                name,
                format!("{rows} rows are not whole heads of an even dimension {d}"),
            ));
        }
        spec.codes = Codes::Block(f);
        spec.rope_rows = d;
    }
    Ok(spec)
}

/// The coding of a weight matrix stored as it is used: F32, BF16, F16, or a GGUF block type.
fn matrix_codes(t: &TensorInfo) -> Result<Codes, ModelError> {
    match t.dtype {
        Dtype::Ggml(g) => Codes::for_dtype(t.dtype).ok_or_else(|| {
            tensor_err(
                &t.name,
                format!(
                    "GGUF type {g} is not supported (sluice decodes {})",
                    gguf_types()
                ),
            )
        }),
        _ => codes_of(t),
    }
}

/// The GGUF types the kernels decode, for messages.
fn gguf_types() -> String {
    BlockFormat::ALL
        .iter()
        .map(|f| f.ggml_type().name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks a vector tensor's shape and dtype and records its spec.
fn vec(ck: &Checkpoint, part: &PartLayout, name: &str, len: usize) -> Result<VecSpec, ModelError> {
    let t = ck.tensor(name)?;
    check_shape(t, &[len], "")?;
    check_dtype(t, &[Dtype::F32, Dtype::BF16, Dtype::F16], "a vector")?;
    let rope_rows = match ck.rope_rows(name) {
        Some(d)
            if d > 0 && d.is_multiple_of(2) && len.is_multiple_of(d) && d <= u32::MAX as usize =>
        {
            d as u32
        }
        Some(d) => {
            return Err(tensor_err(
                name,
                format!("{len} values are not whole heads of an even dimension {d}"),
            ));
        }
        None => 0,
    };
    Ok(VecSpec {
        piece: part.piece(name),
        codes: codes_of(t)?,
        len,
        plus_one: false,
        rope_rows,
    })
}
