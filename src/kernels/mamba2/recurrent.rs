//! The per-token recurrence in f32 SIMD, for decodes, speculative sequences and short prefills.
//!
//! Row `p` of a head's `P x N` state evolves on its own (`h[p] = a h[p] + d x[p] B`,
//! `y[p] = h[p] . C`), so one task per (sequence, head) takes the rows in memory order, runs every
//! token over each while it sits in L1 and stores it once: the state is streamed from memory once
//! per call (once per token written in speculative mode). Rows are zero-padded to whole vectors
//! in a local buffer, so the SIMD body never reads or writes outside the tensors.

use super::Scan;
use crate::kernels::chunking::TaskBuffer;
use crate::kernels::decode_rows::streamed_row_prefetch;
use crate::kernels::simd::{
    Simd, SimdElement, clamped_exp, load_row_simd, store_row_simd, transpose,
};
use crate::kernels::strided::{load_row, prefetch, store_row, write_f32};
use crate::kernels::{Sequence, StateWrite};

/// State rows ahead that [`rows`] prefetches when it copies a slot's rows through its row buffer
/// (a strided or differently typed state, or several tokens): 8 KiB of f32 rows of 128, as
/// measured for decodes on Zen 5 before they updated their rows in place (4 rows 13.3 ms, 16 rows
/// 10.2 ms, B = 64). The in-place decode ([`decode_head`]) prefetches its own way: see there.
const PREFETCH_ROWS: usize = 16;

/// `y = (y + D x) * silu(z)` (no gate when `z` is `None`) over one output row.
///
/// # Safety
/// The CPU supports `S`; `x` and `z` are at least as long as `y`.
#[inline(always)]
// `match` rather than `Option::map`: a closure would not inherit the caller's target features.
#[allow(clippy::manual_map)]
pub(super) unsafe fn finish_row<S: Simd>(y: &mut [f32], x: &[f32], z: Option<&[f32]>, d: f32) {
    let (l, n) = (S::LANES, y.len());
    let mut i = 0;
    unsafe {
        while i + l <= n {
            let zv = match z {
                Some(z) => Some(S::load_f32(z.as_ptr().add(i))),
                None => None,
            };
            let r = finish::<S>(
                S::load_f32(y.as_ptr().add(i)),
                S::load_f32(x.as_ptr().add(i)),
                zv,
                d,
            );
            S::store_f32(y.as_mut_ptr().add(i), r);
            i += l;
        }
        if i < n {
            let (mut yb, mut xb, mut zb) = ([0f32; 16], [0f32; 16], [0f32; 16]);
            yb[..n - i].copy_from_slice(&y[i..]);
            xb[..n - i].copy_from_slice(&x[i..n]);
            if let Some(z) = z {
                zb[..n - i].copy_from_slice(&z[i..n]);
            }
            let zv = match z {
                Some(_) => Some(S::load_f32(zb.as_ptr())),
                None => None,
            };
            let r = finish::<S>(S::load_f32(yb.as_ptr()), S::load_f32(xb.as_ptr()), zv, d);
            S::store_f32(yb.as_mut_ptr(), r);
            y[i..].copy_from_slice(&yb[..n - i]);
        }
    }
}

/// One vector of [`finish_row`] (a function, not a closure: closures do not inherit the caller's
/// target features, so theirs would not inline).
#[inline(always)]
unsafe fn finish<S: Simd>(y: S::V, x: S::V, z: Option<S::V>, d: f32) -> S::V {
    unsafe {
        let y = S::fma(S::splat(d), x, y);
        match z {
            // y z / (1 + e^-z): the clamped exp keeps the denominator finite.
            Some(z) => S::div(
                S::mul(y, z),
                S::add(S::splat(1.0), S::exp(S::sub(S::zero(), z))),
            ),
            None => y,
        }
    }
}

