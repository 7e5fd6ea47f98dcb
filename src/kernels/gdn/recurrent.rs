//! The per-token recurrence in f32 SIMD, for decodes, speculative sequences and short prefills.
//!
//! Each column `v` of the state evolves on its own (`kv`, `delta` and the update of column `v`
//! only involve column `v`), so one task per (sequence, v-head) walks the columns in blocks of
//! `2 * LANES`: it loads the `K x 2*LANES` block once (L1-resident), runs every token over it and
//! stores it once: the state is streamed from memory exactly once per call (once per token written
//! in speculative mode). Partial or strided blocks go through a zero-padded buffer, so the SIMD
//! body never reads or writes outside the tensors.

use super::{DeltaRule, Sequence, StateWrite, load_row, store_row};
use crate::kernels::chunking::TaskBuffer;
use crate::kernels::decode_rows::{ColumnTerms, StateColumns, StateRows, copy_to_checkpoints};
use crate::kernels::simd::{Simd, SimdElement, exp_into};
use crate::kernels::state_blocks::HeadStates;

/// Per-token inputs of one (sequence, v-head), converted to f32 once, in one task buffer (no
/// allocation per task) followed by `extra` floats of zeroed scratch for the caller.
struct Tokens {
    buf: TaskBuffer,
    kd: usize,
    vd: usize,
    len: usize,
    decays: usize,
}

/// The rows of [`Tokens`]: per token `q`, `k` (`K` each), `v` (`V`), the decays `exp(g)` (one,
/// or `K` with per-channel decays) and `beta`.
struct TokenRows<'a> {
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    decay: &'a mut [f32],
    beta: &'a mut [f32],
}

impl Tokens {
    /// Floats of the token rows, rounded up to a 64-byte line (the buffer's alignment), so the
    /// caller's scratch after them, read and written as vectors, starts on one.
    fn rows_floats(kd: usize, vd: usize, len: usize, decays: usize) -> usize {
        (len * (2 * kd + vd + decays + 1)).next_multiple_of(16)
    }

    /// The token rows and the caller's scratch.
    fn split(&mut self) -> (TokenRows<'_>, &mut [f32]) {
        let (kd, vd, len) = (self.kd, self.vd, self.len);
        let (rows, extra) = self
            .buf
            .split_at_mut(Tokens::rows_floats(kd, vd, len, self.decays));
        let (q, rest) = rows.split_at_mut(len * kd);
        let (k, rest) = rest.split_at_mut(len * kd);
        let (v, rest) = rest.split_at_mut(len * vd);
        let (decay, rest) = rest.split_at_mut(len * self.decays);
        let beta = &mut rest[..len];
        (
            TokenRows {
                q,
                k,
                v,
                decay,
                beta,
            },
            extra,
        )
    }
}

impl TokenRows<'_> {
    /// The decays of token `i`: one value, or one per state row.
    fn decay(&self, i: usize, per_channel: bool, kd: usize) -> &[f32] {
        match per_channel {
            true => &self.decay[i * kd..(i + 1) * kd],
            false => &self.decay[i..i + 1],
        }
    }
}

#[inline(always)]
unsafe fn load_tokens<S: Simd>(
    args: &DeltaRule,
    seq: &Sequence,
    hv: usize,
    extra: usize,
) -> Tokens {
    let (kd, vd, len) = (args.k_dim, args.v_dim, seq.len);
    let h = args.qk_head(hv);
    let decays = if args.per_channel { kd } else { 1 };
    let mut tokens = Tokens {
        buf: TaskBuffer::take(Tokens::rows_floats(kd, vd, len, decays) + decays + extra),
        kd,
        vd,
        len,
        decays,
    };
    let (t, scratch) = tokens.split();
    let g_row = &mut scratch[..decays];
    for i in 0..len {
        let tok = seq.start + i;
        args.prefetch_v(tok + super::PREFETCH_TOKENS, hv, false);
        unsafe {
            args.load_qk::<S>(
                tok,
                h,
                &mut t.q[i * kd..(i + 1) * kd],
                &mut t.k[i * kd..(i + 1) * kd],
            );
            load_row(
                args.v.at(&[tok, hv]),
                args.v.dtype,
                args.v.strides[2],
                &mut t.v[i * vd..(i + 1) * vd],
            );
            let (g, b) = args.gate(tok, hv);
            t.beta[i] = b;
            if args.per_channel {
                args.log_decays(tok, hv, g_row);
            } else {
                g_row[0] = g;
            }
            exp_into::<S>(g_row, &mut t.decay[i * decays..(i + 1) * decays]);
        }
    }
    g_row.fill(0.0);
    tokens
}

/// The call's state pool as column blocks.
fn head_states(args: &DeltaRule) -> HeadStates<'_> {
    HeadStates::of(args.state.as_ref(), args.k_dim, args.v_dim)
}

