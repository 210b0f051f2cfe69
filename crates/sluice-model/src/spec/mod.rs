//! The vocabulary of stored tensors, below every model part: how to view a piece of a blob as
//! a matrix, a vector or a table ([`MatSpec`], [`VecSpec`], [`TableSpec`]), the byte ranges of a
//! part ([`PartLayout`]), and the builder that names each tensor once and checks it against its
//! role (`builder`, with the stored formats recognised in `linear`). Attention kinds and the
//! loader's layouts (`weights`) both build on it; it depends on neither.

mod builder;
mod linear;

use std::collections::HashMap;

use sluice_format::Checkpoint;
use sluice_kernels::{Codes, Matrix, ScaleType, Scales};
use sluice_store::{Blob, Piece};

use crate::ModelError;

pub(crate) use builder::{
    Ctx, PartBuilder, build_part, check_dtype, check_shape, codes_of, scale_type, tensor_err,
    vector_codes,
};

/// Group scales of a packed matrix: another piece of the same blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleSpec {
    /// Piece holding the scales, row-major `[ceil(rows / group_rows), ceil(cols / group_cols)]`.
    pub piece: usize,
    /// Their element type.
    pub ty: ScaleType,
    /// Rows per scale (1 for per-row groups, 128 for FP8 blocks).
    pub group_rows: usize,
    /// Columns per scale.
    pub group_cols: usize,
}

/// How to view one piece of a blob as a weight matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatSpec {
    /// Piece holding the weights.
    pub piece: usize,
    /// Coding.
    pub codes: Codes,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Scales, for packed codings (FP8, INT4, MXFP4).
    pub scales: Option<ScaleSpec>,
    /// Stored `[cols, rows]` (the `x @ W` layout of GPT-OSS's fused BF16 experts) rather than
    /// `[rows, cols]`.
    pub transposed: bool,
    /// The head dimension of a GGUF query or key projection whose rows llama.cpp's converter
    /// stored in its rotary order (read back in Hugging Face's, see
    /// [`sluice_kernels::Matrix::with_rope_rows`]); 0 for rows as stored.
    pub rope_rows: usize,
}

impl MatSpec {
    /// A dense `[rows, cols]` matrix in piece `piece`.
    pub fn dense(piece: usize, codes: Codes, rows: usize, cols: usize) -> MatSpec {
        MatSpec {
            piece,
            codes,
            rows,
            cols,
            scales: None,
            transposed: false,
            rope_rows: 0,
        }
    }

    /// The matrix in `blob`, as stored (`[cols, rows]` when [`transposed`](Self::transposed)).
    pub fn view<'a>(&self, blob: &'a Blob) -> Result<Matrix<'a>, ModelError> {
        let (r, c) = if self.transposed {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        };
        let data = blob.piece(self.piece);
        Ok(match self.scales {
            None if self.rope_rows > 0 => {
                Matrix::dense(self.codes, data, r, c)?.with_rope_rows(self.rope_rows)?
            }
            None => Matrix::dense(self.codes, data, r, c)?,
            Some(s) => Matrix::quantized(
                self.codes,
                data,
                r,
                c,
                Scales {
                    data: blob.piece(s.piece),
                    ty: s.ty,
                    group_cols: s.group_cols,
                    group_rows: s.group_rows,
                },
            )?,
        })
    }
}

/// How to view one piece of a blob as a vector (norm weights, biases).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VecSpec {
    /// Piece.
    pub piece: usize,
    /// Element coding (F32, BF16 or F16).
    pub codes: Codes,
    /// Elements.
    pub len: usize,
    /// The weight of a zero-centred RMSNorm (Qwen3-Next): what is used is `1 + w`, rounded
    /// once in f32 as transformers computes `1.0 + weight.float()`.
    pub plus_one: bool,
    /// The head dimension of a GGUF query or key bias stored in llama.cpp's rotary order
    /// (read back in Hugging Face's, as [`MatSpec::rope_rows`]); 0 as stored. (A `u32`: the
    /// spec stays 24 bytes.)
    pub rope_rows: u32,
}

