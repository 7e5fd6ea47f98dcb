//! The x86-64 entry points of the DPLR delta rule: the generic recurrence instantiated for AVX2
//! and AVX-512.

use super::{HeadFn, dplr_entry_points};
use crate::runtime::Isa;

dplr_entry_points!(avx2, crate::kernels::simd::Avx2, "avx2,fma,f16c");
dplr_entry_points!(
    avx512,
    crate::kernels::simd::Avx512,
    "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
);

/// The recurrence for `isa` (AVX-512, or AVX2 for anything below).
pub(super) fn head(isa: Isa) -> HeadFn {
    match isa >= Isa::Avx512 {
        true => avx512::HEADS,
        false => avx2::HEADS,
    }
}
