//! The x86-64 entry points of the delta rule and KDA's gating: the generic bodies instantiated
//! for AVX2 and AVX-512.

use super::driver::Kernels;
use crate::runtime::Isa;

gdn_entry_points!(avx2, crate::kernels::simd::Avx2, "avx2,fma,f16c");
gdn_entry_points!(
    avx512,
    crate::kernels::simd::Avx512,
    "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
);
gdn_entry_points!(
    avx512_bf16,
    crate::kernels::simd::Avx512Bf16,
    "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c"
);

/// The entry points of `isa` (AVX-512 with or without AVX512_BF16, or AVX2 for anything below).
pub(super) fn kernels(isa: Isa) -> &'static Kernels {
    if isa >= Isa::Avx512Bf16 {
        &avx512_bf16::KERNELS
    } else if isa >= Isa::Avx512 {
        &avx512::KERNELS
    } else {
        &avx2::KERNELS
    }
}