/// Loads row `p` of head `h` of `slot` into `row` (`N` values, zero-padded to `row.len()`).
///
/// # Safety
/// `slot < S`, `h < NH`, `p < P`; the CPU supports `S`; `row.len()` is a multiple of the lanes.
#[inline(always)]
pub(super) unsafe fn load_state_row<S: Simd, St: SimdElement>(
    args: &Scan,
    slot: usize,
    h: usize,
    p: usize,
    row: &mut [f32],
) {
    let st = args
        .state
        .as_ref()
        .expect("a state slot without a state tensor");
    let nd = args.state_dim;
    let src = st.at(&[slot, h, p, 0]);
    unsafe {
        if st.strides[3] == 1 && st.dtype == St::DTYPE {
            let full = nd / S::LANES * S::LANES;
            let src = src.cast::<St>();
            for n in (0..full).step_by(S::LANES) {
                S::store_f32(row.as_mut_ptr().add(n), St::load::<S>(src.add(n)));
            }
            for n in full..nd {
                row[n] = (*src.add(n)).to_f32();
            }
        } else {
            load_row(src, st.dtype, st.strides[3], &mut row[..nd]);
        }
    }
    row[nd..].iter_mut().for_each(|x| *x = 0.0);
}

/// Stores the first `N` values of `row` to row `p` of head `h` of `slot`, rounded to its dtype.
///
/// # Safety
/// As for [`load_state_row`].
#[inline(always)]
pub(super) unsafe fn store_state_row<S: Simd, St: SimdElement>(
    args: &Scan,
    slot: usize,
    h: usize,
    p: usize,
    row: &[f32],
) {
    let st = args
        .state
        .as_ref()
        .expect("a state slot without a state tensor");
    let nd = args.state_dim;
    let dst = st.at(&[slot, h, p, 0]);
    unsafe {
        if st.strides[3] == 1 && st.dtype == St::DTYPE {
            let full = nd / S::LANES * S::LANES;
            let dst = dst.cast::<St>();
            for n in (0..full).step_by(S::LANES) {
                St::store::<S>(dst.add(n), S::load_f32(row.as_ptr().add(n)));
            }
            for n in full..nd {
                *dst.add(n) = St::from_f32(row[n]);
            }
        } else {
            store_row(dst, st.dtype, st.strides[3], &row[..nd]);
        }
    }
}

/// The decays of the state rows' updates: one factor per token for the whole row (`A` per head),
/// or one per token and state channel (`A` per state channel, Mamba-1). A type, not a branch, so
/// each form's row loop is compiled on its own.
trait Decays<S: Simd>: Copy {
    /// The factors of token `i` for state channels `n .. n + LANES`.
    unsafe fn at(self, i: usize, n: usize) -> S::V;

    /// The factor of token `i` for state channel `n` alone.
    fn one(self, i: usize, n: usize) -> f32;
}

/// `decay[i]` for every channel of token `i`.
#[derive(Clone, Copy)]
struct PerHead<'a>(&'a [f32]);

/// `decay[i * np + n]`: rows of `np` factors, zero-padded `A` giving 1 past `N`.
#[derive(Clone, Copy)]
struct PerState<'a>(&'a [f32], usize);

impl<S: Simd> Decays<S> for PerHead<'_> {
    #[inline(always)]
    unsafe fn at(self, i: usize, _: usize) -> S::V {
        unsafe { S::splat(self.0[i]) }
    }

    #[inline(always)]
    fn one(self, i: usize, _: usize) -> f32 {
        self.0[i]
    }
}

/// One token's factor for every channel, held by value: read from a slice inside a decode's row
/// loop, the factor was loaded again for every vector (the rows' stores might alias it).
#[derive(Clone, Copy)]
struct Factor(f32);

impl<S: Simd> Decays<S> for Factor {
    #[inline(always)]
    unsafe fn at(self, _: usize, _: usize) -> S::V {
        unsafe { S::splat(self.0) }
    }

    #[inline(always)]
    fn one(self, _: usize, _: usize) -> f32 {
        self.0
    }
}

