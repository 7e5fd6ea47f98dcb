//! Exports for the causal depthwise conv1d (ABI.md §4.1–4.2): varlen prefill with state
//! continuation, decode and speculative verify.

use super::context::{resolve, ssmk_context};
use super::guard::guard;
use super::sequences::{CheckpointTables, parse_batch, parse_checkpoints, parse_slots};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::conv::{
    self, Checkpoint, MAX_WIDTH, MIN_WIDTH, Matrix, Problem, Seq, StateUpdate,
};
use crate::tensor::{View, ssmk_tensor};
use crate::{bail, ensure};

/// `activation`: no activation, `out = conv`.
pub const SSMK_ACTIVATION_NONE: u32 = 0;
/// `activation`: `out = silu(conv) = conv / (1 + exp(-conv))`. The vector kernels evaluate `exp`
/// with a polynomial whose relative error (about 1e-7 for float32 outputs, 2e-6 for float16, 4e-5
/// for bfloat16) stays well below the output's rounding.
pub const SSMK_ACTIVATION_SILU: u32 = 1;

fn parse_activation(activation: u32) -> Result<bool> {
    match activation {
        SSMK_ACTIVATION_NONE => Ok(false),
        SSMK_ACTIVATION_SILU => Ok(true),
        other => bail!(
            InvalidArgument,
            "activation = {other}, expected SSMK_ACTIVATION_NONE (0) or SSMK_ACTIVATION_SILU (1)"
        ),
    }
}

/// The float dtypes an argument of activation dtype `act` may have: `act`, or also f32.
fn act_or_f32(act: DType) -> Vec<DType> {
    if act == DType::F32 {
        vec![DType::F32]
    } else {
        vec![act, DType::F32]
    }
}

/// Address of element `index` (in the view's own dtype), as bytes.
pub(crate) fn elem_ptr(v: &View, index: &[usize]) -> *mut u8 {
    let off: usize = index.iter().zip(&v.strides).map(|(i, s)| i * s).sum();
    v.ptr.wrapping_add(off * v.dtype.size())
}

/// Weight `[D, W]` and bias `[D]`: shapes, dtypes; returns them as matrices and the width.
fn parse_weights(
    act: DType,
    d: usize,
    weight: &View,
    bias: Option<&View>,
) -> Result<(Matrix, Option<Matrix>, usize)> {
    weight.expect_ndim(2)?;
    weight.expect_dim(0, d, "dim = D")?;
    weight.expect_dtype(&act_or_f32(act))?;
    let w = weight.shape[1];
    ensure!(
        (MIN_WIDTH..=MAX_WIDTH).contains(&w),
        InvalidArgument,
        "weight.shape[1] = {w}, expected width W in {MIN_WIDTH}..={MAX_WIDTH}"
    );
    let wm = Matrix {
        ptr: weight.ptr,
        dtype: weight.dtype,
        s0: weight.strides[0],
        s1: weight.strides[1],
    };
    let bm = match bias {
        Some(b) => {
            b.expect_ndim(1)?;
            b.expect_dim(0, d, "dim = D")?;
            b.expect_dtype(&act_or_f32(act))?;
            Some(Matrix {
                ptr: b.ptr,
                dtype: b.dtype,
                s0: b.strides[0],
                s1: 0,
            })
        }
        None => None,
    };
    Ok((wm, bm, w))
}

/// `conv_state_indices` as a `[B]` vector: vLLM may pass its legacy one-column block table
/// `[B, 1]`, which means the same; a table of more columns has no meaning for a decode.
fn block_table_column(indices: View) -> Result<View> {
    if indices.ndim != 2 {
        return Ok(indices);
    }
    ensure!(
        indices.shape[1] == 1,
        InvalidArgument,
        "conv_state_indices.shape = {:?}, expected [B] or a one-column block table [B, 1]",
        indices.dims()
    );
    let mut column = indices;
    column.ndim = 1;
    column.shape[1] = 0;
    column.strides[1] = 0;
    Ok(column)
}

