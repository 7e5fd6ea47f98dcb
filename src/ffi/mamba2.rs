//! Export for Mamba-2: the selective-state scan (ABI.md §4.9).

use super::context::{resolve, ssmk_context};
use super::guard::guard;
use super::sequences::SequenceViews;
use super::views::{FLOATS, expect_outputs_disjoint, expect_shape, strided};
use crate::dtype::DType;
use crate::ensure;
use crate::kernels::mamba2::{self, Scan};
use crate::kernels::strided::{Strided, read_f32};
use crate::kernels::{Path, StateWrite};
use crate::runtime::Isa;
use crate::tensor::{View, ssmk_tensor};

/// `flags` bit of ssmk_mamba2_scan: the step is `softplus(dt + dt_bias)` rather than
/// `dt + dt_bias` (before the `[dt_min, dt_max]` clamp).
pub const SSMK_MAMBA2_DT_SOFTPLUS: u32 = 1;

/// A `[NH]` f32 vector of per-head constants, or `absent` for each head when NULL.
fn per_head(v: Option<&View>, heads: usize, absent: f32) -> crate::error::Result<Vec<f32>> {
    let Some(v) = v else {
        return Ok(vec![absent; heads]);
    };
    expect_shape(v, &[heads], &["NH = x.shape[1]"], &[DType::F32])?;
    let s = strided(v);
    // SAFETY: `h < NH` is inside the validated view.
    Ok((0..heads)
        .map(|h| unsafe { read_f32(s.at(&[h]), DType::F32) })
        .collect())
}

/// `A`: `[NH]` (one rate per head, Mamba-2), read into a vector, or `[NH, N]` (one per state
/// channel, Mamba-1), validated and left in place.
fn decay_rates(
    a: &View,
    heads: usize,
    state_dim: usize,
) -> crate::error::Result<(Vec<f32>, Option<Strided>)> {
    if a.ndim != 2 {
        ensure!(
            a.ndim == 1,
            InvalidArgument,
            "A.ndim = {}, expected 1 ([NH], Mamba-2) or 2 ([NH, N], Mamba-1) (shape {:?})",
            a.ndim,
            a.dims()
        );
        return Ok((per_head(Some(a), heads, 0.0)?, None));
    }
    expect_shape(
        a,
        &[heads, state_dim],
        &["NH = x.shape[1]", "N = B.shape[2]"],
        &[DType::F32],
    )?;
    Ok((Vec::new(), Some(strided(a))))
}

