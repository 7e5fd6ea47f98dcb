//! The harness shared by every ssmk fuzz target: decoding a call from the fuzz input
//! ([`input`], [`batch`]), laying its tensors out in one guarded allocation and checking the
//! invariants of a refused or accepted call against the scalar reference ([`call`]), and the
//! one place each export is called from ([`exports`]).

// The checks walk byte ranges of several parallel maps by one offset, as the library's kernels do.
#![allow(clippy::needless_range_loop)]

pub mod batch;
pub mod call;
pub mod exports;
pub mod input;
pub mod memory;
pub mod recurrent;
