//! Export of the generalized (diagonal plus low-rank) delta rule of RWKV-7 (ABI.md §4.11).

use super::context::{resolve, ssmk_context};
use super::guard::guard;
use super::sequences::SequenceViews;
use super::views::{FLOATS, expect_outputs_disjoint, expect_shape, strided};
use crate::dtype::DType;
use crate::ensure;
use crate::kernels::dplr::{self, DplrRule};
use crate::runtime::Isa;
use crate::tensor::{View, ssmk_tensor};

/// `flags` bit of ssmk_dplr_delta_rule: `w` holds the decay factor itself, in `(0, 1]` (as
/// llama.cpp's `rwkv_wkv7` takes it), rather than its log.
pub const SSMK_DPLR_W_LINEAR: u32 = 1;

/// Runs the generalized (diagonal plus low-rank) delta rule of RWKV-7 over a batch that may mix
/// decodes (length-1 sequences), prefills of any length and speculative-decode sequences,
/// updating a state pool in place.
///
/// Per sequence and head, per token, with the state `S` (K x V) before the token:
/// `sa = a^T S` (a V-vector), `S = diag(d) S + b (x) sa + k (x) v`, `o = scale * S^T r`, where the
/// decay is `d = exp(w)` (log form) or, with SSMK_DPLR_W_LINEAR, `d = w`. RWKV-7 is `a = -kk`,
/// `b = kk * a_iclr`, `w = -0.606531 * sigmoid(...)`, scale 1; the model's token shift, `kk`
/// normalisation, GroupNorm and bonus term stay outside. Log-decays below about -87 (-inf
/// included) act as -87 (`exp` is clamped to the smallest normal float, never 0, NaN or inf);
/// `w > 0` (log form) or a factor outside `(0, 1]` (linear form) is unspecified. Arithmetic in
/// f32, with every token run through the recurrence (no chunked form: see the README). The state
/// is kept in f32 during the call, so a bf16/f16 state is rounded once per sequence (once per
/// token in speculative mode, and once per checkpoint). Results are bitwise identical for any
/// thread count, and a sequence's results do not depend on the others in the call.
///
/// Sequences and slots: sequence `b` owns tokens `cu_seqlens[b] .. cu_seqlens[b+1]` (NULL: one
/// sequence of all T tokens); tokens outside every sequence are not touched. Its slot is
/// `state_indices[b]` (NULL: slot `b`); a slot equal to `pad_slot_id` marks a padded sequence:
/// its output rows are zeros and no state is read or written. It starts from its slot's state when
/// `has_initial_state[b]` is non-zero, else from zeros (NULL: zeros for all). Its final state is
/// written to its slot; a zero-length sequence writes its initial state back (zeros without one).
/// `state` NULL: every sequence starts from zeros and nothing is written (`has_initial_state`
/// must then be NULL or all false).
///
/// Speculative mode (`num_accepted_tokens` non-NULL; `state_indices` `[B, Smax]` required): with
/// `n = num_accepted_tokens[b]` in `[0, Smax]`, the initial state is read from slot
/// `state_indices[b][max(n-1, 0)]` (if `has_initial_state[b]`) and the state after token `t` is
/// written to slot `state_indices[b][t]` (not when that entry is `pad_slot_id`); the sequence must
/// have at most Smax tokens. It is padded when `state_indices[b][0] == pad_slot_id`. A zero-length
/// sequence writes nothing. Every written slot must be distinct, and no sequence may read a slot
/// another sequence writes.
///
/// State checkpoints (ABI.md §4.10): with `checkpoint_offsets` and `checkpoint_slots` (`[B, C]`
/// int32/int64 each, equal shapes), for each entry whose slot is not `pad_slot_id` the state after
/// token `o = checkpoint_offsets[b][c]` (`1 <= o <= len_b`) of sequence `b` is also written to slot
/// `checkpoint_slots[b][c]` of the same pool, in its dtype: bit-identical to what a call ending at
/// that token stores. Not allowed with `num_accepted_tokens`. Entries of padded sequences and
/// entries whose slot is `pad_slot_id` are ignored whole (their offsets are not checked); a table
/// with no other entry, or `C = 0`, is accepted wherever NULL is. `out` and every sequence's final
/// state are bit-identical with or without checkpoints, for any thread count.
///
/// State layouts: any strides. `[slot][h][k][v]` (v contiguous) and the `[slot][h][v][k]` view
/// (k contiguous: ggml's `wkv7` state, passed as a strided `[S, H, K, V]` view) both take the
/// fast path: each head's state is read once per call into f32 blocks in cache and written once.
///
/// @param ctx                 context, or NULL for the process default.
/// @param r                   `[T, H, K]` f32/bf16/f16 (the receptance, RWKV's query).
/// @param w                   `[T, H, K]` f32: log of the per-channel decay, or the decay itself
///                            with SSMK_DPLR_W_LINEAR.
/// @param k                   `[T, H, K]` f32/bf16/f16.
/// @param v                   `[T, H, V]` f32/bf16/f16.
/// @param a                   `[T, H, K]` f32/bf16/f16 (RWKV-7: `-kk`).
/// @param b                   `[T, H, K]` f32/bf16/f16 (RWKV-7: `kk * a`).
/// @param scale               output scale; `<= 0` selects 1. Must be finite.
/// @param state               `[S, H, K, V]` f32/bf16/f16, read and written in place, or NULL.
///                            Must not overlap any other tensor or itself.
/// @param cu_seqlens          `[B+1]` int32/int64 token offsets, non-decreasing, within `[0, T]`; or NULL.
/// @param state_indices       `[B]` int32/int64 slots (or `[B, Smax]` in speculative mode); or NULL.
/// @param has_initial_state   `[B]` bool/uint8/int32/int64; or NULL (all false).
/// @param num_accepted_tokens `[B]` int32/int64, or NULL (not speculative).
/// @param flags               SSMK_DPLR_W_LINEAR or 0 (any other bit is an error).
/// @param pad_slot_id         slot value marking padded sequences (vLLM: -1).
/// @param out                 `[T, H, V]` of v's dtype, written; must not overlap any input,
///                            `state` or itself.
/// @param checkpoint_offsets  `[B, C]` int32/int64 token counts (state after that many tokens of
///                            the sequence), or NULL (then `checkpoint_slots` must be NULL too).
/// @param checkpoint_slots    `[B, C]` int32/int64 slots of the pool the checkpoints go to, or NULL;
///                            distinct, none a slot of a sequence of the call.
/// @retval SSMK_OK                     done.
/// @retval SSMK_ERR_NULL_POINTER       a required descriptor is NULL, or non-empty with NULL data.
/// @retval SSMK_ERR_INVALID_ARGUMENT   bad ndim, shape, stride, flag or scalar; duplicate slots;
///                                     `num_accepted_tokens` or a sequence length outside its range.
///                                     Checkpoints: only one table given, unequal shapes or
///                                     `shape[0] != B`, a checkpoint slot used twice or used by a
///                                     sequence of the call, a checkpoint without a state pool or
///                                     in speculative mode.
/// @retval SSMK_ERR_UNSUPPORTED_DTYPE  a dtype outside the lists above, or `out`'s not v's.
/// @retval SSMK_ERR_OUT_OF_BOUNDS      a slot outside `[0, S)` (other than `pad_slot_id`) or an
///                                     offset outside `[0, T]`. Checkpoints: an offset outside
///                                     `[1, len_b]` or a slot outside `[0, S)` (other than
///                                     `pad_slot_id`).
/// @retval SSMK_ERR_OVERFLOW           a descriptor's extent overflows.
/// @retval SSMK_ERR_ALIASING           an output overlaps an input, the other output or itself.
/// @retval SSMK_ERR_UNSUPPORTED_DEVICE not CPU memory.
///
/// # Safety
/// Every descriptor must be NULL or valid, describing memory the caller owns for the call.
#[must_use]
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ssmk_dplr_delta_rule(
    ctx: *const ssmk_context,
    r: *const ssmk_tensor,
    w: *const ssmk_tensor,
    k: *const ssmk_tensor,
    v: *const ssmk_tensor,
    a: *const ssmk_tensor,
    b: *const ssmk_tensor,
    scale: f32,
    state: *mut ssmk_tensor,
    cu_seqlens: *const ssmk_tensor,
    state_indices: *const ssmk_tensor,
    has_initial_state: *const ssmk_tensor,
    num_accepted_tokens: *const ssmk_tensor,
    flags: u32,
    pad_slot_id: i64,
    out: *mut ssmk_tensor,
    checkpoint_offsets: *const ssmk_tensor,
    checkpoint_slots: *const ssmk_tensor,
) -> i32 {
    guard(|| {
        let ctx = unsafe { resolve(ctx) };
        let r = unsafe { View::required("r", r) }?;
        let w = unsafe { View::required("w", w) }?;
        let k = unsafe { View::required("k", k) }?;
        let v = unsafe { View::required("v", v) }?;
        let a = unsafe { View::required("a", a) }?;
        let b = unsafe { View::required("b", b) }?;
        let out = unsafe { View::required("out", out) }?;
        let state = unsafe { View::optional("state", state) }?;
        let tables = unsafe {
            SequenceViews::read(
                cu_seqlens,
                state_indices,
                has_initial_state,
                num_accepted_tokens,
                checkpoint_offsets,
                checkpoint_slots,
            )
        }?;

        r.expect_ndim(3)?;
        r.expect_dtype(&FLOATS)?;
        let (tokens, heads, k_dim) = (r.shape[0], r.shape[1], r.shape[2]);
        ensure!(
            heads >= 1,
            InvalidArgument,
            "r.shape[1] = 0, expected H >= 1"
        );
        ensure!(
            k_dim >= 1,
            InvalidArgument,
            "r.shape[2] = 0, expected K >= 1"
        );
        let tkh = [tokens, heads, k_dim];
        let tkh_names = ["T = r.shape[0]", "H = r.shape[1]", "K = r.shape[2]"];
        expect_shape(&w, &tkh, &tkh_names, &[DType::F32])?;
        for t in [&k, &a, &b] {
            expect_shape(t, &tkh, &tkh_names, &FLOATS)?;
        }
        v.expect_ndim(3)?;
        v.expect_dtype(&FLOATS)?;
        v.expect_dim(0, tokens, "T = r.shape[0]")?;
        v.expect_dim(1, heads, "H = r.shape[1]")?;
        let v_dim = v.shape[2];
        ensure!(
            v_dim >= 1,
            InvalidArgument,
            "v.shape[2] = 0, expected V >= 1"
        );
        expect_shape(
            &out,
            &[tokens, heads, v_dim],
            &["T = r.shape[0]", "H = r.shape[1]", "V = v.shape[2]"],
            &FLOATS,
        )?;
        ensure!(
            out.dtype == v.dtype,
            UnsupportedDtype,
            "out.dtype = {}, expected v.dtype = {}",
            out.dtype.name(),
            v.dtype.name()
        );
        if let Some(st) = &state {
            st.expect_ndim(4)?;
            st.expect_dim(1, heads, "H = r.shape[1]")?;
            st.expect_dim(2, k_dim, "K = r.shape[2]")?;
            st.expect_dim(3, v_dim, "V = v.shape[2]")?;
            st.expect_dtype(&FLOATS)?;
        }
        ensure!(
            flags & !SSMK_DPLR_W_LINEAR == 0,
            InvalidArgument,
            "flags = {flags:#x}, expected 0 or SSMK_DPLR_W_LINEAR (1)"
        );
        ensure!(
            scale.is_finite(),
            InvalidArgument,
            "scale = {scale}, expected a finite value (<= 0 selects 1)"
        );
        let inputs = [Some(&r), Some(&w), Some(&k), Some(&v), Some(&a), Some(&b)];
        let inputs = [&inputs[..], &tables.inputs()].concat();
        expect_outputs_disjoint(&out, state.as_ref(), &inputs)?;

        let num_slots = state.as_ref().map(|s| s.shape[0]);
        let sequences = tables.parse(tokens, pad_slot_id, num_slots)?;

        let args = DplrRule {
            tokens,
            heads,
            k_dim,
            v_dim,
            r: strided(&r),
            w: strided(&w),
            k: strided(&k),
            v: strided(&v),
            a: strided(&a),
            b: strided(&b),
            out: strided(&out),
            state: state.as_ref().map(strided),
            scale: if scale <= 0.0 { 1.0 } else { scale },
            w_linear: flags & SSMK_DPLR_W_LINEAR != 0,
            sequences,
        };
        // SAFETY: all shapes, slots and overlaps were checked above.
        unsafe { dplr::dplr_delta_rule(ctx, Isa::dispatch(), &args) };
        Ok(())
    })
}