/// Runs Mamba-2's selective-state scan over a batch of sequences that may mix prefills (chunked SSD
/// form), decodes and speculative decodes, continuing each from its slot of a state pool
/// (ABI.md §4.9). Per token and head `h` (group `h / (NH/G)`):
/// `d = dt + dt_bias` (bias 0 when NULL), `d = softplus(d)` with SSMK_MAMBA2_DT_SOFTPLUS
/// (`x` above 20, else `log(1 + e^x)`), `d = min(max(d, dt_min), dt_max)`;
/// `h_t = exp(d A[h]) h_{t-1} + d x_t (x) B_t` (`P x N`), `y_t = h_t C_t + D[h] x_t`, and with `z`
/// `y_t *= silu(z_t)`. An exponent `d A` below -87.33655 (-1e30 and `-inf` included) acts as
/// -87.33655: each token's decay is clamped below at the
/// smallest normal float (~1.18e-38), never NaN, on every path and ISA; the chunked form sums
/// exponents only over the tokens a factor spans, never subtracting cumulative sums.
///
/// `A` of shape `[NH, N]` gives every state channel its own rate (Mamba-1: Jamba, Falcon-Mamba,
/// Mamba, Zamba): `h_t[p][n] = exp(d A[h][n]) h_{t-1}[p][n] + d x_t[p] B_t[n]`. A Mamba-1 layer of
/// `d_inner` channels is `NH = d_inner` heads of `P = 1` with `G = 1`, in token-major (`[T,
/// d_inner]`) or channel-major (tokens contiguous, vLLM's and Hugging Face's) views; both take
/// the channel-vectorised path. With `P > 1` a per-channel `A` always takes the recurrence.
/// Fixed-decay linear attention (MiniMax, Ling linear) is the scan with `x = v`, `B = k`,
/// `C = q`, `G = NH`, `dt` ones (a stride-0 view serves), `A[h] = -s_h`, flags 0, no clamp; its
/// `[S, H, dk, dv]` pool passes as a strided view of `[S, NH, P, N]`.
///
/// Sequences, slots, pads, `has_initial_state`, zero-length sequences and speculative mode follow
/// ssmk_gated_delta_rule word for word: padded sequences get zero output rows and touch no state;
/// a sequence starts from a zero state unless `has_initial_state` says otherwise; the final state
/// is written back to the sequence's slot; with `num_accepted_tokens`, `state_indices` is
/// `[B, Smax]`, the state is read from `idx[b][max(n-1, 0)]` and the state after token `t` is
/// written to `idx[b][t]` (not written when that entry is `pad_slot_id`).
///
/// Arithmetic in f32; the state stays f32 during the call (a narrow state is rounded once per
/// sequence, once per token in speculative mode); outputs are rounded to nearest even. Long
/// prefills take the chunked form, which agrees with the recurrence within f32 rounding, so a
/// prefill split over two calls agrees with one call within tolerance, not bit for bit. Results do
/// not depend on the thread count or on the other sequences of the call. Thread-safe; nothing is
/// written unless every argument is valid.
///
/// State checkpoints (ABI.md §4.10, prefix caching at block granularity): with `checkpoint_offsets`
/// and `checkpoint_slots` (`[B, C]` int32/int64 each, equal shapes), for each entry whose slot is
/// not `pad_slot_id` the state after token `o = checkpoint_offsets[b][c]` (`1 <= o <= len_b`) of
/// sequence `b` is also written to slot `checkpoint_slots[b][c]` of the same pool, in its dtype:
/// the value a call ending at that token would have stored there (within the two-calls-equal-one
/// tolerance, rounded once as a final state is: inside a chunk of the SSD form the recurrence runs
/// from the chunk's start into a copy, so the chunks of the main computation never move. Not
/// allowed with `num_accepted_tokens`). Entries of padded sequences and entries whose slot is
/// `pad_slot_id` are ignored whole (their offsets are not checked); a table with no other entry, or
/// `C = 0`, is accepted wherever NULL is (also in speculative mode or without a pool). `out` and
/// every sequence's final state are bit-identical with or without checkpoints, for any thread
/// count.
///
/// @param ctx                 context, or NULL for the process default.
/// @param x                   `[T, NH, P]` f32/bf16/f16.
/// @param dt                  `[T, NH]` f32/bf16/f16.
/// @param A                   `[NH]` f32, or `[NH, N]` f32 (per state channel: Mamba-1).
/// @param B                   `[T, G, N]` f32/bf16/f16, `NH % G == 0`.
/// @param C                   `[T, G, N]` f32/bf16/f16.
/// @param D                   `[NH]` f32, or NULL (no skip term).
/// @param z                   `[T, NH, P]` f32/bf16/f16, or NULL (no gate).
/// @param dt_bias             `[NH]` f32, or NULL (0).
/// @param dt_min              lower limit of the step, not NaN (-INFINITY: none).
/// @param dt_max              upper limit of the step, not NaN, `>= dt_min` (INFINITY: none).
/// @param flags               SSMK_MAMBA2_DT_SOFTPLUS or 0 (any other bit is an error).
/// @param state               `[S, NH, P, N]` f32/bf16/f16 (`[p][n]` order), read and written in
///                            place, or NULL. Must not overlap any other tensor or itself.
/// @param cu_seqlens          `[B+1]` int32/int64 token offsets, non-decreasing, within `[0, T]`; or NULL.
/// @param state_indices       `[B]` int32/int64 slots (or `[B, Smax]` in speculative mode); or NULL.
/// @param has_initial_state   `[B]` bool/uint8/int32/int64; or NULL (all false).
/// @param num_accepted_tokens `[B]` int32/int64, or NULL (not speculative).
/// @param pad_slot_id         slot value marking padded sequences (vLLM: -1).
/// @param out                 `[T, NH, P]` of x's dtype, written; must not overlap any input,
///                            `state` or itself.
/// @param checkpoint_offsets  `[B, C]` int32/int64 token counts (state after that many tokens of
///                            the sequence), or NULL (then `checkpoint_slots` must be NULL too).
/// @param checkpoint_slots    `[B, C]` int32/int64 slots of the pool the checkpoints go to, or NULL;
///                            distinct, none a slot of a sequence of the call.
/// @retval SSMK_OK                     done.
/// @retval SSMK_ERR_NULL_POINTER       a required descriptor is NULL, or non-empty with NULL data.
/// @retval SSMK_ERR_INVALID_ARGUMENT   bad ndim, shape, stride, flag or limit (`A` not `[NH]` or
///                                     `[NH, N]`); `NH % G != 0`;
///                                     duplicate slots; `num_accepted_tokens` or a sequence length
///                                     outside its range; `has_initial_state` true with no state.
///                                     Checkpoints: only one table given, unequal shapes or
///                                     `shape[0] != B`, a checkpoint slot used twice or used by a
///                                     sequence of the call, a checkpoint without a state pool.
/// @retval SSMK_ERR_UNSUPPORTED_DTYPE  a dtype outside the lists above, or `out` not of x's dtype.
/// @retval SSMK_ERR_OUT_OF_BOUNDS      a slot outside `[0, S)` (other than `pad_slot_id`) or an
///                                     offset outside `[0, T]`.
///                                     Checkpoints: an offset outside `[1, len_b]` or a slot
///                                     outside `[0, S)` (other than `pad_slot_id`).
/// @retval SSMK_ERR_OVERFLOW           a descriptor's extent overflows.
/// @retval SSMK_ERR_ALIASING           an output overlaps an input, the other output or itself.
/// @retval SSMK_ERR_UNSUPPORTED_DEVICE not CPU memory.
/// @retval SSMK_ERR_ALLOCATION         scratch memory could not be allocated (nothing written).
///
/// # Safety
/// Every descriptor must be NULL or valid, describing memory the caller owns for the call.
#[must_use]
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments, non_snake_case)]
pub unsafe extern "C" fn ssmk_mamba2_scan(
    ctx: *const ssmk_context,
    x: *const ssmk_tensor,
    dt: *const ssmk_tensor,
    A: *const ssmk_tensor,
    B: *const ssmk_tensor,
    C: *const ssmk_tensor,
    D: *const ssmk_tensor,
    z: *const ssmk_tensor,
    dt_bias: *const ssmk_tensor,
    dt_min: f32,
    dt_max: f32,
    flags: u32,
    state: *mut ssmk_tensor,
    cu_seqlens: *const ssmk_tensor,
    state_indices: *const ssmk_tensor,
    has_initial_state: *const ssmk_tensor,
    num_accepted_tokens: *const ssmk_tensor,
    pad_slot_id: i64,
    out: *mut ssmk_tensor,
    checkpoint_offsets: *const ssmk_tensor,
    checkpoint_slots: *const ssmk_tensor,
) -> i32 {
    guard(|| {
        let ctx = unsafe { resolve(ctx) };
        let x = unsafe { View::required("x", x) }?;
        let dt = unsafe { View::required("dt", dt) }?;
        let a_view = unsafe { View::required("A", A) }?;
        let b = unsafe { View::required("B", B) }?;
        let c = unsafe { View::required("C", C) }?;
        let d = unsafe { View::optional("D", D) }?;
        let z = unsafe { View::optional("z", z) }?;
        let dt_bias = unsafe { View::optional("dt_bias", dt_bias) }?;
        let state = unsafe { View::optional("state", state) }?;
        let out = unsafe { View::required("out", out) }?;
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

        x.expect_ndim(3)?;
        x.expect_dtype(&FLOATS)?;
        let (tokens, heads, head_dim) = (x.shape[0], x.shape[1], x.shape[2]);
        ensure!(
            heads >= 1,
            InvalidArgument,
            "x.shape[1] = 0, expected NH >= 1"
        );
        ensure!(
            head_dim >= 1,
            InvalidArgument,
            "x.shape[2] = 0, expected P >= 1"
        );
        expect_shape(
            &dt,
            &[tokens, heads],
            &["T = x.shape[0]", "NH = x.shape[1]"],
            &FLOATS,
        )?;
        b.expect_ndim(3)?;
        b.expect_dtype(&FLOATS)?;
        b.expect_dim(0, tokens, "T = x.shape[0]")?;
        let (groups, state_dim) = (b.shape[1], b.shape[2]);
        ensure!(
            groups >= 1 && heads % groups == 0,
            InvalidArgument,
            "B.shape[1] = {groups}, expected G >= 1 with NH % G == 0 (NH = x.shape[1] = {heads})"
        );
        ensure!(
            state_dim >= 1,
            InvalidArgument,
            "B.shape[2] = 0, expected N >= 1"
        );
        expect_shape(
            &c,
            &[tokens, groups, state_dim],
            &["T = x.shape[0]", "G = B.shape[1]", "N = B.shape[2]"],
            &FLOATS,
        )?;
        let (a, a_states) = decay_rates(&a_view, heads, state_dim)?;
        let d_skip = per_head(d.as_ref(), heads, 0.0)?;
        if let Some(z) = &z {
            expect_shape(
                z,
                &[tokens, heads, head_dim],
                &["T = x.shape[0]", "NH = x.shape[1]", "P = x.shape[2]"],
                &FLOATS,
            )?;
        }
        let bias = per_head(dt_bias.as_ref(), heads, 0.0)?;
        expect_shape(
            &out,
            &[tokens, heads, head_dim],
            &["T = x.shape[0]", "NH = x.shape[1]", "P = x.shape[2]"],
            &[x.dtype],
        )?;
        if let Some(st) = &state {
            st.expect_ndim(4)?;
            st.expect_dim(1, heads, "NH = x.shape[1]")?;
            st.expect_dim(2, head_dim, "P = x.shape[2]")?;
            st.expect_dim(3, state_dim, "N = B.shape[2]")?;
            st.expect_dtype(&FLOATS)?;
        }
        ensure!(
            flags & !SSMK_MAMBA2_DT_SOFTPLUS == 0,
            InvalidArgument,
            "flags = {flags:#x}, expected 0 or SSMK_MAMBA2_DT_SOFTPLUS (1)"
        );
        ensure!(
            !dt_min.is_nan() && !dt_max.is_nan() && dt_min <= dt_max,
            InvalidArgument,
            "dt_min = {dt_min}, dt_max = {dt_max}, expected dt_min <= dt_max, neither NaN (-inf/+inf for no limit)"
        );
        // Outputs: each element once, and never memory another tensor of the call uses.
        let inputs = [
            Some(&x),
            Some(&dt),
            Some(&b),
            Some(&c),
            z.as_ref(),
            // A, D and dt_bias were read above, but an output over them is still a caller bug.
            Some(&a_view),
            d.as_ref(),
            dt_bias.as_ref(),
        ];
        let inputs = [&inputs[..], &tables.inputs()].concat();
        expect_outputs_disjoint(&out, state.as_ref(), &inputs)?;
        let sequences = tables.parse(tokens, pad_slot_id, state.as_ref().map(|s| s.shape[0]))?;
        debug_assert!(
            state.is_some()
                || sequences
                    .iter()
                    .all(|s| s.read.is_none() && s.write == StateWrite::Nothing)
        );
        let args = Scan {
            tokens,
            heads,
            head_dim,
            groups,
            state_dim,
            x: strided(&x),
            dt: strided(&dt),
            b: strided(&b),
            c: strided(&c),
            z: z.as_ref().map(strided),
            out: strided(&out),
            state: state.as_ref().map(strided),
            a,
            a_states,
            d: d_skip,
            dt_bias: bias,
            dt_softplus: flags & SSMK_MAMBA2_DT_SOFTPLUS != 0,
            dt_min,
            dt_max,
            sequences,
        };
        // SAFETY: all shapes, slots and overlaps were checked above.
        unsafe { mamba2::mamba2_scan(ctx, Isa::dispatch(), Path::current(), &args) }
    })
}
