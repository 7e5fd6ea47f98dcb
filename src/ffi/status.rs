//! Status codes, their descriptions, the last-error message, and version/ISA introspection.

use std::ffi::c_char;

use super::guard::{guard_value, last_error_ptr};
use crate::error::Status;
use crate::runtime::Isa;

/// Success.
pub const SSMK_OK: i32 = 0;
/// A required pointer is NULL.
pub const SSMK_ERR_NULL_POINTER: i32 = -1;
/// Shape, stride, ndim or value inconsistent.
pub const SSMK_ERR_INVALID_ARGUMENT: i32 = -2;
/// A dtype that this argument does not accept.
pub const SSMK_ERR_UNSUPPORTED_DTYPE: i32 = -3;
/// An index, slot id, block id or sequence offset outside its range.
pub const SSMK_ERR_OUT_OF_BOUNDS: i32 = -4;
/// A size computation overflows.
pub const SSMK_ERR_OVERFLOW: i32 = -5;
/// An output overlaps an input or itself where that is not allowed.
pub const SSMK_ERR_ALIASING: i32 = -6;
/// A device other than CPU (1) or CUDA host-pinned (3).
pub const SSMK_ERR_UNSUPPORTED_DEVICE: i32 = -7;
/// Memory allocation failed.
pub const SSMK_ERR_ALLOCATION: i32 = -8;
/// An internal bug was caught at the boundary; nothing unwound into the caller.
pub const SSMK_ERR_PANIC: i32 = -99;

/// `ssmk_tensor.device.device_type` for ordinary CPU memory.
pub const SSMK_DEVICE_CPU: i32 = 1;
/// `ssmk_tensor.device.device_type` for CUDA host-pinned memory (read and written by the CPU).
pub const SSMK_DEVICE_CUDA_HOST: i32 = 3;
/// DLPack type codes for `ssmk_dtype.code`.
pub const SSMK_DTYPE_CODE_INT: u8 = 0;
pub const SSMK_DTYPE_CODE_UINT: u8 = 1;
pub const SSMK_DTYPE_CODE_FLOAT: u8 = 2;
pub const SSMK_DTYPE_CODE_BFLOAT: u8 = 4;
pub const SSMK_DTYPE_CODE_BOOL: u8 = 6;

/// Describes a status code.
///
/// @param status any integer; unknown codes give "unknown ssmk status".
/// @return a static NUL-terminated string, never NULL, never to be freed. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ssmk_status_str(status: i32) -> *const c_char {
    guard_value(c"unknown ssmk status".as_ptr(), || {
        Status::from_code(status).map_or(c"unknown ssmk status".as_ptr(), |s| s.describe().as_ptr())
    })
}

/// Details of the last failed ssmk call on the calling thread: names the argument and the
/// expected and actual values, e.g. `conv_states.shape[2] = 4096, expected dim = 8192`.
///
/// @return a NUL-terminated string owned by the library, "" after a successful call; valid until
/// the next ssmk call on this thread. Never NULL. Thread-local, so thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ssmk_last_error_message() -> *const c_char {
    guard_value(c"".as_ptr(), last_error_ptr)
}

/// Library version, "MAJOR.MINOR.PATCH"; compare with the SSMK_VERSION_* macros of the header you
/// compiled against.
///
/// @return a static NUL-terminated string, never NULL. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ssmk_version() -> *const c_char {
    guard_value(c"".as_ptr(), || {
        const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
        VERSION.as_ptr().cast()
    })
}

/// Instruction set the kernels use: "scalar", "avx2" (AVX2 + FMA + F16C), "avx512" or
/// "avx512_bf16" (AVX-512 with AVX512_BF16's bf16 dot product, used for the products of two bf16
/// inputs; by default only on AMD, where it outruns f32 FMA) on x86-64, "scalar" or "neon" on
/// aarch64. Detected once per process; the environment variable
/// `SSMK_MAX_ISA=scalar|avx2|avx512|avx512_bf16|neon` read at that moment selects
/// `avx512_bf16` where the CPU has it, and otherwise may lower the level, never raise it (a
/// level of another architecture lowers it to "scalar").
///
/// @return a static NUL-terminated string, never NULL. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ssmk_active_isa() -> *const c_char {
    guard_value(c"scalar".as_ptr(), || match Isa::active() {
        Isa::Scalar => c"scalar".as_ptr(),
        Isa::Avx2 => c"avx2".as_ptr(),
        Isa::Avx512 => c"avx512".as_ptr(),
        Isa::Avx512Bf16 => c"avx512_bf16".as_ptr(),
        Isa::Neon => c"neon".as_ptr(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn constants_match_internal_codes() {
        let exported = [
            SSMK_OK,
            SSMK_ERR_NULL_POINTER,
            SSMK_ERR_INVALID_ARGUMENT,
            SSMK_ERR_UNSUPPORTED_DTYPE,
            SSMK_ERR_OUT_OF_BOUNDS,
            SSMK_ERR_OVERFLOW,
            SSMK_ERR_ALIASING,
            SSMK_ERR_UNSUPPORTED_DEVICE,
            SSMK_ERR_ALLOCATION,
            SSMK_ERR_PANIC,
        ];
        let internal: Vec<i32> = Status::ALL.iter().map(|&s| s as i32).collect();
        assert_eq!(exported.to_vec(), internal);
        for s in Status::ALL {
            let text = unsafe { CStr::from_ptr(ssmk_status_str(s as i32)) }
                .to_str()
                .unwrap();
            assert!(text.starts_with("SSMK_"), "{text}");
        }
        let unknown = unsafe { CStr::from_ptr(ssmk_status_str(12345)) };
        assert_eq!(unknown.to_str().unwrap(), "unknown ssmk status");
    }

    #[test]
    fn version_matches_cargo() {
        let v = unsafe { CStr::from_ptr(ssmk_version()) }.to_str().unwrap();
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
    }
}