/// State pool `[S, L, D]`, `L >= min_rows`: returns `S`.
fn parse_states(states: &View, act: DType, d: usize, min_rows: usize, why: &str) -> Result<usize> {
    states.expect_ndim(3)?;
    states.expect_dim(2, d, "dim = D")?;
    states.expect_dtype(&act_or_f32(act))?;
    ensure!(
        states.shape[1] >= min_rows,
        InvalidArgument,
        "{}.shape[1] = {}, expected state_len L >= {why} = {min_rows}",
        states.name,
        states.shape[1]
    );
    states.expect_no_self_overlap()?;
    Ok(states.shape[0])
}

/// The validated prefill arguments shared by `ssmk_causal_conv1d_fwd` and `ssmk_short_conv`.
pub(crate) struct PrefillArgs<'a> {
    /// The conv input `[T, D]` (for ShortConv, the x columns of bcx).
    pub x: &'a View,
    pub weight: &'a View,
    pub optional: &'a OptionalArgs,
    pub silu: bool,
    pub pad_slot_id: i64,
    pub out: &'a View,
    /// Inputs beyond those above that the outputs must not overlap (ShortConv's whole bcx).
    pub also_read: Option<&'a View>,
}

/// The descriptors of a prefill call that may be NULL.
pub(crate) struct OptionalArgs {
    pub bias: Option<View>,
    pub states: Option<View>,
    pub starts: Option<View>,
    pub indices: Option<View>,
    pub initial: Option<View>,
    pub checkpoint_offsets: Option<View>,
    pub checkpoint_slots: Option<View>,
}

impl OptionalArgs {
    /// Reads the optional descriptors of `ssmk_causal_conv1d_fwd` and `ssmk_short_conv`.
    ///
    /// # Safety
    /// Each pointer is NULL or a valid descriptor.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn read(
        bias: *const ssmk_tensor,
        conv_states: *mut ssmk_tensor,
        query_start_loc: *const ssmk_tensor,
        cache_indices: *const ssmk_tensor,
        has_initial_state: *const ssmk_tensor,
        checkpoint_offsets: *const ssmk_tensor,
        checkpoint_slots: *const ssmk_tensor,
    ) -> Result<OptionalArgs> {
        unsafe {
            Ok(OptionalArgs {
                bias: View::optional("bias", bias)?,
                states: View::optional("conv_states", conv_states)?,
                starts: View::optional("query_start_loc", query_start_loc)?,
                indices: View::optional("cache_indices", cache_indices)?,
                initial: View::optional("has_initial_state", has_initial_state)?,
                checkpoint_offsets: View::optional("checkpoint_offsets", checkpoint_offsets)?,
                checkpoint_slots: View::optional("checkpoint_slots", checkpoint_slots)?,
            })
        }
    }
}