impl<S: Simd> Decays<S> for PerState<'_> {
    #[inline(always)]
    unsafe fn at(self, i: usize, n: usize) -> S::V {
        unsafe { S::load_f32(self.0.as_ptr().add(i * self.1 + n)) }
    }

    #[inline(always)]
    fn one(self, i: usize, n: usize) -> f32 {
        self.0[i * self.1 + n]
    }
}

/// Where the old state of a decode's rows comes from and their new state goes (see
/// [`decode_rows`]): one type per case, so the vector loop is compiled once per case with nothing
/// to test inside it (matching the `Option`s per vector kept its two sums on the stack, a
/// store-to-load round trip per vector: 14% of a B=64 decode's samples sat on that store). Trait
/// methods, not closures: a closure does not inherit the entry point's target features, and its
/// SIMD calls stay calls.
trait RowIo<S: Simd>: Copy {
    /// `decay * old + upd` for channels `n..n + LANES` of the row, or `upd` alone without an old
    /// state.
    unsafe fn next(self, n: usize, upd: S::V) -> S::V;
    unsafe fn store(self, n: usize, h: S::V);
}

/// Old state read through `src` (decayed by `decay`) and/or new state written through `dst`;
/// row `p` is `p * row_len` elements on.
#[derive(Clone, Copy)]
struct Slots<St, Dc> {
    src: Option<*const St>,
    dst: Option<*mut St>,
    row_len: usize,
    decay: Dc,
}

/// [`Slots`] with both pointers known present or absent at compile time.
#[derive(Clone, Copy)]
struct Known<St, Dc, const READ: bool, const WRITE: bool>(Slots<St, Dc>);

impl<St, Dc: Copy, const READ: bool, const WRITE: bool> Known<St, Dc, READ, WRITE> {
    /// Row `p`, as row 0.
    #[inline(always)]
    fn row(self, p: usize) -> Self {
        let at = p * self.0.row_len;
        Known(Slots {
            src: self.0.src.map(|src| src.wrapping_add(at)),
            dst: self.0.dst.map(|dst| dst.wrapping_add(at)),
            ..self.0
        })
    }
}

impl<S: Simd, St: SimdElement, Dc: Decays<S>, const READ: bool, const WRITE: bool> RowIo<S>
    for Known<St, Dc, READ, WRITE>
{
    #[inline(always)]
    unsafe fn next(self, n: usize, upd: S::V) -> S::V {
        match (READ, self.0.src) {
            (true, Some(src)) => unsafe {
                let old = St::load::<S>(src.add(n));
                S::fma(old, self.0.decay.at(0, n), upd)
            },
            _ => upd,
        }
    }

    #[inline(always)]
    unsafe fn store(self, n: usize, h: S::V) {
        if let (true, Some(dst)) = (WRITE, self.0.dst) {
            unsafe { St::store::<S>(dst.add(n), h) }
        }
    }
}

/// The whole vectors (`full` channels) of one decode row: `h = io.next(n, s B)`, stored by
/// `io.store`, and `h . C` summed into two alternating sums (vectors `0, 2, 4..` into the first,
/// `1, 3, 5..` into the second).
///
/// # Safety
/// `b_row` and `c_row` hold `full` floats; `io` is valid for `n < full`.
#[inline(always)]
unsafe fn decode_span<S: Simd, Io: RowIo<S>>(
    io: Io,
    s: S::V,
    b_row: *const f32,
    c_row: *const f32,
    full: usize,
) -> [S::V; 2] {
    let l = S::LANES;
    let mut n = 0;
    unsafe {
        let mut acc = [S::zero(); 2];
        while n + 2 * l <= full {
            let h0 = io.next(n, S::mul(s, S::load_f32(b_row.add(n))));
            io.store(n, h0);
            let h1 = io.next(n + l, S::mul(s, S::load_f32(b_row.add(n + l))));
            io.store(n + l, h1);
            acc[0] = S::fma(h0, S::load_f32(c_row.add(n)), acc[0]);
            acc[1] = S::fma(h1, S::load_f32(c_row.add(n + l)), acc[1]);
            n += 2 * l;
        }
        if n < full {
            let h = io.next(n, S::mul(s, S::load_f32(b_row.add(n))));
            io.store(n, h);
            acc[0] = S::fma(h, S::load_f32(c_row.add(n)), acc[0]);
        }
        acc
    }
}

