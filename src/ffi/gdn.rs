//! Exports for Gated DeltaNet: the gating pre-pass and the gated delta rule (ABI.md §4.3–4.4).

use super::context::{resolve, ssmk_context};
use super::guard::guard;
use super::sequences::SequenceViews;
use super::views::{FLOATS, expect_outputs_disjoint, expect_shape, strided};
use crate::dtype::DType;
use crate::kernels::gdn::gating::{self, Gating, KdaGating};
use crate::kernels::gdn::{self, DeltaRule};
use crate::runtime::Isa;
use crate::tensor::{View, ssmk_tensor};
use crate::{bail, ensure};

/// `flags` bit of ssmk_gated_delta_rule: l2-normalise q and k (`x / sqrt(sum x^2 + l2norm_eps)`)
/// before use.
pub const SSMK_GDN_QK_L2NORM: u32 = 1;
/// `flags` bit of ssmk_gated_delta_rule: v-head `hv` uses q/k head `hv % H` (the tiled order
/// llama.cpp's GGUF converter writes) instead of `hv / (HV/H)` (Hugging Face's and vLLM's order).
pub const SSMK_GDN_GQA_TILED: u32 = 2;

/// Computes the gates of Gated DeltaNet for `N` tokens:
/// `g = -exp(A_log) * softplus(a + dt_bias)` and `beta = sigmoid(b)`, where
/// `softplus(x) = log1p(exp(softplus_beta * x)) / softplus_beta`, or `x` when
/// `softplus_beta * x > softplus_threshold` (vLLM uses beta 1, threshold 20).
///
/// Arithmetic in f32; `beta` is rounded to its dtype (nearest even). Thread-safe; the outputs are
/// written only after every argument has been checked.
///
/// @param ctx                context, or NULL for the process default.
/// @param a_log              `[HV]` f32/bf16/f16.
/// @param a                  `[N, HV]` f32/bf16/f16.
/// @param b                  `[N, HV]` f32/bf16/f16.
/// @param dt_bias            `[HV]` f32/bf16/f16.
/// @param softplus_beta      > 0 and finite.
/// @param softplus_threshold not NaN.
/// @param g                  `[N, HV]` f32, written; must not overlap any input, `beta` or itself.
/// @param beta               `[N, HV]` f32/bf16/f16, written; must not overlap any input, `g` or itself.
/// @param checkpoint_offsets  `[B, C]` int32/int64 token counts (state after that many tokens of
///                            the sequence), or NULL (then `checkpoint_slots` must be NULL too).
/// @param checkpoint_slots    `[B, C]` int32/int64 slots of the pool the checkpoints go to, or NULL;
///                            distinct, none a slot of a sequence of the call.
/// @retval SSMK_OK                     done.
/// @retval SSMK_ERR_NULL_POINTER       a descriptor is NULL, or non-empty with NULL data.
/// @retval SSMK_ERR_INVALID_ARGUMENT   a shape, stride or scalar is inconsistent.
///                                     Checkpoints: only one table given, unequal shapes or
///                                     `shape[0] != B`, a checkpoint slot used twice or used by a
///                                     sequence of the call, a checkpoint without a state pool.
/// @retval SSMK_ERR_UNSUPPORTED_DTYPE  a dtype outside the lists above.
/// @retval SSMK_ERR_OVERFLOW           a descriptor's extent overflows.
/// @retval SSMK_ERR_ALIASING           an output overlaps an input, the other output or itself.
/// @retval SSMK_ERR_UNSUPPORTED_DEVICE not CPU memory.
///
/// # Safety
/// Every descriptor must be NULL or valid, describing memory the caller owns for the call.
#[must_use]
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ssmk_gdn_gating(
    ctx: *const ssmk_context,
    a_log: *const ssmk_tensor,
    a: *const ssmk_tensor,
    b: *const ssmk_tensor,
    dt_bias: *const ssmk_tensor,
    softplus_beta: f32,
    softplus_threshold: f32,
    g: *mut ssmk_tensor,
    beta: *mut ssmk_tensor,
) -> i32 {
    guard(|| {
        let ctx = unsafe { resolve(ctx) };
        let a_log = unsafe { View::required("A_log", a_log) }?;
        let a = unsafe { View::required("a", a) }?;
        let b = unsafe { View::required("b", b) }?;
        let dt_bias = unsafe { View::required("dt_bias", dt_bias) }?;
        let g = unsafe { View::required("g", g) }?;
        let beta = unsafe { View::required("beta", beta) }?;
        a_log.expect_ndim(1)?;
        a_log.expect_dtype(&FLOATS)?;
        let heads = a_log.shape[0];
        a.expect_ndim(2)?;
        let rows = a.shape[0];
        expect_shape(&a, &[rows, heads], &["N", "HV = A_log.shape[0]"], &FLOATS)?;
        expect_shape(
            &b,
            &[rows, heads],
            &["N = a.shape[0]", "HV = A_log.shape[0]"],
            &FLOATS,
        )?;
        expect_shape(&dt_bias, &[heads], &["HV = A_log.shape[0]"], &FLOATS)?;
        expect_shape(
            &g,
            &[rows, heads],
            &["N = a.shape[0]", "HV = A_log.shape[0]"],
            &[DType::F32],
        )?;
        expect_shape(
            &beta,
            &[rows, heads],
            &["N = a.shape[0]", "HV = A_log.shape[0]"],
            &FLOATS,
        )?;
        ensure!(
            softplus_beta.is_finite() && softplus_beta > 0.0,
            InvalidArgument,
            "softplus_beta = {softplus_beta}, expected a finite value > 0"
        );
        ensure!(
            !softplus_threshold.is_nan(),
            InvalidArgument,
            "softplus_threshold = NaN, expected a number"
        );
        for out in [&g, &beta] {
            out.expect_no_self_overlap()?;
            out.expect_disjoint_from(&[Some(&a_log), Some(&a), Some(&b), Some(&dt_bias)])?;
        }
        g.expect_disjoint(&beta)?;
        let args = Gating {
            rows,
            heads,
            a_log: strided(&a_log),
            a: strided(&a),
            b: strided(&b),
            dt_bias: strided(&dt_bias),
            softplus_beta,
            softplus_threshold,
            g: strided(&g),
            beta: strided(&beta),
        };
        // SAFETY: every index in [N, HV] / [HV] is inside the validated views; outputs are disjoint.
        unsafe { gating::gdn_gating(ctx, &args) };
        Ok(())
    })
}