/// Checks a prefill call (shapes, dtypes, overlaps, sequences, slots) and describes it.
pub(crate) fn prefill_problem(a: &PrefillArgs) -> Result<Problem> {
    let o = a.optional;
    let (bias, states) = (o.bias.as_ref(), o.states.as_ref());
    let (starts, indices, initial) = (o.starts.as_ref(), o.indices.as_ref(), o.initial.as_ref());
    let (x, out) = (a.x, a.out);
    x.expect_ndim(2)?;
    x.expect_dtype(&[DType::F32, DType::BF16, DType::F16])?;
    let (t, d, act) = (x.shape[0], x.shape[1], x.dtype);
    let (wm, bm, w) = parse_weights(act, d, a.weight, bias)?;
    out.expect_ndim(2)?;
    out.expect_dim(0, t, "tokens = x.shape[0] = T")?;
    out.expect_dim(1, d, "dim = D")?;
    out.expect_dtype(&[act])?;
    out.expect_no_self_overlap()?;
    let num_slots = match states {
        Some(s) => Some(parse_states(s, act, d, w - 1, "W-1")?),
        None => None,
    };
    let inputs = [
        Some(x),
        a.also_read,
        Some(a.weight),
        bias,
        starts,
        indices,
        initial,
        o.checkpoint_offsets.as_ref(),
        o.checkpoint_slots.as_ref(),
    ];
    out.expect_disjoint_from(&inputs)?;
    if let Some(s) = states {
        s.expect_disjoint_from(&inputs)?;
        out.expect_disjoint(s)?;
    }
    let batch = parse_batch(
        ["query_start_loc", "cache_indices", "has_initial_state"],
        starts,
        t,
        indices,
        initial,
        a.pad_slot_id,
        num_slots,
    )?;
    if let (None, Some(b)) = (states, batch.initial.iter().position(|&i| i)) {
        bail!(
            InvalidArgument,
            "has_initial_state[{b}] = true but conv_states is NULL, expected false (no state to continue from)"
        );
    }
    let lens: Vec<usize> = (0..batch.len()).map(|b| batch.tokens(b).len()).collect();
    let padded: Vec<bool> = batch.slots.iter().map(Option::is_none).collect();
    let own: Vec<usize> = match states {
        Some(_) => batch.slots.iter().flatten().copied().collect(),
        None => Vec::new(),
    };
    let checkpoints = parse_checkpoints(
        CheckpointTables {
            offsets: o.checkpoint_offsets.as_ref(),
            slots: o.checkpoint_slots.as_ref(),
        },
        &lens,
        &padded,
        &own,
        a.pad_slot_id,
        num_slots,
        false,
    )?;
    let checkpoints = match states {
        Some(st) => checkpoints
            .iter()
            .enumerate()
            .flat_map(|(seq, cps)| {
                cps.iter().map(move |cp| Checkpoint {
                    seq,
                    after: cp.after,
                    state: elem_ptr(st, &[cp.slot, 0, 0]),
                })
            })
            .collect(),
        None => Vec::new(),
    };
    let seqs = (0..batch.len())
        .map(|b| {
            let tokens = batch.tokens(b);
            let slot = batch.slots[b];
            Seq {
                x: elem_ptr(x, &[tokens.start, 0]),
                out: elem_ptr(out, &[tokens.start, 0]),
                len: tokens.len(),
                pad: slot.is_none(),
                state: states.zip(slot).map(|(s, slot)| elem_ptr(s, &[slot, 0, 0])),
                read_state: batch.initial[b],
                update: StateUpdate::Append,
            }
        })
        .collect();
    Ok(Problem {
        act,
        channels: d,
        width: w,
        silu: a.silu,
        x_tok: x.strides[0],
        x_ch: x.strides[1],
        out_tok: out.strides[0],
        out_ch: out.strides[1],
        weight: wm,
        bias: bm,
        state_dtype: states.map_or(act, |s| s.dtype),
        state_rows: states.map_or(0, |s| s.shape[1]),
        state_row: states.map_or(0, |s| s.strides[1]),
        state_ch: states.map_or(0, |s| s.strides[2]),
        gates: None,
        seqs,
        checkpoints,
    })
}

