//! The generalized (diagonal plus low-rank) delta rule of RWKV-7 (ABI.md §4.11), for prefill,
//! decode and speculative decode. Per (sequence, head), per token:
//! `sa = a^T S`, `S = diag(d) S + b (x) sa + k (x) v`, `o = scale * S^T r`, with the decay
//! `d = exp(w)` (log form) or `d = w` (`SSMK_DPLR_W_LINEAR`).
//!
//! Two implementations of that one recurrence:
//! - [`reference`](mod@reference): the per-token recurrence in f64, the crate's oracle (`Isa::Scalar`).
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

/// The kernel of one task of a live sequence: a group of its heads.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
type HeadFn = unsafe fn(&DplrRule, &Sequence, std::ops::Range<usize>);

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
            unsafe fn sequence_heads(args: &DplrRule, seq: &Sequence, heads: std::ops::Range<usize>) {
                let dtype = args.state.as_ref().map_or(DType::F32, |s| s.dtype);
                crate::with_float_type!(dtype, St => unsafe {
                    // Whether the decode path takes a call does not depend on the head: it takes
                    // every head of the group or returns false at the first, having done nothing.
                    if !heads.clone().all(|h| decode::decode::<$simd, St>(args, seq, h)) {
                        recurrent::sequence_heads::<$simd, St>(args, seq, heads)
                    }
                })
            }

            pub(in crate::kernels::dplr) const HEADS: HeadFn = sequence_heads;
        }
    };
}
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) use dplr_entry_points;

/// Heads a task of a prefill takes together at most (see `recurrent::sequence_heads`), and the
/// most bytes of f32 state they may hold, so that the group's states stay in L2 (8 heads of 64:
/// 128 KiB).
const MAX_HEAD_GROUP: usize = 8;
const MAX_HEAD_GROUP_BYTES: usize = 256 << 10;

/// Runs the DPLR delta rule with the implementation for `isa` (`Isa::Scalar` = the f64
/// reference), one task per sequence and group of heads (one head, or up to `MAX_HEAD_GROUP`
/// when a sequence is longer than a chunk and there are tasks enough for the threads): each
/// head's arithmetic is the same in any group, so results are bitwise identical for any thread
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
        let long = args
            .sequences
            .iter()
            .any(|s| s.len > recurrent::CHUNK_TOKENS);
        let group = match long {
            true => {
                let by_bytes = MAX_HEAD_GROUP_BYTES / (4 * args.k_dim * args.v_dim).max(1);
                (args.sequences.len() * args.heads / (2 * ctx.threads()))
                    .min(by_bytes)
                    .clamp(1, MAX_HEAD_GROUP)
            }
            false => 1,
        };
        let groups = args.heads.div_ceil(group);
        ctx.for_each_moving(args.sequences.len() * groups, bytes, |task| {
            let seq = &args.sequences[task / groups];
            let first = task % groups * group;
            let heads = first..(first + group).min(args.heads);
            // SAFETY: each task owns its sequence's output rows and slots for its heads.
            unsafe {
                match seq.padded {
                    true => heads.for_each(|h| {
                        crate::kernels::state_blocks::zero_rows(
                            &args.out,
                            seq.start..seq.start + seq.len,
                            h,
                            args.v_dim,
                        )
                    }),
                    false => head(args, seq, heads),
                }
            }
        });
        return;
    }
    let _ = isa;
    unsafe { reference::dplr_delta_rule(ctx, args) }
}