impl VecSpec {
    /// The vector as f32 (exact conversion; `1 + w` when [`VecSpec::plus_one`]).
    pub fn to_f32(&self, blob: &Blob) -> Vec<f32> {
        let mut v =
            sluice_kernels::decode::decode_vec(self.codes, blob.piece(self.piece), self.len);
        if self.rope_rows > 0 {
            // Element h·d + j·d/2 + i is stored at h·d + 2i + j.
            let d = self.rope_rows as usize;
            let stored = v.clone();
            for (r, x) in v.iter_mut().enumerate() {
                let (h, l) = (r / d, r % d);
                *x = stored[h * d + 2 * (l % (d / 2)) + l / (d / 2)];
            }
        }
        if self.plus_one {
            for x in &mut v {
                *x += 1.0;
            }
        }
        v
    }

    /// The same vector as the weight of a zero-centred norm when `zero_centred`.
    pub fn norm(self, zero_centred: bool) -> VecSpec {
        VecSpec {
            plus_one: zero_centred,
            ..self
        }
    }
}

/// How to view one piece of a blob as a table of integers `[rows, cols]` (little-endian I32,
/// or I64 when `wide`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSpec {
    /// The tensor, for messages.
    pub name: String,
    /// Piece.
    pub piece: usize,
    /// Eight bytes per entry.
    pub wide: bool,
    /// Rows.
    pub rows: usize,
    /// Entries per row.
    pub cols: usize,
}

impl TableSpec {
    /// Row `r`, each entry checked to be below `limit` (an error names the tensor otherwise).
    pub fn row(&self, blob: &Blob, r: usize, limit: usize) -> Result<Vec<u32>, ModelError> {
        if r >= self.rows {
            return Err(tensor_err(
                &self.name,
                format!("has {} rows, asked for row {r}", self.rows),
            ));
        }
        let data = blob.piece(self.piece);
        let size = if self.wide { 8 } else { 4 };
        let mut out = Vec::with_capacity(self.cols);
        for c in 0..self.cols {
            let at = (r * self.cols + c) * size;
            let v: i64 = match data.get(at..at + size) {
                Some(b) if self.wide => i64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
                Some(b) => i64::from(i32::from_le_bytes(b.try_into().unwrap_or([0; 4]))),
                None => -1,
            };
            if v < 0 || v as u64 >= limit as u64 {
                return Err(tensor_err(
                    &self.name,
                    format!("row {r} holds {v}, not an id below {limit}"),
                ));
            }
            out.push(v as u32);
        }
        Ok(out)
    }
}

/// A part: the tensors read together, sorted by file position, and their indices by name.
#[derive(Debug, Default)]
pub struct PartLayout {
    /// Byte ranges in read order.
    pub pieces: Vec<Piece>,
    index: HashMap<String, usize>,
}

impl PartLayout {
    /// Gathers the named tensors, sorted by (shard, offset) so adjacent tensors merge into one read.
    pub fn new(ck: &Checkpoint, names: &[String]) -> Result<PartLayout, ModelError> {
        let items = names
            .iter()
            .map(|n| {
                ck.tensor(n).map(|t| {
                    (
                        n.clone(),
                        Piece {
                            shard: t.shard as u32,
                            offset: t.offset,
                            len: t.len,
                        },
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PartLayout::from_ranges(items))
    }

    /// Gathers labelled byte ranges (whole tensors or slices of them), sorted by (shard, offset);
    /// a range given twice is read once.
    pub fn from_ranges(mut items: Vec<(String, Piece)>) -> PartLayout {
        items.sort_by_key(|(_, p)| (p.shard, p.offset, p.len));
        let mut pieces: Vec<Piece> = Vec::with_capacity(items.len());
        let mut index = HashMap::with_capacity(items.len());
        for (name, p) in items {
            if pieces.last() != Some(&p) {
                pieces.push(p);
            }
            index.insert(name, pieces.len() - 1);
        }
        PartLayout { pieces, index }
    }

    pub(super) fn piece(&self, name: &str) -> usize {
        // Every name passed to `new` is present.
        self.index[name]
    }

    /// Total bytes.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }

    /// The piece holding the named range, if it is in this part.
    pub fn piece_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// Tensor names in piece order.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<(&str, usize)> = self.index.iter().map(|(n, &i)| (n.as_str(), i)).collect();
        v.sort_by_key(|p| p.1);
        v.into_iter().map(|p| p.0).collect()
    }
}