/// Every row of one head's slot (a decode straight on the slot rows: contiguous, dtype `St`), in
/// memory order: `h = a h + step x[p] B` from row `p` of `src` (zeros without), stored to row `p`
/// of `dst` (when given), and `y[p] = h . C`, summed as the blocked recurrence sums it. `bc`
/// holds B and C of the token, zero-padded to whole vectors; `nd` is `N`.
///
/// The presence of `src` and `dst` is matched once per head, so the row loop carries nothing
/// but the rows, and the rows go one at a time, one sequential stream: measured on Zen 4 (AVX2,
/// 1 thread, Nemotron-H heads), B = 64 from memory 29-31 ms with two rows interleaved and
/// software prefetches 16 rows ahead, 23-24 ms two rows without prefetches, 17 ms one row (an
/// in-place pass over the same bytes: 12-13 ms); B = 1 from L3 0.170, 0.154 and 0.168 ms. On
/// Intel the rows are also asked into L1 a few rows ahead ([`streamed_row_prefetch`]).
///
/// # Safety
/// The slots' pointers are valid for `y.len()` rows of `N` values; the CPU supports `S`.
#[inline(always)]
unsafe fn decode_head<S: Simd, St: SimdElement, Dc: Decays<S>>(
    slots: Slots<St, Dc>,
    step: f32,
    x: &[f32],
    bc: &[f32],
    nd: usize,
    y: &mut [f32],
) {
    unsafe {
        match (slots.src.is_some(), slots.dst.is_some()) {
            (true, true) => decode_rows::<S, St, Dc, true, true>(Known(slots), step, x, bc, nd, y),
            (true, false) => {
                decode_rows::<S, St, Dc, true, false>(Known(slots), step, x, bc, nd, y)
            }
            (false, true) => {
                decode_rows::<S, St, Dc, false, true>(Known(slots), step, x, bc, nd, y)
            }
            (false, false) => {
                decode_rows::<S, St, Dc, false, false>(Known(slots), step, x, bc, nd, y)
            }
        }
    }
}

/// [`decode_head`] for one presence of the old and the new state: per row, the vectors by
/// [`decode_span`], the tail through a zero-padded vector, `y[p] = h . C`.
///
/// # Safety
/// As for [`decode_head`].
#[inline(always)]
unsafe fn decode_rows<
    S: Simd,
    St: SimdElement,
    Dc: Decays<S>,
    const READ: bool,
    const WRITE: bool,
>(
    io: Known<St, Dc, READ, WRITE>,
    step: f32,
    x: &[f32],
    bc: &[f32],
    nd: usize,
    y: &mut [f32],
) {
    let l = S::LANES;
    let np = nd.next_multiple_of(l);
    let full = nd / l * l;
    let (b_row, c_row) = (bc.as_ptr(), bc[np..].as_ptr());
    let (rows, ahead) = (y.len(), streamed_row_prefetch());
    for (p, y) in y.iter_mut().enumerate() {
        let (row, s) = (io.row(p), step * x[p]);
        let slots = row.0;
        if let (true, Some(src), true) = (READ, slots.src, ahead > 0 && p + ahead < rows) {
            prefetch(
                src.wrapping_add(ahead * slots.row_len).cast(),
                nd * size_of::<St>(),
            );
        }
        unsafe {
            let mut acc = decode_span::<S, _>(row, S::splat(s), b_row, c_row, full);
            if full < nd {
                // The tail through a zero-padded vector, as the blocked path's padded row.
                let mut tail = [0f32; 16];
                for n in full..nd {
                    let old = match (READ, slots.src) {
                        (true, Some(src)) => (*src.add(n)).to_f32(),
                        _ => 0.0,
                    };
                    tail[n - full] = old.mul_add(slots.decay.one(0, n), s * bc[n]);
                    if let (true, Some(dst)) = (WRITE, slots.dst) {
                        *dst.add(n) = St::from_f32(tail[n - full]);
                    }
                }
                let k = full / l;
                acc[k & 1] = S::fma(
                    S::load_f32(tail.as_ptr()),
                    S::load_f32(c_row.add(full)),
                    acc[k & 1],
                );
            }
            *y = S::reduce_sum(S::add(acc[0], acc[1]));
        }
    }
}

