//! The x86-64 entry points of the conv kernels: AVX2 (bf16 in channel pairs, see `Avx2Pairs`)
//! and AVX-512, each instantiating the generic block kernel of `vector.rs`.

pub(super) mod avx2 {
    use crate::kernels::simd::{Avx2, Avx2Pairs};
    conv_entry_points!(Avx2, Avx2Pairs, "avx2,fma,f16c");
}

pub(super) mod avx512 {
    use crate::kernels::simd::Avx512;
    conv_entry_points!(
        Avx512,
        Avx512,
        "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
    );
}
