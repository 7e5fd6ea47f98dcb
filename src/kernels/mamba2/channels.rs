//! Scans of one channel per head (`P = 1`): Mamba-1's `d_inner` channels (ABI.md §4.9 with `A`
//! `[NH, N]`), where a channel's work per token is an `N`-long state and `N` exponentials.
//!
//! Channels sit in SIMD lanes. A task takes one sequence and a block of up to
//! [`BLOCK_VECTORS`] vectors of channels of one group, keeps their states `[N][block]` in L1 and
//! runs every token through them: B and C of a token are read once per block (one broadcast per
//! state channel), and the `exp(d A)` of every (channel, state channel) is whole-vector work. A
//! task per (sequence, head) with the state channels in lanes, as the general recurrence runs,
//! would reload B and C and reduce across lanes per channel and token, and spend a task on 16
//! numbers of state in a decode.
//!
//! Inputs are staged a tile of tokens at a time as `[token][channel]` f32 rows: token-major views
//! (`[T, d_inner]`) load rows; channel-major ones (tokens contiguous: vLLM's `[d_inner, T]`,
//! Hugging Face's `[B, d_inner, L]`) load each channel's tokens and transpose them in 8 x 8
//! blocks; outputs go back the same way. States move through the same transposes.

use super::Scan;
use crate::dtype::DType;
use crate::kernels::chunking::TaskBuffer;
use crate::kernels::gdn::gating::softplus_v;
use crate::kernels::simd::{Simd, load_row_simd, store_row_simd, transpose};
use crate::kernels::strided::Strided;
use crate::kernels::{Sequence, StateWrite};
use std::ops::Range;

/// Vectors of channels a task carries (64 channels on AVX-512): four independent chains per
/// state channel hide the latency of the exponentials, and the states (4 KiB at N = 16) stay in
/// L1.
pub(super) const BLOCK_VECTORS: usize = 4;

/// Tokens staged at a time.
const TILE: usize = 32;

/// Whether `v` (indexed `[token, channel, ..]`) is channel-major: tokens contiguous, channels not.
fn channel_major(v: &Strided, tokens: usize) -> bool {
    v.strides[0] == 1 && v.strides[1] != 1 && tokens > 1
}

/// Tokens `t0 .. t0 + tt` of channels `c0 .. c0 + w` of `v` (indexed `[token, channel, ..]`) into
/// `dst[i * wp + c]` as f32; `tmp` holds `w` rows of `ld >= tt`.
///
/// # Safety
/// The CPU supports `S`; the tokens and channels are inside `v`; `dst` holds `tt` rows of `wp`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stage_in<S: Simd>(
    v: &Strided,
    t0: usize,
    tt: usize,
    ld: usize,
    c0: usize,
    w: usize,
    wp: usize,
    dst: &mut [f32],
    tmp: &mut [f32],
) {
    unsafe {
        if channel_major(v, tt) {
            for c in 0..w {
                let row = &mut tmp[c * ld..c * ld + tt];
                load_row_simd::<S>(v.at(&[t0, c0 + c]), v.dtype, 1, row);
            }
            transpose(tmp.as_ptr(), ld, dst.as_mut_ptr(), wp, w, tt);
        } else {
            for i in 0..tt {
                let row = &mut dst[i * wp..i * wp + w];
                load_row_simd::<S>(v.at(&[t0 + i, c0]), v.dtype, v.strides[1], row);
            }
        }
    }
}

/// The inverse of [`stage_in`]: `src[i * wp + c]` to tokens `t0 ..` of channels `c0 ..` of `v`,
/// rounded to its dtype.
///
/// # Safety
/// As for [`stage_in`], `v` writable.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stage_out<S: Simd>(
    v: &Strided,
    t0: usize,
    tt: usize,
    ld: usize,
    c0: usize,
    w: usize,
    wp: usize,
    src: &[f32],
    tmp: &mut [f32],
) {
    unsafe {
        if channel_major(v, tt) {
            transpose(src.as_ptr(), wp, tmp.as_mut_ptr(), ld, tt, w);
            for c in 0..w {
                let row = &tmp[c * ld..c * ld + tt];
                store_row_simd::<S>(v.at(&[t0, c0 + c]), v.dtype, 1, row);
            }
        } else {
            for i in 0..tt {
                let row = &src[i * wp..i * wp + w];
                store_row_simd::<S>(v.at(&[t0 + i, c0]), v.dtype, v.strides[1], row);
            }
        }
    }
}

