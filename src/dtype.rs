//! Element types: the DLPack dtypes the ABI accepts, and the `Element` trait through which the
//! kernels load any activation dtype as f32 and store f32 back with round-to-nearest-even.

use half::{bf16, f16};

/// A dtype the ABI accepts (ABI.md §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
    Bool,
    U8,
}

impl DType {
    /// Decodes DLPack's `(code, bits, lanes)`.
    pub fn from_dlpack(code: u8, bits: u8, lanes: u16) -> Option<DType> {
        if lanes != 1 {
            return None;
        }
        Some(match (code, bits) {
            (2, 32) => DType::F32,
            (2, 16) => DType::F16,
            (4, 16) => DType::BF16,
            (0, 32) => DType::I32,
            (0, 64) => DType::I64,
            (6, 8) => DType::Bool,
            (1, 8) => DType::U8,
            _ => return None,
        })
    }

    /// DLPack `(code, bits)`.
    pub fn to_dlpack(self) -> (u8, u8) {
        match self {
            DType::F32 => (2, 32),
            DType::F16 => (2, 16),
            DType::BF16 => (4, 16),
            DType::I32 => (0, 32),
            DType::I64 => (0, 64),
            DType::Bool => (6, 8),
            DType::U8 => (1, 8),
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::Bool | DType::U8 => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::Bool => "bool",
            DType::U8 => "uint8",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
}

/// A floating-point storage type: loaded as f32, computed in f32, stored with round-to-nearest-even.
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_bits(f32_to_bf16_bits(x))
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

/// f32 → bf16 bits, round to nearest even; NaN stays NaN (quietened). Written branch-light so
/// loops over it vectorise.
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if (b & 0x7fff_ffff) > 0x7f80_0000 {
        return ((b >> 16) | 0x0040) as u16;
    }
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (rounded >> 16) as u16
}

/// Calls `$body` with the type alias `$T` bound to the Rust type of a float `DType`; the one place
/// that turns a run-time dtype into a monomorphised kernel.
#[macro_export]
macro_rules! with_float_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::dtype::DType::F16 => {
                type $T = half::f16;
                $body
            }
            other => unreachable!("with_float_type! on validated non-float dtype {other:?}"),
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half() {
        for i in 0..400_000u32 {
            let x = i.wrapping_mul(2_654_435_761);
            let f = f32::from_bits(x);
            if f.is_nan() {
                continue;
            }
            assert_eq!(f32_to_bf16_bits(f), bf16::from_f32(f).to_bits(), "{x:#x}");
        }
        assert!(bf16::from_bits(f32_to_bf16_bits(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16_bits(f32::INFINITY), 0x7f80);
        // Ties go to even.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
    }

    #[test]
    fn dlpack_codes_roundtrip() {
        for d in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
            DType::Bool,
            DType::U8,
        ] {
            let (c, b) = d.to_dlpack();
            assert_eq!(DType::from_dlpack(c, b, 1), Some(d));
            assert_eq!(b as usize, d.size() * 8);
            assert_eq!(DType::from_dlpack(c, b, 2), None);
        }
    }
}
