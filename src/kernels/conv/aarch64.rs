//! The aarch64 entry points of the conv kernels: NEON, instantiating the generic block kernel of
//! `vector.rs`.

pub(super) mod neon {
    use crate::kernels::simd::Neon;
    conv_entry_points!(Neon, Neon, "neon");
}