/// One token over one column block: `kv = (a S)^T k`, `delta = beta (v - kv)`,
/// `S = a S + k delta^T`, `o = S^T q` (q carries the scale), with `decay` one value `a` or, with
/// `PER_CHANNEL`, one per row (`a S` = `diag(a) S`, folded into `kv` as `S^T (a * k)`). Two
/// accumulators per vector (even and odd rows) hide the FMA latency; the order is fixed, so
/// results are deterministic.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn token<S: Simd, const PER_CHANNEL: bool>(
    block: &mut [f32],
    kd: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32; 32],
    decay: &[f32],
    beta: f32,
    o: &mut [f32; 32],
) {
    let l = S::LANES;
    let w = 2 * l;
    // The k of `kv`'s sum: `a * k` per row with per-channel decays.
    let kv_k = |r: usize| match PER_CHANNEL {
        true => k[r] * decay[r],
        false => k[r],
    };
    unsafe {
        let p = block.as_mut_ptr();
        let mut kv = [S::zero(); 4];
        let mut r = 0;
        while r + 2 <= kd {
            let (k0, k1) = (S::splat(kv_k(r)), S::splat(kv_k(r + 1)));
            let (row0, row1) = (p.add(r * w), p.add((r + 1) * w));
            kv[0] = S::fma(S::load_f32(row0), k0, kv[0]);
            kv[1] = S::fma(S::load_f32(row0.add(l)), k0, kv[1]);
            kv[2] = S::fma(S::load_f32(row1), k1, kv[2]);
            kv[3] = S::fma(S::load_f32(row1.add(l)), k1, kv[3]);
            r += 2;
        }
        if r < kd {
            let k0 = S::splat(kv_k(r));
            let row0 = p.add(r * w);
            kv[0] = S::fma(S::load_f32(row0), k0, kv[0]);
            kv[1] = S::fma(S::load_f32(row0.add(l)), k0, kv[1]);
        }
        // Without PER_CHANNEL, `a` scales the sum: (a S)^T k = a (S^T k).
        let kv_scale = S::splat(if PER_CHANNEL { 1.0 } else { decay[0] });
        let b = S::splat(beta);
        // delta = beta * (v - kv)
        let d0 = S::mul(
            b,
            S::sub(
                S::load_f32(v.as_ptr()),
                S::mul(kv_scale, S::add(kv[0], kv[2])),
            ),
        );
        let d1 = S::mul(
            b,
            S::sub(
                S::load_f32(v.as_ptr().add(l)),
                S::mul(kv_scale, S::add(kv[1], kv[3])),
            ),
        );
        let mut acc = [S::zero(); 4];
        let a_head = S::splat(decay[0]);
        let mut r = 0;
        while r < kd {
            let half = (r & 1) * 2;
            let (kr, qr) = (S::splat(k[r]), S::splat(q[r]));
            let a = if PER_CHANNEL {
                S::splat(decay[r])
            } else {
                a_head
            };
            let row = p.add(r * w);
            let s0 = S::fma(S::load_f32(row), a, S::mul(kr, d0));
            let s1 = S::fma(S::load_f32(row.add(l)), a, S::mul(kr, d1));
            S::store_f32(row, s0);
            S::store_f32(row.add(l), s1);
            acc[half] = S::fma(s0, qr, acc[half]);
            acc[half + 1] = S::fma(s1, qr, acc[half + 1]);
            r += 1;
        }
        S::store_f32(o.as_mut_ptr(), S::add(acc[0], acc[2]));
        S::store_f32(o.as_mut_ptr().add(l), S::add(acc[1], acc[3]));
    }
}

