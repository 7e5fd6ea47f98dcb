//! The exported C surface. Each export is a thin shell: validate every descriptor (`tensor`),
//! then call a kernel. All go through `guard::guard` (tests enforce it), so no panic crosses the
//! ABI and every failure sets the thread-local message.

pub(crate) mod guard;

pub mod context;
pub mod conv;
pub mod dplr;
pub mod gdn;
pub mod mamba2;
pub mod memory;
pub mod sequences;
pub mod short_conv;
pub mod status;
mod views;

pub use context::ssmk_context;
