//! The generalized (diagonal plus low-rank) delta rule of RWKV-7 (ABI.md §4.11), for prefill,
//! decode and speculative decode. Per (sequence, head), per token:
//! `sa = a^T S`, `S = diag(d) S + b (x) sa + k (x) v`, `o = scale * S^T r`, with the decay
//! `d = exp(w)` (log form) or `d = w` (`SSMK_DPLR_W_LINEAR`).
//!
//! Two implementations of that one recurrence:
//! - [`reference`]: the per-token recurrence in f64, the crate's oracle (`Isa::Scalar`).
//! - `recurrent`: the same recurrence in f32 SIMD, generic over [`crate::kernels::simd::Simd`],
//!   instantiated per instruction set by `dplr_entry_points!` (`x86.rs`, `aarch64.rs`), and
//!   `decode`, which runs a one-token sequence straight on the state's rows instead.
//!
//! There is no chunked form: the recurrence issues 5 FMA-class vector operations per state
//! element and token (9 FLOPs), and its loop alone runs at ~0.88 of the FMA peak (Zen 3, AVX2,
//! head size 64), while fla's chunked DPLR form does 1.4-3x its FLOPs at head size 64
//! (recurrent-families.md §2.2): it can only win on a matrix engine.

pub mod reference;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod decode;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod recurrent;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::kernels::simd::LOG_DECAY_FLOOR;
use crate::kernels::strided::Strided;
use crate::kernels::{Sequence, recurrent_bytes};
use crate::runtime::{Context, Isa};

/// A validated `ssmk_dplr_delta_rule` call. Shapes: r, w (f32), k, a, b `[T, H, K]`, v and out
/// `[T, H, V]`, state `[S, H, K, V]`.
#[derive(Clone, Debug)]
pub struct DplrRule {
    /// Packed tokens T.
    pub tokens: usize,
    pub heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub r: Strided,
    pub w: Strided,
    pub k: Strided,
    pub v: Strided,
    pub a: Strided,
    pub b: Strided,
    pub out: Strided,
    pub state: Option<Strided>,
    /// Multiplies `S^T r` (already resolved from `<= 0`).
    pub scale: f32,
    /// `w` holds the decay factor itself rather than its log.
    pub w_linear: bool,
    pub sequences: Vec<Sequence>,
}

impl DplrRule {
    /// The decay factor of one value of `w`, in f64 (the reference's).
    pub fn decay(&self, w: f32) -> f64 {
        match self.w_linear {
            true => w as f64,
            false => (w.max(LOG_DECAY_FLOOR) as f64).exp(),
        }
    }
}

/// The kernel of one (sequence, head) task of a live sequence.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
type HeadFn = unsafe fn(&DplrRule, &Sequence, usize);

/// A module `$module` whose `HEAD` is the generic recurrence instantiated for `$simd` under
/// `$features`, for the call's state dtype.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! dplr_entry_points {
    ($module:ident, $simd:ty, $features:literal) => {
        mod $module {
            use crate::dtype::DType;
            use crate::kernels::dplr::{DplrRule, HeadFn, decode, recurrent};
            use crate::kernels::Sequence;

            #[target_feature(enable = $features)]
            unsafe fn sequence_head(args: &DplrRule, seq: &Sequence, h: usize) {
                let dtype = args.state.as_ref().map_or(DType::F32, |s| s.dtype);
                crate::with_float_type!(dtype, St => unsafe {
                    if !decode::decode::<$simd, St>(args, seq, h) {
                        recurrent::sequence_head::<$simd, St>(args, seq, h)
                    }
                })
            }

            pub(in crate::kernels::dplr) const HEAD: HeadFn = sequence_head;
        }
    };
}
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) use dplr_entry_points;

/// Runs the DPLR delta rule with the implementation for `isa` (`Isa::Scalar` = the f64
/// reference), one task per (sequence, head): results are bitwise identical for any thread
/// count.
///
/// # Safety
/// `args` must describe validated memory: every index within its shape is in bounds, outputs do not
/// overlap inputs, slots written by different sequences are distinct.
pub unsafe fn dplr_delta_rule(ctx: &Context, isa: Isa, args: &DplrRule) {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if isa > Isa::Scalar {
        #[cfg(target_arch = "aarch64")]
        let head = aarch64::head(isa);
        #[cfg(target_arch = "x86_64")]
        let head = x86::head(isa);
        let state_size = args.state.as_ref().map_or(4, |s| s.dtype.size());
        let bytes = recurrent_bytes(
            &args.sequences,
            0..args.sequences.len(),
            args.heads,
            args.k_dim * args.v_dim * state_size,
        );
        ctx.for_each_moving(args.sequences.len() * args.heads, bytes, |task| {
            let (seq, h) = (&args.sequences[task / args.heads], task % args.heads);
            // SAFETY: each task owns its sequence's output rows and slots for one head.
            unsafe {
                match seq.padded {
                    true => crate::kernels::state_blocks::zero_rows(
                        &args.out,
                        seq.start..seq.start + seq.len,
                        h,
                        args.v_dim,
                    ),
                    false => head(args, seq, h),
                }
            }
        });
        return;
    }
    let _ = isa;
    unsafe { reference::dplr_delta_rule(ctx, args) }
}
