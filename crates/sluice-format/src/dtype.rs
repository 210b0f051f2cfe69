//! Element types of stored tensors.

use std::fmt;

use crate::gguf::GgmlType;

/// The element type of a stored tensor, as named in a safetensors header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// Boolean stored as one byte.
    Bool,
    /// IEEE 754 binary64.
    F64,
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16: the upper half of a binary32.
    BF16,
    /// FP8 E4M3 without infinities (`float8_e4m3fn`).
    F8E4M3,
    /// FP8 E5M2.
    F8E5M2,
    /// FP8 E8M0: a biased power-of-two exponent (MX scales).
    F8E8M0,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// A ggml type of a GGUF file (a block format such as Q4_K, or F32/F16/BF16 as GGUF
    /// stores them): never in a safetensors header.
    Ggml(GgmlType),
}

impl Dtype {
    /// Parses a safetensors dtype name (`"BF16"`, `"F8_E4M3"`, ...). `None` when unknown.
    pub fn from_safetensors(name: &str) -> Option<Dtype> {
        Some(match name {
            "BOOL" => Dtype::Bool,
            "F64" => Dtype::F64,
            "F32" => Dtype::F32,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E5M2" => Dtype::F8E5M2,
            "F8_E8M0" => Dtype::F8E8M0,
            "I8" => Dtype::I8,
            "U8" => Dtype::U8,
            "I16" => Dtype::I16,
            "U16" => Dtype::U16,
            "I32" => Dtype::I32,
            "U32" => Dtype::U32,
            "I64" => Dtype::I64,
            "U64" => Dtype::U64,
            _ => return None,
        })
    }

    /// The safetensors name of this dtype.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::F64 => "F64",
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::I8 => "I8",
            Dtype::U8 => "U8",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
            Dtype::Ggml(t) => t.name(),
        }
    }

    /// The ggml type, for a tensor of a GGUF file.
    pub fn ggml(self) -> Option<GgmlType> {
        match self {
            Dtype::Ggml(t) => Some(t),
            _ => None,
        }
    }

    /// Bytes per element; for a ggml block type ([`Dtype::Ggml`]), bytes per block of
    /// `GgmlType::block_size` elements.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::F8E8M0 | Dtype::I8 | Dtype::U8 => {
                1
            }
            Dtype::F16 | Dtype::BF16 | Dtype::I16 | Dtype::U16 => 2,
            Dtype::F32 | Dtype::I32 | Dtype::U32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
            Dtype::Ggml(t) => t.type_size() as usize,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.safetensors_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in [
            "BOOL", "F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I8", "U8",
            "I16", "U16", "I32", "U32", "I64", "U64",
        ] {
            let d = Dtype::from_safetensors(name).unwrap();
            assert_eq!(d.safetensors_name(), name);
        }
        assert_eq!(Dtype::from_safetensors("bf16"), None);
        assert_eq!(Dtype::from_safetensors("F4"), None);
    }
}