/// Causal depthwise conv1d over a packed batch of variable-length sequences, continuing from and
/// updating per-sequence state slots: prefill, chunked-prefill continuation, and decodes (length-1
/// sequences with state) mixed in one call.
///
/// Per sequence `b` with tokens `query_start_loc[b] .. query_start_loc[b+1]` and slot
/// `s = cache_indices[b]`: the history `h[-W+1..-1]` is rows `0..W-2` of `conv_states[s]` (row `j`
/// holds the input at relative time `j-(W-1)`, row 0 oldest) when `has_initial_state[b]`, else
/// zeros. `out[t][c] = act(bias[c] + sum_k weight[c][k] * xin[t-(W-1)+k][c])`, accumulated in f32 with
/// fused multiply-adds, tap 0 first; narrow outputs are rounded to nearest-even. Afterwards rows
/// `0..W-2` of the slot hold the last `W-1` inputs of `[history, x_seq]` (a zero-length sequence keeps
/// its state when it has an initial state and gets zeros when it has not); rows `W-1..L-1` are never
/// touched. Splitting a sequence over two calls (the second with `has_initial_state` true) gives
/// bit-identical outputs and state. Tokens outside every sequence are not touched.
///
/// Padded sequences (slot == `pad_slot_id`) get zero output rows and their state is neither read
/// nor written. Results are bitwise identical for any thread count and do not depend on which other
/// sequences share the call. Every argument is validated before anything is written. Thread-safe:
/// concurrent calls must not write memory another call reads or writes.
///
/// State checkpoints (ABI.md §4.10, prefix caching at block granularity): with `checkpoint_offsets`
/// and `checkpoint_slots` (`[B, C]` int32/int64 each, equal shapes), for each entry whose slot is
/// not `pad_slot_id` the state after token `o = checkpoint_offsets[b][c]` (`1 <= o <= len_b`) of
/// sequence `b` is also written to slot `checkpoint_slots[b][c]` of the same pool, in its dtype:
/// the value a call ending at that token would have stored there (rows `0..W-2` of the checkpoint
/// slot hold the last `W-1` inputs, bit for bit; rows `W-1..L-1` are never touched). Entries of
/// padded sequences and entries whose slot is `pad_slot_id` are ignored whole (their offsets are
/// not checked); a table with no other entry, or `C = 0`, is accepted wherever NULL is (also in
/// speculative mode or without a pool). `out` and every sequence's final state are bit-identical
/// with or without checkpoints, for any thread count.
///
/// @param ctx               context (threads), or NULL for the process default.
/// @param x                 `[T, D]` float32, bfloat16 or float16: the activations. Any strides;
///                          contiguous channels (`strides[1] == 1`) take the fast path.
/// @param weight            `[D, W]`, `W` in 2..=8, the dtype of `x` or float32.
/// @param bias              `[D]`, the dtype of `x` or float32, or NULL for no bias.
/// @param conv_states       `[S, L, D]` state pool, `L >= W-1`, the dtype of `x` or float32; read and
///                          written. Any strides (a channel-major `[S, D, L]` buffer is passed as its
///                          transposed view). NULL: zero history, nothing written.
/// @param query_start_loc   `[B+1]` int32/int64 offsets `0 <= q[0] <= .. <= q[B] <= T`, or NULL for one
///                          sequence of all `T` tokens.
/// @param cache_indices     `[B]` int32/int64 slots, distinct unless padded, or NULL (sequence `b` uses slot `b`).
/// @param has_initial_state `[B]` bool/uint8/int32/int64 (non-zero = continue from the slot), or NULL
///                          (all false: the state is never read). True requires `conv_states`.
/// @param activation        SSMK_ACTIVATION_NONE (0) or SSMK_ACTIVATION_SILU (1).
/// @param pad_slot_id       slot value that marks a padded sequence (vLLM uses -1).
/// @param out               `[T, D]`, the dtype of `x`; written. Must not overlap any input or `conv_states`.
/// @param checkpoint_offsets  `[B, C]` int32/int64 token counts (state after that many tokens of
///                            the sequence), or NULL (then `checkpoint_slots` must be NULL too).
/// @param checkpoint_slots    `[B, C]` int32/int64 slots of the pool the checkpoints go to, or NULL;
///                            distinct, none a slot of a sequence of the call.
/// @retval SSMK_OK                     done.
/// @retval SSMK_ERR_NULL_POINTER       `x`, `weight` or `out` is NULL, or a non-empty tensor has NULL data.
/// @retval SSMK_ERR_INVALID_ARGUMENT   bad ndim, shape, width, state length, activation, offsets
///                                     order, duplicate slot, or `has_initial_state` true without state.
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
pub unsafe extern "C" fn ssmk_causal_conv1d_fwd(
    ctx: *const ssmk_context,
    x: *const ssmk_tensor,
    weight: *const ssmk_tensor,
    bias: *const ssmk_tensor,
    conv_states: *mut ssmk_tensor,
    query_start_loc: *const ssmk_tensor,
    cache_indices: *const ssmk_tensor,
    has_initial_state: *const ssmk_tensor,
    activation: u32,
    pad_slot_id: i64,
    out: *mut ssmk_tensor,
    checkpoint_offsets: *const ssmk_tensor,
    checkpoint_slots: *const ssmk_tensor,
) -> i32 {
    guard(|| {
        let ctx = unsafe { resolve(ctx) };
        let x = unsafe { View::required("x", x) }?;
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
        let silu = parse_activation(activation)?;
        let p = prefill_problem(&PrefillArgs {
            x: &x,
            weight: &weight,
            optional: &optional,
            silu,
            pad_slot_id,
            out: &out,
            also_read: None,
        })?;
        conv::run(ctx, &p);
        Ok(())
    })
}