/// Runs one (sequence, v-head) through the recurrence.
///
/// # Safety
/// As for [`super::gated_delta_rule`]; the CPU supports `S`; `2 * S::LANES <= 32`.
#[inline(always)]
pub unsafe fn sequence_head<S: Simd, St: SimdElement>(args: &DeltaRule, seq: &Sequence, hv: usize) {
    let (kd, vd) = (args.k_dim, args.v_dim);
    let w = 2 * S::LANES;
    let blocks_n = vd.div_ceil(w);
    let mut tokens = unsafe { load_tokens::<S>(args, seq, hv, blocks_n * kd * w) };
    let (tokens, scratch) = tokens.split();
    let blocks = &mut scratch[..blocks_n * kd * w];
    if let Some(slot) = seq.read {
        unsafe { head_states(args).load::<S, St>(slot, hv, blocks) };
    }
    let (mut v, mut o) = ([0f32; 32], [0f32; 32]);
    let out = &args.out;
    for b in 0..blocks_n {
        let v0 = b * w;
        let width = w.min(vd - v0);
        for i in 0..seq.len {
            v[..width].copy_from_slice(&tokens.v[i * vd + v0..i * vd + v0 + width]);
            v[width..w].iter_mut().for_each(|x| *x = 0.0);
            let block = &mut blocks[b * kd * w..(b + 1) * kd * w];
            let (q, k) = (
                &tokens.q[i * kd..(i + 1) * kd],
                &tokens.k[i * kd..(i + 1) * kd],
            );
            let decay = tokens.decay(i, args.per_channel, kd);
            unsafe {
                match args.per_channel {
                    true => token::<S, true>(block, kd, q, k, &v, decay, tokens.beta[i], &mut o),
                    false => token::<S, false>(block, kd, q, k, &v, decay, tokens.beta[i], &mut o),
                }
                store_row(
                    out.at(&[seq.start + i, hv, v0]),
                    out.dtype,
                    out.strides[2],
                    &o[..width],
                );
            }
            if let StateWrite::PerToken(slots) = &seq.write
                && let Some(slot) = slots[i]
            {
                unsafe { head_states(args).store::<S, St>(slot, hv, &blocks[..], b, b + 1) };
            }
            for cp in seq.checkpoints_after(i + 1) {
                unsafe { head_states(args).store::<S, St>(cp.slot, hv, &blocks[..], b, b + 1) };
            }
        }
    }
    if let StateWrite::Final(slot) = seq.write {
        unsafe { head_states(args).store::<S, St>(slot, hv, blocks, 0, blocks_n) };
    }
}
/// A decode (one token) on a contiguous state of dtype `St`, straight on the state rows:
/// pass 1 streams the slot from memory accumulating `kv = S^T k`, pass 2 re-reads the rows (now in
/// L2), writes the updated rows and accumulates `o`. No copy of the state is made. Returns false
/// (nothing done) when the layout does not fit, so the caller takes the blocked path.
///
/// # Safety
/// As for [`sequence_head`].
#[inline(always)]
pub unsafe fn decode<S: Simd, St: SimdElement>(
    args: &DeltaRule,
    seq: &Sequence,
    hv: usize,
) -> bool {
    let Some(st) = args.state.as_ref() else {
        return false;
    };
    if seq.len != 1 || st.strides[3] != 1 || st.dtype != St::DTYPE {
        return false;
    }
    let write = seq.write.after_first_token();
    let (kd, vd) = (args.k_dim, args.v_dim);
    let mut tokens = unsafe { load_tokens::<S>(args, seq, hv, vd + kd) };
    let (t, scratch) = tokens.split();
    let (o, rest) = scratch.split_at_mut(vd);
    let scaled_k = &mut rest[..kd];
    let (q, k) = (&t.q[..kd], &t.k[..kd]);
    let (decays, beta) = (t.decay(0, args.per_channel, kd), t.beta[0]);
    // The column sums are `S^T (a * k)` per channel, or `a (S^T k)` per head.
    let (kv_k, kv_scale): (&[f32], f32) = match args.per_channel {
        true => {
            for ((sk, &kr), &a) in scaled_k.iter_mut().zip(k).zip(decays) {
                *sk = kr * a;
            }
            (scaled_k, 1.0)
        }
        false => (k, decays[0]),
    };
    let row = |slot: usize, r: usize| st.at(&[slot, hv, r, 0]).cast::<St>();
    let rows = StateRows {
        read: seq.read.map(|slot| row(slot, 0).cast_const()),
        write: write.map(|slot| row(slot, 0)),
        row_stride: st.strides[2],
        x: kv_k,
        decays: (decays, args.per_channel),
        k,
        k2: None,
        q,
        // The next task is usually the next v-head of this slot.
        next: seq
            .read
            .filter(|_| hv + 1 < args.v_heads)
            .map(|slot| row(slot, 0).wrapping_add(st.strides[1]).cast_const()),
    };
    let delta = &Delta {
        v: &t.v[..vd],
        beta,
        kv_scale,
    };
    unsafe {
        rows.run::<S, _>(delta, o);
        copy_to_checkpoints(seq, write, kd, vd, row);
        let out = &args.out;
        store_row(out.at(&[seq.start, hv, 0]), out.dtype, out.strides[2], o);
    }
    true
}