/// Slot `slot`'s states of channels `c0 .. c0 + w` into `h[n * wp + c]`.
///
/// # Safety
/// As for [`sequence_block`]; `slot < S`; `tmp` holds `w` rows of `N`.
#[inline(always)]
unsafe fn load_states<S: Simd>(
    args: &Scan,
    slot: usize,
    c0: usize,
    w: usize,
    wp: usize,
    h: &mut [f32],
    tmp: &mut [f32],
) {
    let st = args
        .state
        .as_ref()
        .expect("a state slot without a state tensor");
    let nd = args.state_dim;
    unsafe {
        if st.dtype == DType::F32 && st.strides[3] == 1 {
            // The channels' rows straight from the pool.
            let rows = st.at(&[slot, c0, 0, 0]).cast::<f32>();
            transpose(rows, st.strides[1], h.as_mut_ptr(), wp, w, nd);
            return;
        }
        for c in 0..w {
            let row = &mut tmp[c * nd..(c + 1) * nd];
            load_row_simd::<S>(st.at(&[slot, c0 + c, 0, 0]), st.dtype, st.strides[3], row);
        }
        transpose(tmp.as_ptr(), nd, h.as_mut_ptr(), wp, w, nd);
    }
}

/// `h[n * wp + c]` to slot `slot`'s states of channels `c0 .. c0 + w`, rounded to its dtype.
///
/// # Safety
/// As for [`load_states`].
#[inline(always)]
unsafe fn store_states<S: Simd>(
    args: &Scan,
    slot: usize,
    c0: usize,
    w: usize,
    wp: usize,
    h: &[f32],
    tmp: &mut [f32],
) {
    let st = args
        .state
        .as_ref()
        .expect("a state slot without a state tensor");
    let nd = args.state_dim;
    unsafe {
        if st.dtype == DType::F32 && st.strides[3] == 1 {
            let rows = st.at(&[slot, c0, 0, 0]).cast::<f32>();
            transpose(h.as_ptr(), wp, rows, st.strides[1], nd, w);
            return;
        }
        transpose(h.as_ptr(), wp, tmp.as_mut_ptr(), nd, nd, w);
        for c in 0..w {
            let row = &tmp[c * nd..(c + 1) * nd];
            store_row_simd::<S>(st.at(&[slot, c0 + c, 0, 0]), st.dtype, st.strides[3], row);
        }
    }
}

