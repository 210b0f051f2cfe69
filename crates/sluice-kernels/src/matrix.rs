//! Weight matrices as stored: dense or packed with group scales, borrowed as raw bytes.

use sluice_format::Dtype;

use crate::KernelError;
use crate::gguf::BlockFormat;

/// How the elements of a weight matrix are coded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codes {
    /// IEEE binary32, little-endian.
    F32,
    /// bfloat16, little-endian.
    BF16,
    /// IEEE binary16, little-endian.
    F16,
    /// FP8 E4M3 (`float8_e4m3fn`), one byte per element; needs scales.
    E4M3,
    /// Unsigned 4-bit codes, two per byte (low nibble = even column), value = code − 8; needs
    /// scales. This is compressed-tensors `pack-quantized` (int32 words read little-endian are
    /// the same bytes).
    Int4,
    /// FP4 E2M1 codes, two per byte (low nibble = even column); needs scales (MXFP4).
    E2M1,
    /// Signed 8-bit integers; needs scales.
    I8,
    /// GGUF blocks (Q4_K, IQ2_XS, ...): each block carries its own scales, so the matrix takes
    /// none. A row's values are those `gguf::dequantize_row` gives, and a product dots them by
    /// the contract's 16 lanes — the bits of the dense F32 matrix of the dequantized values.
    Block(BlockFormat),
}

impl Codes {
    /// Whether this coding carries per-group scales.
    pub fn is_quantized(self) -> bool {
        !matches!(
            self,
            Codes::F32 | Codes::BF16 | Codes::F16 | Codes::Block(_)
        )
    }

    /// The coding of a tensor stored as `dtype`, where the dtype alone decides it: F32, BF16
    /// and F16 (dense), F8_E4M3 and I8 (quantized: their matrices need scales). `None` for every
    /// other dtype, including the containers of packed codes ([`Codes::Int4`] in I32 words,
    /// [`Codes::E2M1`] in U8 bytes), which only a checkpoint's layout identifies: see
    /// [`Codes::container`].
    pub fn for_dtype(dtype: Dtype) -> Option<Codes> {
        Some(match dtype {
            Dtype::F32 => Codes::F32,
            Dtype::BF16 => Codes::BF16,
            Dtype::F16 => Codes::F16,
            Dtype::F8E4M3 => Codes::E4M3,
            Dtype::I8 => Codes::I8,
            Dtype::Ggml(t) => match BlockFormat::from_ggml_id(t.id())? {
                // GGUF's plain floats are the dense codings, for the SIMD products.
                BlockFormat::F32 => Codes::F32,
                BlockFormat::F16 => Codes::F16,
                BlockFormat::BF16 => Codes::BF16,
                f => Codes::Block(f),
            },
            _ => return None,
        })
    }

    /// The dtype tensors of this coding are stored as: the dtype itself for the codings of
    /// [`Codes::for_dtype`], I32 for [`Codes::Int4`] (compressed-tensors `pack-quantized`
    /// words) and U8 for [`Codes::E2M1`] (MXFP4 blocks).
    pub fn container(self) -> Dtype {
        match self {
            Codes::F32 => Dtype::F32,
            Codes::BF16 => Dtype::BF16,
            Codes::F16 => Dtype::F16,
            Codes::E4M3 => Dtype::F8E4M3,
            Codes::I8 => Dtype::I8,
            Codes::Int4 => Dtype::I32,
            Codes::E2M1 => Dtype::U8,
            Codes::Block(f) => Dtype::Ggml(f.ggml_type()),
        }
    }

    /// Bytes for one row of `cols` elements.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        match self {
            Codes::F32 => cols.checked_mul(4),
            Codes::BF16 | Codes::F16 => cols.checked_mul(2),
            Codes::E4M3 | Codes::I8 => Some(cols),
            Codes::Int4 | Codes::E2M1 => cols.is_multiple_of(2).then_some(cols / 2),
            Codes::Block(f) => f.row_bytes(cols),
        }
    }
}

/// The element type of group scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleType {
    /// IEEE binary32.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE binary16.
    F16,
    /// E8M0: a biased power of two, `2^(s − 127)`; 255 is NaN (OCP MX).
    E8M0,
}

impl ScaleType {
    /// The scale type of a scale tensor stored as `dtype`: F32, BF16, F16, and E8M0 for both
    /// F8_E8M0 and U8 (biased exponents, as MXFP4 checkpoints store them). `None` otherwise.
    pub fn for_dtype(dtype: Dtype) -> Option<ScaleType> {
        Some(match dtype {
            Dtype::F32 => ScaleType::F32,
            Dtype::BF16 => ScaleType::BF16,
            Dtype::F16 => ScaleType::F16,
            Dtype::F8E8M0 | Dtype::U8 => ScaleType::E8M0,
            _ => return None,
        })
    }

    /// Bytes per scale.
    pub fn size(self) -> usize {
        match self {
            ScaleType::F32 => 4,
            ScaleType::BF16 | ScaleType::F16 => 2,
            ScaleType::E8M0 => 1,
        }
    }
}

/// Group scales of a quantized matrix: one scale per `group_rows` × `group_cols` tile, stored
/// row-major as `[ceil(rows / group_rows), ceil(cols / group_cols)]`.
#[derive(Clone, Copy, Debug)]
pub struct Scales<'a> {
    /// Raw little-endian scale bytes.
    pub data: &'a [u8],
    /// Element type.
    pub ty: ScaleType,
    /// Columns per group (a multiple of 16).
    pub group_cols: usize,
    /// Rows per group (1 for per-row groups, 128 for FP8 block scales).
    pub group_rows: usize,
}