/// Runs one (sequence, head) through the recurrence.
///
/// # Safety
/// As for [`super::mamba2_scan`]; the CPU supports `S`.
#[inline(always)]
pub unsafe fn sequence_head<S: Simd, St: SimdElement>(args: &Scan, seq: &Sequence, h: usize) {
    let (pd, nd, len, l) = (args.head_dim, args.state_dim, seq.len, S::LANES);
    let np = nd.next_multiple_of(l);
    let g = args.group(h);
    // Per token: the step, the decay (a row of `np` with `A` per state channel), B and C
    // (zero-padded to `np`), x, z and y; one state row.
    let decay_len = if args.a_per_state() { len * np } else { len };
    let z_len = if args.z.is_some() { len * pd } else { 0 };
    let mut buf = TaskBuffer::take(len + decay_len + 2 * len * np + 2 * len * pd + z_len + np);
    // B and C first, where the buffer's 64-byte alignment keeps their rows (`np` floats) whole
    // vectors: after the step and decay they began 8 bytes on, and half of their loads spanned
    // two cache lines (measured on Zen 4, a B = 1 decode from cache: 0.154 -> 0.138 ms).
    let (bc, rest) = buf.split_at_mut(2 * len * np);
    let (step, rest) = rest.split_at_mut(len);
    let (decay, rest) = rest.split_at_mut(decay_len);
    let (x, rest) = rest.split_at_mut(len * pd);
    let (y, rest) = rest.split_at_mut(len * pd);
    let (z, row) = rest.split_at_mut(z_len);
    // A decode on a contiguous state of dtype `St` updates the slot's rows in place: no copy.
    let in_place = len == 1
        && (args.state.as_ref()).is_some_and(|st| st.strides[3] == 1 && st.dtype == St::DTYPE);
    for i in 0..len {
        let t = seq.start + i;
        unsafe {
            step[i] = args.step(t, h);
            let (b_row, c_row) = bc[2 * i * np..2 * (i + 1) * np].split_at_mut(np);
            load_row_simd::<S>(
                args.b.at(&[t, g]),
                args.b.dtype,
                args.b.strides[2],
                &mut b_row[..nd],
            );
            load_row_simd::<S>(
                args.c.at(&[t, g]),
                args.c.dtype,
                args.c.strides[2],
                &mut c_row[..nd],
            );
            let x_row = &mut x[i * pd..(i + 1) * pd];
            load_row_simd::<S>(args.x.at(&[t, h]), args.x.dtype, args.x.strides[2], x_row);
            if let Some(zt) = &args.z {
                load_row_simd::<S>(
                    zt.at(&[t, h]),
                    zt.dtype,
                    zt.strides[2],
                    &mut z[i * pd..(i + 1) * pd],
                );
            }
        }
    }
    unsafe {
        if args.a_per_state() {
            // `exp(d A[h][n])` per token; `A` zero-padded, so the padding decays by 1.
            let a_row = &mut row[..np];
            args.a_row(h, &mut a_row[..nd]);
            for i in 0..len {
                for n in (0..np).step_by(l) {
                    let e = S::mul(S::splat(step[i]), S::load_f32(a_row.as_ptr().add(n)));
                    S::store_f32(decay.as_mut_ptr().add(i * np + n), S::exp(e));
                }
            }
            match in_place {
                true => decode_in_place::<S, St, _>(
                    args,
                    seq,
                    h,
                    PerState(decay, np),
                    step[0],
                    bc,
                    x,
                    y,
                ),
                false => rows::<S, St, _>(args, seq, h, PerState(decay, np), step, bc, x, y, row),
            }
        } else {
            for i in 0..len {
                decay[i] = clamped_exp(step[i] * args.a[h]);
            }
            match in_place {
                true => {
                    decode_in_place::<S, St, _>(args, seq, h, Factor(decay[0]), step[0], bc, x, y)
                }
                false => rows::<S, St, _>(args, seq, h, PerHead(decay), step, bc, x, y, row),
            }
        }
    }
    let out = &args.out;
    for i in 0..len {
        let rows = i * pd..(i + 1) * pd;
        let zi = args.z.as_ref().map(|_| &z[rows.clone()]);
        unsafe {
            finish_row::<S>(&mut y[rows.clone()], &x[rows.clone()], zi, args.d[h]);
            store_row_simd::<S>(
                out.at(&[seq.start + i, h]),
                out.dtype,
                out.strides[2],
                &y[rows],
            );
        }
    }
}

