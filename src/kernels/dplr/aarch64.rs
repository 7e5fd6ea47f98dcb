//! The aarch64 entry point of the DPLR delta rule: the generic recurrence instantiated for NEON.

use super::{HeadFn, dplr_entry_points};
use crate::runtime::Isa;

dplr_entry_points!(neon, crate::kernels::simd::Neon, "neon");

/// The recurrence for `isa` (NEON, the one SIMD level).
pub(super) fn head(_isa: Isa) -> HeadFn {
    neon::HEADS
}