/// One decode step, or a speculative verify of `Q` tokens per sequence, of the causal depthwise
/// conv1d, updating each sequence's state slot in place. The state is always read.
///
/// Without `num_accepted_tokens`: the `Q` tokens of sequence `b` are appended in order to the window
/// in rows `0..W-2` of slot `s = conv_state_indices[b]` (the same result as ssmk_causal_conv1d_fwd on
/// a `Q`-token sequence with `has_initial_state` true); rows `W-1..L-1` are never touched. With it
/// (speculative decoding, rolling buffer, `L >= W-2+Q`): `n = num_accepted_tokens[b]`, the tokens
/// of the sequence's previous step that were accepted, must be in `[1, L-W+2]`; the history for
/// token 0 is rows `n-1 .. n+W-3`, and afterwards rows `0 .. W-3+Q` of the slot hold
/// `[old rows n .. n+W-3, x_b[0..Q)]` and rows `W-2+Q .. L-1` are not touched (vLLM's rule): the
/// next step finds its window at rows `n'-1 .. n'+W-3` whatever `Q` was, so the steps of one
/// sequence may verify different numbers of tokens. Arithmetic, rounding, padding (zero outputs,
/// state untouched; `num_accepted_tokens` of padded sequences is ignored), determinism and thread
/// safety are as for ssmk_causal_conv1d_fwd.
///
/// @param ctx                 context (threads), or NULL for the process default.
/// @param x                   `[B, D]` (one token per sequence) or `[B, Q, D]`, float32, bfloat16 or float16.
/// @param conv_states         `[S, L, D]`, the dtype of `x` or float32; read and written. Any strides.
/// @param weight              `[D, W]`, `W` in 2..=8, the dtype of `x` or float32.
/// @param bias                `[D]`, the dtype of `x` or float32, or NULL.
/// @param conv_state_indices  `[B]` int32/int64 slots, distinct unless padded, or NULL (slot `b`);
///                            vLLM's one-column block table `[B, 1]` is read as `[B]`.
/// @param num_accepted_tokens `[B]` int32/int64 accepted counts, or NULL (plain append).
/// @param activation          SSMK_ACTIVATION_NONE (0) or SSMK_ACTIVATION_SILU (1).
/// @param pad_slot_id         slot value that marks a padded sequence.
/// @param out                 the shape and dtype of `x`; written. Must not overlap any input or `conv_states`.
/// @retval SSMK_OK                     done.
/// @retval SSMK_ERR_NULL_POINTER       `x`, `conv_states`, `weight` or `out` is NULL, or a non-empty tensor has NULL data.
/// @retval SSMK_ERR_INVALID_ARGUMENT   bad ndim, shape, width, state length (`L < W-1`, or `L < W-2+Q`
///                                     with `num_accepted_tokens`), activation, duplicate slot, an
///                                     accepted count outside `[1, L-W+2]`, or `conv_state_indices`
///                                     `[B, k]` with `k > 1`.
/// @retval SSMK_ERR_UNSUPPORTED_DTYPE  a dtype outside the lists above.
/// @retval SSMK_ERR_OUT_OF_BOUNDS      a slot outside `[0, S)` that is not `pad_slot_id`.
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
pub unsafe extern "C" fn ssmk_causal_conv1d_update(
    ctx: *const ssmk_context,
    x: *const ssmk_tensor,
    conv_states: *mut ssmk_tensor,
    weight: *const ssmk_tensor,
    bias: *const ssmk_tensor,
    conv_state_indices: *const ssmk_tensor,
    num_accepted_tokens: *const ssmk_tensor,
    activation: u32,
    pad_slot_id: i64,
    out: *mut ssmk_tensor,
) -> i32 {
    guard(|| {
        let ctx = unsafe { resolve(ctx) };
        let x = unsafe { View::required("x", x) }?;
        let states = unsafe { View::required("conv_states", conv_states) }?;
        let weight = unsafe { View::required("weight", weight) }?;
        let bias = unsafe { View::optional("bias", bias) }?;
        let indices = unsafe { View::optional("conv_state_indices", conv_state_indices) }?;
        let accepted = unsafe { View::optional("num_accepted_tokens", num_accepted_tokens) }?;
        let out = unsafe { View::required("out", out) }?;
        let silu = parse_activation(activation)?;

        ensure!(
            x.ndim == 2 || x.ndim == 3,
            InvalidArgument,
            "x.ndim = {}, expected 2 ([B, D]) or 3 ([B, Q, D]) (shape {:?})",
            x.ndim,
            x.dims()
        );
        x.expect_dtype(&[DType::F32, DType::BF16, DType::F16])?;
        let three_d = x.ndim == 3;
        let (b, q, d, act) = if three_d {
            (x.shape[0], x.shape[1], x.shape[2], x.dtype)
        } else {
            (x.shape[0], 1, x.shape[1], x.dtype)
        };
        let (wm, bm, w) = parse_weights(act, d, &weight, bias.as_ref())?;
        out.expect_ndim(x.ndim)?;
        for dim in 0..x.ndim {
            out.expect_dim(dim, x.shape[dim], &format!("x.shape[{dim}]"))?;
        }
        out.expect_dtype(&[act])?;
        out.expect_no_self_overlap()?;
        let num_slots = match &accepted {
            Some(_) => parse_states(
                &states,
                act,
                d,
                (w - 2) + q,
                "W-2+Q (speculative rolling buffer)",
            )?,
            None => parse_states(&states, act, d, w - 1, "W-1")?,
        };
        let state_rows = states.shape[1];
        let inputs = [
            Some(&x),
            Some(&weight),
            bias.as_ref(),
            indices.as_ref(),
            accepted.as_ref(),
        ];
        out.expect_disjoint_from(&inputs)?;
        states.expect_disjoint_from(&inputs)?;
        out.expect_disjoint(&states)?;
        let indices = indices.map(block_table_column).transpose()?;
        let slots = parse_slots(
            "conv_state_indices",
            indices.as_ref(),
            b,
            pad_slot_id,
            Some(num_slots),
        )?;
        let accepted = match &accepted {
            Some(a) => {
                let n = a.read_indices(b, "number of sequences B")?;
                for (i, &n) in n.iter().enumerate() {
                    if slots[i].is_some() {
                        ensure!(
                            n >= 1 && n as u64 <= (state_rows + 2 - w) as u64,
                            InvalidArgument,
                            "num_accepted_tokens[{i}] = {n}, expected 1 <= n <= L-W+2 = {} (the window rows n-1 .. n+W-3 inside the L = {state_rows} state rows)",
                            state_rows + 2 - w
                        );
                    }
                }
                Some(n)
            }
            None => None,
        };

        let (x_tok, x_ch) = if three_d {
            (x.strides[1], x.strides[2])
        } else {
            (0, x.strides[1])
        };
        let (out_tok, out_ch) = if three_d {
            (out.strides[1], out.strides[2])
        } else {
            (0, out.strides[1])
        };
        let seqs = (0..b)
            .map(|i| Seq {
                x: elem_ptr(&x, &[i]),
                out: elem_ptr(&out, &[i]),
                len: q,
                pad: slots[i].is_none(),
                state: slots[i].map(|s| elem_ptr(&states, &[s])),
                read_state: true,
                update: match &accepted {
                    Some(n) if slots[i].is_some() => StateUpdate::Rolling {
                        accepted: n[i] as usize,
                    },
                    _ => StateUpdate::Append,
                },
            })
            .collect();
        let p = Problem {
            act,
            channels: d,
            width: w,
            silu,
            x_tok,
            x_ch,
            out_tok,
            out_ch,
            weight: wm,
            bias: bm,
            state_dtype: states.dtype,
            state_rows: states.shape[1],
            state_row: states.strides[1],
            state_ch: states.strides[2],
            gates: None,
            seqs,
            checkpoints: Vec::new(),
        };
        conv::run(ctx, &p);
        Ok(())
    })
}