/// The state rows of one (sequence, head) through every token: `y[i][p] = h_i[p] . C_i` before
/// the skip term and the gate. Per token `i`: `step[i]`, B and C in `bc` (rows of `np`), `x[i]`
/// (rows of `P`); `row` is one zero-padded state row of scratch.
///
/// # Safety
/// As for [`sequence_head`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<S: Simd, St: SimdElement, Dc: Decays<S>>(
    args: &Scan,
    seq: &Sequence,
    h: usize,
    decay: Dc,
    step: &[f32],
    bc: &[f32],
    x: &[f32],
    y: &mut [f32],
    row: &mut [f32],
) {
    let (pd, nd, len, l) = (args.head_dim, args.state_dim, seq.len, S::LANES);
    let np = nd.next_multiple_of(l);
    let st = args.state.as_ref();
    for p in 0..pd {
        if let (Some(st), Some(slot)) = (st, seq.read) {
            if st.strides[3] == 1 && p + PREFETCH_ROWS < pd {
                prefetch(
                    st.at(&[slot, h, p + PREFETCH_ROWS, 0]),
                    nd * st.dtype.size(),
                );
            }
            unsafe { load_state_row::<S, St>(args, slot, h, p, row) };
        } else {
            row.iter_mut().for_each(|x| *x = 0.0);
        }
        for i in 0..len {
            unsafe {
                let s = S::splat(step[i] * x[i * pd + p]);
                let (b_row, c_row) = (
                    bc.as_ptr().add(2 * i * np),
                    bc.as_ptr().add((2 * i + 1) * np),
                );
                // Two sums hide the FMA latency; a fixed order keeps results deterministic.
                let mut acc = [S::zero(); 2];
                for (k, n) in (0..np).step_by(l).enumerate() {
                    let r = row.as_mut_ptr().add(n);
                    let upd = S::mul(s, S::load_f32(b_row.add(n)));
                    let hv = S::fma(S::load_f32(r), decay.at(i, n), upd);
                    S::store_f32(r, hv);
                    acc[k & 1] = S::fma(hv, S::load_f32(c_row.add(n)), acc[k & 1]);
                }
                y[i * pd + p] = S::reduce_sum(S::add(acc[0], acc[1]));
                if let StateWrite::PerToken(slots) = &seq.write
                    && let Some(slot) = slots[i]
                {
                    store_state_row::<S, St>(args, slot, h, p, row);
                }
                for cp in seq.checkpoints_after(i + 1) {
                    store_state_row::<S, St>(args, cp.slot, h, p, row);
                }
            }
        }
        if let StateWrite::Final(slot) = seq.write {
            unsafe { store_state_row::<S, St>(args, slot, h, p, row) };
        }
    }
}