/// Computes the per-channel gates of Kimi Delta Attention for `N` tokens (ABI.md §4.8), with
/// `x = a + dt_bias` (f32; `dt_bias` NULL: 0):
/// - `lower_bound == 0` (Kimi Linear): `g = -exp(A_log[h]) * softplus(x)`, `softplus(x) = x` for
///   `x > 20`, else `log(1 + exp(x))`;
/// - `lower_bound < 0` (GLM-5-Next, Ling): `g = lower_bound * sigmoid(exp(A_log[h]) * x)`;
///
/// and, when `b` and `beta` are both given, `beta = sigmoid(b)`.
///
/// Arithmetic in f32; `beta` is rounded to its dtype (nearest even). Thread-safe; the outputs are
/// written only after every argument has been checked.
///
/// @param ctx         context, or NULL for the process default.
/// @param a_log       `[HV]` f32.
/// @param a           `[N, HV, K]` f32/bf16/f16.
/// @param dt_bias     `[HV, K]` or `[HV * K]` f32, or NULL.
/// @param lower_bound `0`, or negative and finite.
/// @param b           `[N, HV]` f32/bf16/f16, or NULL (then `beta` must be NULL too).
/// @param g           `[N, HV, K]` f32, written; must not overlap any input, `beta` or itself.
/// @param beta        `[N, HV]` f32/bf16/f16, written, or NULL (then `b` must be NULL too); must
///                    not overlap any input, `g` or itself.
/// @retval SSMK_OK                     done.
/// @retval SSMK_ERR_NULL_POINTER       a required descriptor is NULL, or non-empty with NULL data.
/// @retval SSMK_ERR_INVALID_ARGUMENT   a shape or stride is inconsistent, `lower_bound` is positive,
///                                     NaN or infinite, or exactly one of `b` and `beta` is NULL.
/// @retval SSMK_ERR_UNSUPPORTED_DTYPE  a dtype outside the lists above.
/// @retval SSMK_ERR_OVERFLOW           a descriptor's extent overflows.
/// @retval SSMK_ERR_ALIASING           an output overlaps an input, the other output or itself.
/// @retval SSMK_ERR_UNSUPPORTED_DEVICE not CPU memory.
///
/// # Safety
/// Every descriptor must be NULL or valid, describing memory the caller owns for the call.
#[must_use]
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ssmk_kda_gating(
    ctx: *const ssmk_context,
    a_log: *const ssmk_tensor,
    a: *const ssmk_tensor,
    dt_bias: *const ssmk_tensor,
    lower_bound: f32,
    b: *const ssmk_tensor,
    g: *mut ssmk_tensor,
    beta: *mut ssmk_tensor,
) -> i32 {
    guard(|| {
        let ctx = unsafe { resolve(ctx) };
        let a_log = unsafe { View::required("A_log", a_log) }?;
        let a = unsafe { View::required("a", a) }?;
        let dt_bias = unsafe { View::optional("dt_bias", dt_bias) }?;
        let b = unsafe { View::optional("b", b) }?;
        let g = unsafe { View::required("g", g) }?;
        let beta = unsafe { View::optional("beta", beta) }?;
        a_log.expect_ndim(1)?;
        a_log.expect_dtype(&[DType::F32])?;
        let heads = a_log.shape[0];
        a.expect_ndim(3)?;
        let (rows, k_dim) = (a.shape[0], a.shape[2]);
        expect_shape(
            &a,
            &[rows, heads, k_dim],
            &["N", "HV = A_log.shape[0]", "K"],
            &FLOATS,
        )?;
        let bias = match &dt_bias {
            None => None,
            Some(d) if d.ndim == 1 => {
                expect_shape(d, &[heads * k_dim], &["HV * K"], &[DType::F32])?;
                let mut flat = strided(d);
                flat.strides = [k_dim * d.strides[0], d.strides[0], 0, 0];
                Some(flat)
            }
            Some(d) => {
                expect_shape(
                    d,
                    &[heads, k_dim],
                    &["HV = A_log.shape[0]", "K = a.shape[2]"],
                    &[DType::F32],
                )?;
                Some(strided(d))
            }
        };
        expect_shape(
            &g,
            &[rows, heads, k_dim],
            &["N = a.shape[0]", "HV = A_log.shape[0]", "K = a.shape[2]"],
            &[DType::F32],
        )?;
        let gates = match (&b, &beta) {
            (Some(b), Some(beta)) => {
                for t in [b, beta] {
                    expect_shape(
                        t,
                        &[rows, heads],
                        &["N = a.shape[0]", "HV = A_log.shape[0]"],
                        &FLOATS,
                    )?;
                }
                Some((b, beta))
            }
            (None, None) => None,
            (Some(_), None) => bail!(
                InvalidArgument,
                "b is given and beta is NULL, expected both or neither"
            ),
            (None, Some(_)) => bail!(
                InvalidArgument,
                "beta is given and b is NULL, expected both or neither"
            ),
        };
        ensure!(
            lower_bound.is_finite() && lower_bound <= 0.0,
            InvalidArgument,
            "lower_bound = {lower_bound}, expected 0 (softplus gate) or a finite negative bound"
        );
        let inputs = [Some(&a_log), Some(&a), dt_bias.as_ref(), b.as_ref()];
        for out in [Some(&g), beta.as_ref()].into_iter().flatten() {
            out.expect_no_self_overlap()?;
            out.expect_disjoint_from(&inputs)?;
        }
        if let Some(beta) = &beta {
            g.expect_disjoint(beta)?;
        }
        let args = KdaGating {
            rows,
            heads,
            k_dim,
            a_log: strided(&a_log),
            a: strided(&a),
            dt_bias: bias,
            lower_bound,
            beta: gates.map(|(b, beta)| (strided(b), strided(beta))),
            g: strided(&g),
        };
        // SAFETY: every index in [N, HV, K] / [HV, K] / [N, HV] is inside the validated views;
        // outputs are disjoint from the inputs and each other.
        unsafe { gating::kda_gating(ctx, Isa::dispatch(), &args) };
        Ok(())
    })
}