/// A borrowed weight matrix `[rows, cols]`, row-major, in its stored coding.
///
/// Bytes need no alignment. Construction checks every length, so the kernels can rely on them.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    rows: usize,
    cols: usize,
    codes: Codes,
    data: &'a [u8],
    scales: Option<Scales<'a>>,
    /// The head dimension of rows stored in llama.cpp's rotary order (0: rows as stored).
    rope_rows: usize,
}

impl<'a> Matrix<'a> {
    /// A dense matrix (F32, BF16 or F16).
    pub fn dense(
        codes: Codes,
        data: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, KernelError> {
        if codes.is_quantized() {
            return Err(KernelError::Layout(format!("{codes:?} needs scales")));
        }
        Self::check(codes, data, rows, cols, None)
    }

    /// A quantized matrix with group scales.
    pub fn quantized(
        codes: Codes,
        data: &'a [u8],
        rows: usize,
        cols: usize,
        scales: Scales<'a>,
    ) -> Result<Self, KernelError> {
        if !codes.is_quantized() {
            return Err(KernelError::Layout(format!("{codes:?} takes no scales")));
        }
        Self::check(codes, data, rows, cols, Some(scales))
    }

    fn check(
        codes: Codes,
        data: &'a [u8],
        rows: usize,
        cols: usize,
        scales: Option<Scales<'a>>,
    ) -> Result<Self, KernelError> {
        let row_bytes = codes.row_bytes(cols).ok_or_else(|| {
            KernelError::Layout(format!("{codes:?} needs an even column count, got {cols}"))
        })?;
        let want = row_bytes
            .checked_mul(rows)
            .ok_or_else(|| KernelError::Layout("matrix size overflows".into()))?;
        if data.len() != want {
            return Err(KernelError::Layout(format!(
                "{codes:?} [{rows}, {cols}] needs {want} bytes, got {}",
                data.len()
            )));
        }
        if let Some(s) = &scales {
            if s.group_cols == 0 || !s.group_cols.is_multiple_of(16) || s.group_rows == 0 {
                return Err(KernelError::Layout(format!(
                    "group of {}x{} (columns must be a positive multiple of 16)",
                    s.group_rows, s.group_cols
                )));
            }
            let want = rows
                .div_ceil(s.group_rows)
                .checked_mul(cols.div_ceil(s.group_cols))
                .and_then(|n| n.checked_mul(s.ty.size()))
                .ok_or_else(|| KernelError::Layout("scale size overflows".into()))?;
            if s.data.len() != want {
                return Err(KernelError::Layout(format!(
                    "{:?} scales for [{rows}, {cols}] in {}x{} groups need {want} bytes, got {}",
                    s.ty,
                    s.group_rows,
                    s.group_cols,
                    s.data.len()
                )));
            }
        }
        Ok(Matrix {
            rows,
            cols,
            codes,
            data,
            scales,
            rope_rows: 0,
        })
    }

    /// The same matrix read with its rows in Hugging Face's rotary order when they are stored
    /// in llama.cpp's: its converter permutes the query and key projections of Llama-family
    /// models so that each head's rotary pairs are adjacent (stored row `h·d + 2i + j` holds
    /// row `h·d + j·d/2 + i`, `d = head_dim`). Row `r` of the result is that stored row, so
    /// every product gives the bits of the unpermuted matrix. Only for [`Codes::Block`]
    /// matrices (whose products go row by row); `head_dim` must be even and divide the rows.
    pub fn with_rope_rows(self, head_dim: usize) -> Result<Self, KernelError> {
        if !matches!(self.codes, Codes::Block(_)) {
            return Err(KernelError::Layout(format!(
                "{:?}: only GGUF block matrices take a rotary row order",
                self.codes
            )));
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) || !self.rows.is_multiple_of(head_dim) {
            return Err(KernelError::Layout(format!(
                "a rotary row order of head dimension {head_dim} for {} rows",
                self.rows
            )));
        }
        Ok(Matrix {
            rope_rows: head_dim,
            ..self
        })
    }

    /// The stored row holding row `r` (see [`Matrix::with_rope_rows`]).
    #[inline]
    pub fn stored_row(&self, r: usize) -> usize {
        let d = self.rope_rows;
        if d == 0 {
            return r;
        }
        let (h, l) = (r / d, r % d);
        let half = d / 2;
        h * d + 2 * (l % half) + l / half
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The element coding.
    pub fn codes(&self) -> Codes {
        self.codes
    }

    /// The element bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The scales, for quantized codings.
    pub fn scales(&self) -> Option<&Scales<'a>> {
        self.scales.as_ref()
    }

    /// Bytes of one stored row.
    #[inline]
    pub fn row_bytes(&self) -> usize {
        // Checked at construction.
        self.codes.row_bytes(self.cols).unwrap_or(0)
    }

    /// The stored bytes of row `r`.
    #[inline]
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        let r = self.stored_row(r);
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Number of column groups per row (1 for dense matrices).
    pub fn groups_per_row(&self) -> usize {
        self.scales.map_or(1, |s| self.cols.div_ceil(s.group_cols))
    }

    /// The scale bytes for row `r` (one scale per column group).
    #[inline]
    pub fn scale_row(&self, r: usize) -> &'a [u8] {
        match self.scales {
            None => &[],
            Some(s) => {
                let n = self.cols.div_ceil(s.group_cols) * s.ty.size();
                let sr = r / s.group_rows;
                &s.data[sr * n..(sr + 1) * n]
            }
        }
    }

    /// Stored bytes including scales.
    pub fn stored_bytes(&self) -> usize {
        self.data.len() + self.scales.map_or(0, |s| s.data.len())
    }
}
