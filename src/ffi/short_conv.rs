//! Export for LFM2's ShortConv core (ABI.md §4.7): `out = C * conv(B * x)` in one pass.

use super::context::{resolve, ssmk_context};
use super::conv::{OptionalArgs, PrefillArgs, prefill_problem};
use super::guard::guard;
use crate::dtype::DType;
use crate::ensure;
use crate::kernels::conv::{self, Gates};
use crate::tensor::{View, ssmk_tensor};

/// LFM2 ShortConv core for a batch mixing decodes and prefills: for packed rows
/// `bcx = [B | C | x]` (LFM2's in_proj output), `out = C * conv(B * x)` with the conv and state
/// rules of `ssmk_causal_conv1d_fwd` and no activation, in one pass that reads each row once.
///
/// Rounding matches the unfused composition exactly: `B * x` is rounded to the activation dtype
/// (that is what the conv reads and what the state stores), the conv output `y` is rounded to it,
/// and `C * y` is rounded to it; so the result is bit-identical to `B*x → ssmk_causal_conv1d_fwd →
/// C*y` with every intermediate stored in the activation dtype, and a prefill split over two calls
/// is bit-exact. Padded sequences get zero output rows and their state is untouched; a
/// zero-length sequence keeps (or, without initial state, zeroes) its state. Every argument is
/// validated before anything is written; results do not depend on the thread count.
///
/// State checkpoints (ABI.md §4.10, prefix caching at block granularity): with `checkpoint_offsets`
/// and `checkpoint_slots` (`[B, C]` int32/int64 each, equal shapes), for each entry whose slot is
/// not `pad_slot_id` the state after token `o = checkpoint_offsets[b][c]` (`1 <= o <= len_b`) of
/// sequence `b` is also written to slot `checkpoint_slots[b][c]` of the same pool, in its dtype:
/// the value a call ending at that token would have stored there (rows `0..W-2` of the checkpoint
/// slot hold the last `W-1` conv inputs `B * x`, bit for bit; rows `W-1..L-1` are never touched).
/// Entries of padded sequences and entries whose slot is `pad_slot_id` are ignored whole (their
/// offsets are not checked); a table with no other entry, or `C = 0`, is accepted wherever NULL is
/// (also in speculative mode or without a pool). `out` and every sequence's final state are bit-
/// identical with or without checkpoints, for any thread count.
///
/// @param ctx               context (threads), or NULL for the process default.
/// @param bcx               `[T, 3D]` float32, bfloat16 or float16; columns `0..D` = B, `D..2D` = C,
///                          `2D..3D` = x. Any strides; contiguous columns take the fast path.
/// @param weight            `[D, W]`, `W` in 2..=8 (LFM2 uses 3), the dtype of `bcx` or float32.
/// @param bias              `[D]`, the dtype of `bcx` or float32, or NULL.
/// @param conv_states       `[S, L, D]` pool of conv inputs (`B * x` values), `L >= W-1`, the dtype of
///                          `bcx` or float32; read and written; NULL: zero history, nothing written.
/// @param query_start_loc   `[B+1]` int32/int64 sequence offsets, or NULL for one sequence of all tokens.
/// @param cache_indices     `[B]` int32/int64 slots, or NULL (sequence `b` uses slot `b`).
/// @param has_initial_state `[B]` bool/uint8/int32/int64, or NULL (all false). True requires `conv_states`.
/// @param pad_slot_id       slot value that marks a padded sequence (vLLM uses -1).
/// @param out               `[T, D]`, the dtype of `bcx`; written. Must not overlap any input or the states.
/// @param checkpoint_offsets  `[B, C]` int32/int64 token counts (state after that many tokens of
///                            the sequence), or NULL (then `checkpoint_slots` must be NULL too).
/// @param checkpoint_slots    `[B, C]` int32/int64 slots of the pool the checkpoints go to, or NULL;
///                            distinct, none a slot of a sequence of the call.
/// @retval SSMK_OK                     done.
/// @retval SSMK_ERR_NULL_POINTER       `bcx`, `weight` or `out` is NULL, or a non-empty tensor has NULL data.
/// @retval SSMK_ERR_INVALID_ARGUMENT   bad ndim or shape (`bcx.shape[1]` not `3 * D`), width, state
///                                     length, offsets order, duplicate slot, or initial state without states.
///                                     Checkpoints: only one table given, unequal shapes or
///                                     `shape[0] != B`, a checkpoint slot used twice or used by a
///                                     sequence of the call, a checkpoint without a state pool.
/// @retval SSMK_ERR_UNSUPPORTED_DTYPE  a dtype outside the lists above.
/// @retval SSMK_ERR_OUT_OF_BOUNDS      an offset above `T`, or a slot outside `[0, S)` that is not `pad_slot_id`.
///                                     Checkpoints: an offset outside `[1, len_b]` or a slot
///                                     outside `[0, S)` (other than `pad_slot_id`).
/// @retval SSMK_ERR_OVERFLOW           a descriptor's extent overflows.
/// @retval SSMK_ERR_ALIASING           `out` or `conv_states` overlaps an input, each other, or itself.
/// @retval SSMK_ERR_UNSUPPORTED_DEVICE a tensor is not in CPU memory.
/// @retval SSMK_ERR_PANIC              internal error caught.
///
/// # Safety
/// Every non-NULL descriptor must be valid and describe memory the caller owns for the call.
#[must_use]
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ssmk_short_conv(
    ctx: *const ssmk_context,
    bcx: *const ssmk_tensor,
    weight: *const ssmk_tensor,
    bias: *const ssmk_tensor,
    conv_states: *mut ssmk_tensor,
    query_start_loc: *const ssmk_tensor,
    cache_indices: *const ssmk_tensor,
    has_initial_state: *const ssmk_tensor,
    pad_slot_id: i64,
    out: *mut ssmk_tensor,
    checkpoint_offsets: *const ssmk_tensor,
    checkpoint_slots: *const ssmk_tensor,
) -> i32 {
    guard(|| {
        let ctx = unsafe { resolve(ctx) };
        let bcx = unsafe { View::required("bcx", bcx) }?;
        let weight = unsafe { View::required("weight", weight) }?;
        let optional = unsafe {
            OptionalArgs::read(
                bias,
                conv_states,
                query_start_loc,
                cache_indices,
                has_initial_state,
                checkpoint_offsets,
                checkpoint_slots,
            )
        }?;
        let out = unsafe { View::required("out", out) }?;
        bcx.expect_ndim(2)?;
        bcx.expect_dtype(&[DType::F32, DType::BF16, DType::F16])?;
        ensure!(
            bcx.shape[1] % 3 == 0,
            InvalidArgument,
            "bcx.shape[1] = {}, expected 3 * D (the columns B | C | x)",
            bcx.shape[1]
        );
        let d = bcx.shape[1] / 3;
        // The conv input is the x columns; B and C are read through the gates.
        let mut x = bcx;
        x.name = "bcx";
        x.shape[1] = d;
        x.ptr = x
            .ptr
            .wrapping_add(2 * d * bcx.strides[1] * bcx.dtype.size());
        let mut p = prefill_problem(&PrefillArgs {
            x: &x,
            weight: &weight,
            optional: &optional,
            silu: false,
            pad_slot_id,
            out: &out,
            also_read: Some(&bcx),
        })?;
        p.gates = Some(Gates {
            b_back: 2 * d * bcx.strides[1],
            c_back: d * bcx.strides[1],
        });
        conv::run(ctx, &p);
        Ok(())
    })
}