/// Runs the Gated DeltaNet recurrence over a batch that may mix decodes (length-1 sequences),
/// prefills of any length and speculative-decode sequences, updating a state pool in place.
///
/// Per sequence and v-head `hv` (q/k head `hv / (HV/H)`, or `hv % H` with SSMK_GDN_GQA_TILED), per token `t` with `a_t = exp(g_t)`:
/// `S_t = a_t S_{t-1} + k_t (x) beta_t (v_t - (a_t S_{t-1})^T k_t)`, `o_t = scale * S_t^T q_t`,
/// where q and k are first l2-normalised when `flags` has SSMK_GDN_QK_L2NORM. With `g` `[T, HV]`
/// (Gated DeltaNet) `a_t` scales the whole state; with `g` `[T, HV, K]` (Kimi Delta Attention)
/// `a_t S` is `diag(exp(g_t)) S`, row `i` scaled by `exp(g_t[i])`. A log-decay below
/// -87.33655 (-1e30, `-inf` and NaN included) acts as -87.33655: each token's `exp(g)` is clamped
/// below at the smallest normal float (~1.18e-38), never 0, NaN or inf, on every path and ISA
/// (the reference clamps alike); a product of decays over several tokens may then flush to 0
/// below 2^-60 (an absolute error under 2^-60 of the state). `g > 0` is unspecified. Long
/// sequences use the chunked WY form (chunks of 16 tokens; it only ever multiplies per-token
/// decays <= 1, never subtracts cumulative log-decays), short ones the recurrence; both agree with
/// the per-token math within f32 rounding. The state is kept in f32 during the call, so a bf16/f16
/// state is rounded once per sequence (once per token in speculative mode). Results are bitwise
/// identical for any thread count, and a sequence's results do not depend on the others in the call.
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
/// Memory: sequences of 24 tokens or more take the chunked form, which needs scratch of about
/// `HV/H (3K' + K'/16 + V + 32) * 4` bytes per token for each q/k head processed at once (`K'`: K
/// rounded up to a multiple of 16; heads are processed in waves, only as many as keep the threads
/// busy). Up to 64 MiB of it is
/// kept by the calling thread for its next call; nothing else is allocated per token.
///
/// Speculative mode (`num_accepted_tokens` non-NULL; `state_indices` `[B, Smax]` required): with
/// `n = num_accepted_tokens[b]` in `[0, Smax]`, the initial state is read from slot
/// `state_indices[b][max(n-1, 0)]` (if `has_initial_state[b]`) and the state after token `t` is
/// written to slot `state_indices[b][t]`; the sequence must have at most Smax tokens. It is padded
/// when `state_indices[b][0] == pad_slot_id`. A zero-length sequence writes nothing. Every written
/// slot must be distinct, and no sequence may read a slot another sequence writes.
///
/// State checkpoints (ABI.md §4.10, prefix caching at block granularity): with `checkpoint_offsets`
/// and `checkpoint_slots` (`[B, C]` int32/int64 each, equal shapes), for each entry whose slot is
/// not `pad_slot_id` the state after token `o = checkpoint_offsets[b][c]` (`1 <= o <= len_b`) of
/// sequence `b` is also written to slot `checkpoint_slots[b][c]` of the same pool, in its dtype:
/// the value a call ending at that token would have stored there (within the two-calls-equal-one
/// tolerance, rounded once as a final state is: inside a chunk of the chunked form the recurrence
/// runs from the chunk's start into a copy, so the chunks of the main computation never move. Not
/// allowed with `num_accepted_tokens`). Entries of padded sequences and entries whose slot is
/// `pad_slot_id` are ignored whole (their offsets are not checked); a table with no other entry, or
/// `C = 0`, is accepted wherever NULL is (also in speculative mode or without a pool). `out` and
/// every sequence's final state are bit-identical with or without checkpoints, for any thread
/// count.
///
/// @param ctx                 context, or NULL for the process default.
/// @param q                   `[T, H, K]` f32/bf16/f16.
/// @param k                   `[T, H, K]` f32/bf16/f16.
/// @param v                   `[T, HV, V]` f32/bf16/f16, `HV % H == 0`.
/// @param g                   `[T, HV]` or `[T, HV, K]` f32, log of the per-token decay (per
///                            v-head, or per key channel).
/// @param beta                `[T, HV]` f32/bf16/f16.
/// @param scale               output scale; `<= 0` selects `1/sqrt(K)`. Must be finite.
/// @param state               `[S, HV, K, V]` f32/bf16/f16 (`[k][v]` order), read and written in
///                            place, or NULL. Must not overlap any other tensor or itself.
/// @param cu_seqlens          `[B+1]` int32/int64 token offsets, non-decreasing, within `[0, T]`; or NULL.
/// @param state_indices       `[B]` int32/int64 slots (or `[B, Smax]` in speculative mode); or NULL.
/// @param has_initial_state   `[B]` bool/uint8/int32/int64; or NULL (all false).
/// @param num_accepted_tokens `[B]` int32/int64, or NULL (not speculative).
/// @param flags               SSMK_GDN_QK_L2NORM and/or SSMK_GDN_GQA_TILED (any other bit is an error).
/// @param l2norm_eps          the eps of the l2 norm (finite, >= 0); ignored without the flag.
/// @param pad_slot_id         slot value marking padded sequences (vLLM: -1).
/// @param out                 `[T, HV, V]` f32/bf16/f16, written; must not overlap any input,
///                            `state` or itself.
/// @retval SSMK_OK                     done.
/// @retval SSMK_ERR_NULL_POINTER       a required descriptor is NULL, or non-empty with NULL data.
/// @retval SSMK_ERR_INVALID_ARGUMENT   bad ndim, shape, stride, flag or scalar; duplicate slots;
///                                     `num_accepted_tokens` or a sequence length outside its range.
/// @retval SSMK_ERR_UNSUPPORTED_DTYPE  a dtype outside the lists above.
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
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ssmk_gated_delta_rule(
    ctx: *const ssmk_context,
    q: *const ssmk_tensor,
    k: *const ssmk_tensor,
    v: *const ssmk_tensor,
    g: *const ssmk_tensor,
    beta: *const ssmk_tensor,
    scale: f32,
    state: *mut ssmk_tensor,
    cu_seqlens: *const ssmk_tensor,
    state_indices: *const ssmk_tensor,
    has_initial_state: *const ssmk_tensor,
    num_accepted_tokens: *const ssmk_tensor,
    flags: u32,
    l2norm_eps: f32,
    pad_slot_id: i64,
    out: *mut ssmk_tensor,
    checkpoint_offsets: *const ssmk_tensor,
    checkpoint_slots: *const ssmk_tensor,
) -> i32 {
    guard(|| {
        let ctx = unsafe { resolve(ctx) };
        let q = unsafe { View::required("q", q) }?;
        let k = unsafe { View::required("k", k) }?;
        let v = unsafe { View::required("v", v) }?;
        let g = unsafe { View::required("g", g) }?;
        let beta = unsafe { View::required("beta", beta) }?;
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

        q.expect_ndim(3)?;
        q.expect_dtype(&FLOATS)?;
        let (tokens, heads, k_dim) = (q.shape[0], q.shape[1], q.shape[2]);
        ensure!(
            heads >= 1,
            InvalidArgument,
            "q.shape[1] = 0, expected H >= 1"
        );
        ensure!(
            k_dim >= 1,
            InvalidArgument,
            "q.shape[2] = 0, expected K >= 1"
        );
        expect_shape(
            &k,
            &[tokens, heads, k_dim],
            &["T = q.shape[0]", "H = q.shape[1]", "K = q.shape[2]"],
            &FLOATS,
        )?;
        v.expect_ndim(3)?;
        v.expect_dtype(&FLOATS)?;
        v.expect_dim(0, tokens, "T = q.shape[0]")?;
        let (v_heads, v_dim) = (v.shape[1], v.shape[2]);
        ensure!(
            v_heads >= 1 && v_heads % heads == 0,
            InvalidArgument,
            "v.shape[1] = {v_heads}, expected HV >= 1 and a multiple of H = q.shape[1] = {heads}"
        );
        ensure!(
            v_dim >= 1,
            InvalidArgument,
            "v.shape[2] = 0, expected V >= 1"
        );
        // One log-decay per v-head (Gated DeltaNet) or per key channel (KDA).
        let per_channel = g.ndim == 3;
        ensure!(
            g.ndim == 2 || per_channel,
            InvalidArgument,
            "g.ndim = {}, expected 2 ([T, HV], a decay per v-head) or 3 ([T, HV, K], a decay per key channel)",
            g.ndim
        );
        expect_shape(
            &g,
            &[tokens, v_heads, k_dim][..g.ndim],
            &["T = q.shape[0]", "HV = v.shape[1]", "K = q.shape[2]"],
            &[DType::F32],
        )?;
        expect_shape(
            &beta,
            &[tokens, v_heads],
            &["T = q.shape[0]", "HV = v.shape[1]"],
            &FLOATS,
        )?;
        expect_shape(
            &out,
            &[tokens, v_heads, v_dim],
            &["T = q.shape[0]", "HV = v.shape[1]", "V = v.shape[2]"],
            &FLOATS,
        )?;
        if let Some(st) = &state {
            st.expect_ndim(4)?;
            st.expect_dim(1, v_heads, "HV = v.shape[1]")?;
            st.expect_dim(2, k_dim, "K = q.shape[2]")?;
            st.expect_dim(3, v_dim, "V = v.shape[2]")?;
            st.expect_dtype(&FLOATS)?;
        }
        ensure!(
            flags & !(SSMK_GDN_QK_L2NORM | SSMK_GDN_GQA_TILED) == 0,
            InvalidArgument,
            "flags = {flags:#x}, expected a combination of SSMK_GDN_QK_L2NORM (1) and SSMK_GDN_GQA_TILED (2)"
        );
        ensure!(
            scale.is_finite(),
            InvalidArgument,
            "scale = {scale}, expected a finite value (<= 0 selects 1/sqrt(K))"
        );
        let l2norm = flags & SSMK_GDN_QK_L2NORM != 0;
        if l2norm {
            ensure!(
                l2norm_eps.is_finite() && l2norm_eps >= 0.0,
                InvalidArgument,
                "l2norm_eps = {l2norm_eps}, expected a finite value >= 0"
            );
        }
        // Outputs: each element once, and never memory another tensor of the call uses (the
        // sequence tables included: the header promises `SSMK_ERR_ALIASING` for any input).
        let inputs = [Some(&q), Some(&k), Some(&v), Some(&g), Some(&beta)];
        let inputs = [&inputs[..], &tables.inputs()].concat();
        expect_outputs_disjoint(&out, state.as_ref(), &inputs)?;

        let sequences = tables.parse(tokens, pad_slot_id, state.as_ref().map(|s| s.shape[0]))?;

        let scale = if scale <= 0.0 {
            1.0 / (k_dim as f32).sqrt()
        } else {
            scale
        };
        let args = DeltaRule {
            tokens,
            heads,
            v_heads,
            k_dim,
            v_dim,
            q: strided(&q),
            k: strided(&k),
            v: strided(&v),
            g: strided(&g),
            beta: strided(&beta),
            out: strided(&out),
            state: state.as_ref().map(strided),
            scale,
            l2norm_eps: l2norm.then_some(l2norm_eps),
            gqa_tiled: flags & SSMK_GDN_GQA_TILED != 0,
            per_channel,
            sequences,
        };
        // SAFETY: all shapes, slots and overlaps were checked above.
        unsafe { gdn::gated_delta_rule(ctx, Isa::dispatch(), gdn::Path::current(), &args) }
    })
}
