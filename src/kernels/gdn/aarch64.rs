//! The aarch64 entry points of the delta rule and KDA's gating: the generic bodies instantiated
//! for NEON.

use super::driver::Kernels;
use crate::runtime::Isa;

gdn_entry_points!(neon, crate::kernels::simd::Neon, "neon");

/// The entry points of `isa` (NEON, the one SIMD level).
pub(super) fn kernels(_isa: Isa) -> &'static Kernels {
    &neon::KERNELS
}