/// A decode (one token) on a k-contiguous state of dtype `St` (`[slot][hv][v][k]`: llama.cpp's
/// ggml keeps each head's state transposed). State row `j` is column `j` of `S`, and columns
/// evolve independently, so each row is read once, its `kv_j`, `delta_j`, new values and `o_j`
/// computed while it is in L1, and written back: one pass over the slot, where the v-contiguous
/// [`decode`] needs two. Returns false (nothing done) when the layout does not fit.
///
/// # Safety
/// As for [`sequence_head`].
#[inline(always)]
pub unsafe fn decode_transposed<S: Simd, St: SimdElement>(
    args: &DeltaRule,
    seq: &Sequence,
    hv: usize,
) -> bool {
    let Some(st) = args.state.as_ref() else {
        return false;
    };
    if seq.len != 1 || st.strides[2] != 1 || st.dtype != St::DTYPE {
        return false;
    }
    let write = seq.write.after_first_token();
    let (kd, vd) = (args.k_dim, args.v_dim);
    let mut tokens = unsafe { load_tokens::<S>(args, seq, hv, vd + kd) };
    let (t, scratch) = tokens.split();
    let (o, rest) = scratch.split_at_mut(vd);
    let scaled_k = &mut rest[..kd];
    let (decays, beta) = (t.decay(0, args.per_channel, kd), t.beta[0]);
    // `kv` sums `(a * k) . S[j]` per channel, or `a (k . S[j])` per head.
    let (kv_k, kv_scale): (&[f32], f32) = match args.per_channel {
        true => {
            for ((sk, &kr), &a) in scaled_k.iter_mut().zip(&t.k[..kd]).zip(decays) {
                *sk = kr * a;
            }
            (scaled_k, 1.0)
        }
        false => (&t.k[..kd], decays[0]),
    };
    let row = |slot: usize, j: usize| st.at(&[slot, hv, 0, j]).cast::<St>();
    let columns = StateColumns {
        read: seq.read.map(|slot| row(slot, 0).cast_const()),
        write: write.map(|slot| row(slot, 0)),
        row_stride: st.strides[3],
        dot: kv_k,
        decays: (decays, args.per_channel),
        k: &t.k[..kd],
        k2: None,
        q: &t.q[..kd],
    };
    let delta = &Delta {
        v: &t.v[..vd],
        beta,
        kv_scale,
    };
    unsafe {
        columns.run::<S, _>(delta, o);
        copy_to_checkpoints(seq, write, vd, kd, row);
        let out = &args.out;
        store_row(out.at(&[seq.start, hv, 0]), out.dtype, out.strides[2], o);
    }
    true
}

/// A checkpoint inside a chunk (ABI.md §4.10): the state of v-head `hv` after the `len` tokens
/// from packed token `start`, run through the recurrence from the f32 state `s0` (`[K][V]`, the
/// chunk's start), stored to `slot` rounded to the state dtype. `s0` is not changed.
///
/// # Safety
/// As for [`sequence_head`]; `slot` is this task's alone.
#[inline(always)]
pub unsafe fn checkpoint_from<S: Simd, St: SimdElement>(
    args: &DeltaRule,
    hv: usize,
    s0: &[f32],
    start: usize,
    len: usize,
    slot: usize,
) {
    let (kd, vd, w) = (args.k_dim, args.v_dim, 2 * S::LANES);
    let span = Sequence {
        start,
        len,
        padded: false,
        read: None,
        write: StateWrite::Nothing,
        checkpoints: Vec::new(),
    };
    let blocks_n = vd.div_ceil(w);
    let mut tokens = unsafe { load_tokens::<S>(args, &span, hv, blocks_n * kd * w) };
    let (tokens, scratch) = tokens.split();
    let blocks = &mut scratch[..blocks_n * kd * w];
    let (mut v, mut o) = ([0f32; 32], [0f32; 32]);
    for b in 0..blocks_n {
        let v0 = b * w;
        let width = w.min(vd - v0);
        let block = &mut blocks[b * kd * w..(b + 1) * kd * w];
        for r in 0..kd {
            block[r * w..r * w + width].copy_from_slice(&s0[r * vd + v0..r * vd + v0 + width]);
        }
        for i in 0..len {
            v[..width].copy_from_slice(&tokens.v[i * vd + v0..i * vd + v0 + width]);
            v[width..w].iter_mut().for_each(|x| *x = 0.0);
            let (q, k) = (
                &tokens.q[i * kd..(i + 1) * kd],
                &tokens.k[i * kd..(i + 1) * kd],
            );
            let decay = tokens.decay(i, args.per_channel, kd);
            unsafe {
                match args.per_channel {
                    true => token::<S, true>(block, kd, q, k, &v, decay, tokens.beta[i], &mut o),
                    false => token::<S, false>(block, kd, q, k, &v, decay, tokens.beta[i], &mut o),
                }
            }
        }
    }
    unsafe { head_states(args).store::<S, St>(slot, hv, blocks, 0, blocks_n) };
}

/// The one rank-1 term of a delta-rule column: `delta = beta (v_j - kv_scale kv)`.
struct Delta<'a> {
    v: &'a [f32],
    beta: f32,
    kv_scale: f32,
}

impl ColumnTerms for Delta<'_> {
    const TWO_TERMS: bool = false;
    #[inline(always)]
    fn terms(&self, j: usize, kv: f32) -> (f32, f32) {
        (self.beta * (self.v[j] - self.kv_scale * kv), 0.0)
    }
}