/// A one-token sequence's head updated in place on its slot (see [`rows`]) by [`decode_head`].
///
/// # Safety
/// As for [`rows`]; the state is contiguous in `n` and of dtype `St`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn decode_in_place<S: Simd, St: SimdElement, Dc: Decays<S>>(
    args: &Scan,
    seq: &Sequence,
    h: usize,
    decay: Dc,
    step: f32,
    bc: &[f32],
    x: &[f32],
    y: &mut [f32],
) {
    let (pd, nd) = (args.head_dim, args.state_dim);
    let st = args
        .state
        .as_ref()
        .expect("a decode in place without a state tensor");
    let write = match &seq.write {
        StateWrite::Final(slot) => Some(*slot),
        StateWrite::PerToken(slots) => slots[0],
        StateWrite::Nothing => None,
    };
    let row = |slot: usize, head: usize| st.at(&[slot, head, 0, 0]).cast::<St>();
    let (src, dst) = (
        seq.read.map(|slot| row(slot, h)),
        write.map(|slot| row(slot, h)),
    );
    let row_len = st.strides[2];
    let slots = Slots {
        src: src.map(|src| src.cast_const()),
        dst,
        row_len,
        decay,
    };
    unsafe {
        decode_head::<S, St, Dc>(slots, step, x, bc, args.state_dim, &mut y[..pd]);
        // A checkpoint of a decode is its final state: the rows as just stored.
        if let Some(slot) = write {
            for cp in &seq.checkpoints {
                for p in 0..pd {
                    let at = p * row_len;
                    std::ptr::copy_nonoverlapping(
                        row(slot, h).add(at),
                        row(cp.slot, h).add(at),
                        nd,
                    );
                }
            }
        }
    }
}

/// Zero output rows of a padded sequence for one head.
///
/// # Safety
/// As for [`super::mamba2_scan`].
pub unsafe fn zero_rows(args: &Scan, seq: &Sequence, h: usize) {
    let out = &args.out;
    for t in seq.start..seq.start + seq.len {
        for p in 0..args.head_dim {
            unsafe { write_f32(out.at(&[t, h, p]), out.dtype, 0.0) };
        }
    }
}

/// A checkpoint of a chunked sequence (ABI.md §4.10): the state of head `h` after the `len`
/// tokens from packed token `start`, run through the recurrence from `state_t` (`hT [N][P]` in
/// f32, a chunk's start), stored to `slot` rounded to the state dtype. `state_t` is not changed.
///
/// # Safety
/// As for [`sequence_head`]; `slot` is this task's alone.
#[inline(always)]
pub unsafe fn checkpoint_from<S: Simd, St: SimdElement>(
    args: &Scan,
    h: usize,
    state_t: &[f32],
    start: usize,
    len: usize,
    slot: usize,
) {
    let (pd, nd, l) = (args.head_dim, args.state_dim, S::LANES);
    let np = nd.next_multiple_of(l);
    let g = args.group(h);
    // The state as rows `p` of `np` (zero-padded), then one token's B, decays and x.
    let mut buf = TaskBuffer::take(pd * np + 2 * np + pd);
    let (rows, rest) = buf.split_at_mut(pd * np);
    let (b_row, rest) = rest.split_at_mut(np);
    let (decay, x) = rest.split_at_mut(np);
    unsafe { transpose(state_t.as_ptr(), pd, rows.as_mut_ptr(), np, nd, pd) };
    for t in start..start + len {
        unsafe {
            let step = args.step(t, h);
            for (n, e) in decay[..nd].iter_mut().enumerate() {
                *e = clamped_exp(step * args.a_at(h, n));
            }
            load_row_simd::<S>(
                args.b.at(&[t, g]),
                args.b.dtype,
                args.b.strides[2],
                &mut b_row[..nd],
            );
            load_row_simd::<S>(args.x.at(&[t, h]), args.x.dtype, args.x.strides[2], x);
            for (p, row) in rows.chunks_exact_mut(np).enumerate() {
                let sx = S::splat(step * x[p]);
                for n in (0..np).step_by(l) {
                    let r = row.as_mut_ptr().add(n);
                    let upd = S::mul(sx, S::load_f32(b_row.as_ptr().add(n)));
                    let a = S::load_f32(decay.as_ptr().add(n));
                    S::store_f32(r, S::fma(S::load_f32(r), a, upd));
                }
            }
        }
    }
    for (p, row) in rows.chunks_exact(np).enumerate() {
        unsafe { store_state_row::<S, St>(args, slot, h, p, row) };
    }
}