/// Runs one sequence for the channels (heads of `P = 1`) `heads`, all of one group.
///
/// # Safety
/// As for [`super::mamba2_scan`]; the CPU supports `S`; `P = 1`; the sequence is not padded.
#[inline(always)]
pub unsafe fn sequence_block<S: Simd>(args: &Scan, seq: &Sequence, heads: Range<usize>) {
    let (nd, l) = (args.state_dim, S::LANES);
    let (c0, w) = (heads.start, heads.len());
    let wp = w.next_multiple_of(l);
    let g = args.group(c0);
    // Buffers for the tokens of one tile (a decode needs one row, not `TILE`).
    let ld = TILE.min(seq.len).max(1);
    let tile = ld * wp;
    let z_len = if args.z.is_some() { tile } else { 0 };
    let tmp_len = wp * ld.max(nd);
    // Not zeroed: every value read is written first, padding lanes included (zeros: A = 0, a
    // decay of 1, and x = 0 keep their state 0; nothing of them is stored).
    let mut buf =
        TaskBuffer::take_reused(2 * nd * wp + 2 * wp + 3 * tile + z_len + ld * 2 * nd + tmp_len);
    let (a, rest) = buf.split_at_mut(nd * wp);
    let (h, rest) = rest.split_at_mut(nd * wp);
    let (skip, rest) = rest.split_at_mut(wp);
    let (bias, rest) = rest.split_at_mut(wp);
    let (x, rest) = rest.split_at_mut(tile);
    let (step, rest) = rest.split_at_mut(tile);
    let (y, rest) = rest.split_at_mut(tile);
    let (z, rest) = rest.split_at_mut(z_len);
    let (bc, tmp) = rest.split_at_mut(ld * 2 * nd);
    // `a[n * wp + c]`.
    match &args.a_states {
        // Rows of f32 straight from `A`.
        Some(at) if at.strides[1] == 1 => unsafe {
            transpose(
                at.at(&[c0, 0]).cast(),
                at.strides[0],
                a.as_mut_ptr(),
                wp,
                w,
                nd,
            )
        },
        Some(_) => {
            for c in 0..w {
                unsafe { args.a_row(c0 + c, &mut tmp[c * nd..(c + 1) * nd]) };
            }
            unsafe { transpose(tmp.as_ptr(), nd, a.as_mut_ptr(), wp, w, nd) };
        }
        None => {
            for n in 0..nd {
                a[n * wp..n * wp + w].copy_from_slice(&args.a[c0..c0 + w]);
            }
        }
    }
    skip[..w].copy_from_slice(&args.d[heads.clone()]);
    bias[..w].copy_from_slice(&args.dt_bias[heads]);
    skip[w..].fill(0.0);
    bias[w..].fill(0.0);
    unsafe {
        match seq.read {
            Some(slot) => load_states::<S>(args, slot, c0, w, wp, h, tmp),
            None => h.fill(0.0),
        }
        for n in 0..nd {
            a[n * wp + w..(n + 1) * wp].fill(0.0);
            h[n * wp + w..(n + 1) * wp].fill(0.0);
        }
        let (lo, hi) = (S::splat(args.dt_min), S::splat(args.dt_max));
        for t0 in (0..seq.len).step_by(ld) {
            let (tt, first) = (ld.min(seq.len - t0), seq.start + t0);
            stage_in::<S>(&args.x, first, tt, ld, c0, w, wp, x, tmp);
            stage_in::<S>(&args.dt, first, tt, ld, c0, w, wp, step, tmp);
            if let Some(zt) = &args.z {
                stage_in::<S>(zt, first, tt, ld, c0, w, wp, z, tmp);
            }
            for i in 0..tt {
                let pad = i * wp + w..(i + 1) * wp;
                x[pad.clone()].fill(0.0);
                step[pad.clone()].fill(0.0);
                if args.z.is_some() {
                    z[pad].fill(0.0);
                }
            }
            for i in 0..tt {
                let (b_row, c_row) = bc[i * 2 * nd..(i + 1) * 2 * nd].split_at_mut(nd);
                let (bt, ct) = (&args.b, &args.c);
                load_row_simd::<S>(bt.at(&[first + i, g]), bt.dtype, bt.strides[2], b_row);
                load_row_simd::<S>(ct.at(&[first + i, g]), ct.dtype, ct.strides[2], c_row);
                for j in (0..wp).step_by(l) {
                    let p = step.as_mut_ptr().add(i * wp + j);
                    let mut d = S::add(S::load_f32(p), S::load_f32(bias.as_ptr().add(j)));
                    if args.dt_softplus {
                        d = softplus_v::<S>(d);
                    }
                    // max/min return their second operand when either is NaN: NaN stays NaN.
                    S::store_f32(p, S::min(hi, S::max(lo, d)));
                }
            }
            for i in 0..tt {
                let (b_row, c_row) = (
                    bc.as_ptr().add(i * 2 * nd),
                    bc.as_ptr().add(i * 2 * nd + nd),
                );
                for j in (0..wp).step_by(l) {
                    let at = i * wp + j;
                    let d = S::load_f32(step.as_ptr().add(at));
                    let xv = S::load_f32(x.as_ptr().add(at));
                    let dx = S::mul(d, xv);
                    let mut acc = S::zero();
                    for n in 0..nd {
                        let decay = S::exp(S::mul(d, S::load_f32(a.as_ptr().add(n * wp + j))));
                        let hp = h.as_mut_ptr().add(n * wp + j);
                        let hv =
                            S::fma(S::load_f32(hp), decay, S::mul(dx, S::splat(*b_row.add(n))));
                        S::store_f32(hp, hv);
                        acc = S::fma(hv, S::splat(*c_row.add(n)), acc);
                    }
                    acc = S::fma(S::load_f32(skip.as_ptr().add(j)), xv, acc);
                    if args.z.is_some() {
                        // y z / (1 + e^-z): the clamped exp keeps the denominator finite.
                        let zv = S::load_f32(z.as_ptr().add(at));
                        let e = S::exp(S::sub(S::zero(), zv));
                        acc = S::div(S::mul(acc, zv), S::add(S::splat(1.0), e));
                    }
                    S::store_f32(y.as_mut_ptr().add(at), acc);
                }
                if let StateWrite::PerToken(slots) = &seq.write
                    && let Some(slot) = slots[t0 + i]
                {
                    store_states::<S>(args, slot, c0, w, wp, h, tmp);
                }
                for cp in seq.checkpoints_after(t0 + i + 1) {
                    store_states::<S>(args, cp.slot, c0, w, wp, h, tmp);
                }
            }
            stage_out::<S>(&args.out, first, tt, ld, c0, w, wp, y, tmp);
        }
        if let StateWrite::Final(slot) = seq.write {
            store_states::<S>(args, slot, c0, w, wp, h, tmp);
        }
    }
}
