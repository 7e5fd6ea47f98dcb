//! ssmk — state-space model kernels.
//!
//! Fast, safe CPU kernels for the recurrent layers of hybrid LLMs (Gated DeltaNet, LFM2 ShortConv,
//! Mamba-2's causal conv), shipped as a C-ABI shared library. The contract is the C ABI in
//! `include/ssmk.h`; this crate is organised so that the exported layer (`ffi`) only validates
//! descriptors (`tensor`) and dispatches, while the math lives in `kernels`, which knows nothing of C.

// Kernels index several parallel arrays by one counter; iterator chains would obscure the math.
#![allow(clippy::needless_range_loop)]

pub mod dtype;
pub mod error;
pub mod ffi;
pub mod kernels;
pub mod runtime;
pub mod tensor;

pub use error::{Error, Result, Status};
