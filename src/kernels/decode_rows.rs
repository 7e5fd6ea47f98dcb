//! One-token state updates straight on a slot's rows, shared by the delta rules (Gated DeltaNet,
//! KDA and RWKV-7's DPLR rule): a decode reads each state element once from memory and writes it
//! once, with no copy of the state.
//!
//! Every one of these rules updates a `K x V` state row by row as
//! `S[r] = d_r S[r] + k[r] c + k2[r] c2` (`d` a decay per row, `c`, `c2` V-vectors, the second
//! term optional) and reads `o = S^T q` from the new rows, where `c` or `c2` depends on a
//! column sum of the old state (`S^T x`). On a v-contiguous state that is two passes over the
//! rows ([`StateRows`]); on a k-contiguous one (ggml's transposed `[v][k]` heads) each stored
//! row is one column of `S`, whose sum, update and output need that row alone
//! ([`StateColumns`]): one pass.
//!
//! Both are tuned for a state streamed from memory, as a model's decode reads it (the other
//! layers' states evict a layer's between two tokens), not for one left in cache by the last
//! call.

use std::ops::Range;

use crate::kernels::Sequence;
use crate::kernels::simd::{Simd, SimdElement};
use crate::kernels::strided::{prefetch, prefetch_line};

/// State rows ahead that a decode's first pass prefetches (4 KiB of f32 rows of 128).
pub(crate) const DECODE_PREFETCH_ROWS: usize = 8;

/// State rows ahead that a decode streaming one row at a time (the k-contiguous pipeline,
/// Mamba-2's rows) asks into L1: [`DECODE_PREFETCH_ROWS`] on Intel, where the hardware
/// prefetchers stop at every page boundary (measured on a Xeon, B = 64: GDN and KDA `[v][k]`
/// 0.81x -> 0.89-0.92x of the in-place bound on one thread, 0.88x -> 0.99-1.1x on two; Mamba-2
/// 30-31 -> 26.5-28 ms and 16.3-16.5 -> 13.7-14.9 ms; distances 4 to 16 alike), none elsewhere
/// (on Zen 4 every distance measured slowed Mamba-2's one-row stream, 17 ms without).
pub(crate) fn streamed_row_prefetch() -> usize {
    match crate::runtime::cpu_vendor() {
        crate::runtime::Vendor::Intel => DECODE_PREFETCH_ROWS,
        _ => 0,
    }
}

/// Rows a v-contiguous decode's first pass reads whole before the next ones (4 KiB of f32
/// rows of 128, in L1 while every column block of them is summed).
const DECODE_ROW_GROUP: usize = 8;

/// `$self.$method::<S, READ, WRITE>(args)` with the presence of the old and the new state made
/// compile-time constants (matching the `Option`s per vector kept the loop's values on the
/// stack). The second rank-1 term's presence is the terms type's [`ColumnTerms::TWO_TERMS`].
macro_rules! with_known_presence {
    ($self:ident.$method:ident::<$s:ident>($($arg:expr),*)) => {
        match ($self.read.is_some(), $self.write.is_some()) {
            (true, true) => $self.$method::<$s, true, true, _>($($arg),*),
            (true, false) => $self.$method::<$s, true, false, _>($($arg),*),
            (false, true) => $self.$method::<$s, false, true, _>($($arg),*),
            (false, false) => $self.$method::<$s, false, false, _>($($arg),*),
        }
    };
}

/// A checkpoint of a decode is its final state: copies the `rows` rows of `row_len` values just
/// stored to slot `written` (`row(slot, i)`: row `i` of a slot) to every checkpoint slot of `seq`,
/// bit for bit.
///
/// # Safety
/// `row` addresses `row_len` valid values for every slot and row; the slots do not overlap.
pub(crate) unsafe fn copy_to_checkpoints<St>(
    seq: &Sequence,
    written: Option<usize>,
    rows: usize,
    row_len: usize,
    row: impl Fn(usize, usize) -> *mut St,
) {
    let Some(slot) = written else {
        return;
    };
    for cp in &seq.checkpoints {
        for i in 0..rows {
            unsafe { std::ptr::copy_nonoverlapping(row(slot, i), row(cp.slot, i), row_len) };
        }
    }
}

/// The coefficients `(c, c2)` of the rank-1 terms of column `j`, from its column sum (a trait
/// with an inlined method rather than a closure: closures do not inherit the caller's target
/// features, so a closure here was a call per row that spilled every vector register).
pub(crate) trait ColumnTerms {
    /// Whether the rule has the second rank-1 term (`c2`, with the row factors `k2`): a constant
    /// of the rule, so each decode is compiled for the one case it runs.
    const TWO_TERMS: bool;
    fn terms(&self, j: usize, column_sum: f32) -> (f32, f32);
}

/// The decode of a k-contiguous (`[v][k]`) state: every column of `S` is a stored row `S[j]`,
/// read, updated and written in one pass.
pub(crate) struct StateColumns<'a, St> {
    /// Row 0 of the old and the new state; row `j` is `j * row_stride` elements on. Without
    /// `read` the old state is zero.
    pub read: Option<*const St>,
    pub write: Option<*mut St>,
    pub row_stride: usize,
    /// The vector the old row is dotted with (`x` of the column sum `x . S[j]`).
    pub dot: &'a [f32],
    /// The decays: one for every element, or one per element (`true`).
    pub decays: (&'a [f32], bool),
    pub k: &'a [f32],
    /// The optional second rank-1 term's row factors.
    pub k2: Option<&'a [f32]>,
    pub q: &'a [f32],
}

impl<St: SimdElement> StateColumns<'_, St> {
    /// Updates every column and stores `o` (`o.len()` columns).
    ///
    /// # Safety
    /// The pointers are valid for `V` rows of `K` values; the CPU supports `S`.
    #[inline(always)]
    pub(crate) unsafe fn run<S: Simd, T: ColumnTerms>(&self, terms: &T, o: &mut [f32]) {
        assert_eq!(
            self.k2.is_some(),
            T::TWO_TERMS,
            "the second term's row factors"
        );
        unsafe { with_known_presence!(self.pipeline::<S>(terms, o)) }
    }

    /// The stored rows in memory order, software-pipelined: one sweep updates row `j` (in L1,
    /// its sum known) while it sums row `j + 1` (streamed from memory). Memory sees one
    /// sequential stream, which the hardware prefetchers follow (measured on Zen 4, a B = 64
    /// GDN decode: four rows interleaved with software prefetch ran at 15.2 ms, one row at a
    /// time without it at 11.0), and each sweep has two independent pairs of sums in flight
    /// where one row alone is a chain of dependent FMAs (one row at a time from L3 ran 1.45x
    /// slower than four interleaved). On Intel rows are also asked into L1 a few rows ahead
    /// ([`streamed_row_prefetch`]).
    ///
    /// Row `j`: `s = dot . S[j]` (the old row; 0 without `READ`), `(c, c2) = terms.terms(j, s)`,
    /// `S[j] = d S[j] + k c + k2 c2` (stored with `WRITE`) and `o_j = S[j] . q`. Each sum has
    /// two accumulators (even and odd vectors) and then the scalar tail, in a fixed order.
    #[inline(always)]
    unsafe fn pipeline<S: Simd, const READ: bool, const WRITE: bool, T: ColumnTerms>(
        &self,
        terms: &T,
        o: &mut [f32],
    ) {
        let vd = o.len();
        let src = |j: usize| {
            self.read
                .unwrap_or(std::ptr::null())
                .wrapping_add(j * self.row_stride)
        };
        let dst = |j: usize| {
            self.write
                .unwrap_or(std::ptr::null_mut())
                .wrapping_add(j * self.row_stride)
        };
        unsafe {
            let mut sum = match (READ, vd) {
                (true, 1..) => {
                    let first = (src(0), src(0), dst(0));
                    self.sweep::<S, false, true, READ, false, T>(first, (0.0, 0.0))
                        .1
                }
                _ => 0.0,
            };
            let (row_bytes, ahead) = (self.k.len() * size_of::<St>(), streamed_row_prefetch());
            for j in 0..vd {
                if READ && ahead > 0 && j + ahead < vd {
                    prefetch(src(j + ahead).cast(), row_bytes);
                }
                let coefs = terms.terms(j, sum);
                (o[j], sum) = match READ && j + 1 < vd {
                    true => self.sweep::<S, true, true, READ, WRITE, T>(
                        (src(j), src(j + 1), dst(j)),
                        coefs,
                    ),
                    false => self
                        .sweep::<S, true, false, READ, WRITE, T>((src(j), src(j), dst(j)), coefs),
                };
            }
        }
    }

    /// One sweep along `K`: with `UPDATE`, row `src` updated with `coefs` into `dst` (the old
    /// row read with `READ`, the new one stored with `WRITE`) and its output `S[j] . q`; with
    /// `SUM`, the sum `dot . next` of the next row. Returns `(output, sum)` (0 for a part not
    /// run).
    ///
    /// # Safety
    /// As for [`StateColumns::run`]; the rows the flags use are valid for `K` values.
    #[inline(always)]
    unsafe fn sweep<
        S: Simd,
        const UPDATE: bool,
        const SUM: bool,
        const READ: bool,
        const WRITE: bool,
        T: ColumnTerms,
    >(
        &self,
        rows: (*const St, *const St, *mut St),
        (c, c2): (f32, f32),
    ) -> (f32, f32) {
        let (src, next, dst) = rows;
        let (l, kd) = (S::LANES, self.k.len());
        let body = kd / l * l;
        let (decays, per_channel) = self.decays;
        let k2 = self.k2.unwrap_or(&[]);
        unsafe {
            let coefs = (S::splat(c), S::splat(c2));
            // Even vectors into the first accumulator of each sum, odd ones into the second.
            let (mut out, mut sum) = ([S::zero(); 2], [S::zero(); 2]);
            let mut r = 0;
            while r + 2 * l <= body {
                self.step::<S, UPDATE, SUM, READ, WRITE, T>(
                    rows,
                    r,
                    coefs,
                    &mut out[0],
                    &mut sum[0],
                );
                self.step::<S, UPDATE, SUM, READ, WRITE, T>(
                    rows,
                    r + l,
                    coefs,
                    &mut out[1],
                    &mut sum[1],
                );
                r += 2 * l;
            }
            if r < body {
                self.step::<S, UPDATE, SUM, READ, WRITE, T>(
                    rows,
                    r,
                    coefs,
                    &mut out[0],
                    &mut sum[0],
                );
            }
            let mut o = S::reduce_sum(S::add(out[0], out[1]));
            let mut s = S::reduce_sum(S::add(sum[0], sum[1]));
            for r in body..kd {
                if SUM {
                    s = (*next.add(r)).to_f32().mul_add(self.dot[r], s);
                }
                if UPDATE {
                    let old = if READ { (*src.add(r)).to_f32() } else { 0.0 };
                    let mut upd = self.k[r] * c;
                    if T::TWO_TERMS {
                        upd = k2[r].mul_add(c2, upd);
                    }
                    let s_new = old.mul_add(decays[if per_channel { r } else { 0 }], upd);
                    if WRITE {
                        *dst.add(r) = St::from_f32(s_new);
                    }
                    o = s_new.mul_add(self.q[r], o);
                }
            }
            (o, s)
        }
    }

    /// One vector of [`StateColumns::sweep`] at `r`: `out += q S_new[r..]` and
    /// `sum += dot[r..] next[r..]`.
    #[inline(always)]
    unsafe fn step<
        S: Simd,
        const UPDATE: bool,
        const SUM: bool,
        const READ: bool,
        const WRITE: bool,
        T: ColumnTerms,
    >(
        &self,
        (src, next, dst): (*const St, *const St, *mut St),
        r: usize,
        (c, c2): (S::V, S::V),
        out: &mut S::V,
        sum: &mut S::V,
    ) {
        let (decays, per_channel) = self.decays;
        unsafe {
            if SUM {
                let x = S::load_f32(self.dot.as_ptr().add(r));
                *sum = S::fma(St::load::<S>(next.add(r)), x, *sum);
            }
            if UPDATE {
                let mut upd = S::mul(S::load_f32(self.k.as_ptr().add(r)), c);
                if let (true, Some(k2)) = (T::TWO_TERMS, self.k2) {
                    upd = S::fma(S::load_f32(k2.as_ptr().add(r)), c2, upd);
                }
                let s_new = match READ {
                    true => {
                        let a = match per_channel {
                            true => S::load_f32(decays.as_ptr().add(r)),
                            false => S::splat(decays[0]),
                        };
                        S::fma(St::load::<S>(src.add(r)), a, upd)
                    }
                    false => upd,
                };
                if WRITE {
                    St::store::<S>(dst.add(r), s_new);
                }
                *out = S::fma(s_new, S::load_f32(self.q.as_ptr().add(r)), *out);
            }
        }
    }
}

/// Vectors of columns a decode pass keeps in registers (accumulators and, in pass 2, `c`):
/// half the register file (8 with AVX-512, 4 with AVX2). Summed in registers rather than in a
/// row of memory, each row's update no longer waits for the previous row's store to forward
/// (measured: a 1-sequence GDN decode from cache went from 125 to 57-63 us).
fn column_vectors<S: Simd>() -> usize {
    if S::MANY_VECTORS { 8 } else { 4 }
}

/// The decode of a v-contiguous (`[k][v]`) state, on the rows of one slot and head in place:
/// row `r` becomes `d_r S[r] + k[r] c + k2[r] c2` and `o += q[r] S[r]`, where `(c, c2)` of
/// column `j` come from its column sum `sum_r S[r][j] x[r]` of the old rows.
///
/// Pass 1 reads the rows in order (one sequential stream from memory) for every column sum;
/// pass 2 then updates the rows from L2 in tiles of all rows by one register block of columns
/// (columns evolve independently), each tile's outputs summed in registers. Memory would idle
/// during pass 2, so both passes also read the next task's state into L2 ([`Ahead`]): measured
/// on Zen 3, a B = 64 GDN decode went from 17.7 to 13.0 ms (the same passes without it: 18 ms).
/// Both sums run in row order per column, as the blocked paths sum.
pub(crate) struct StateRows<'a, St> {
    /// Row 0 of the old and the new state; row `r` is `r * row_stride` elements on. Without
    /// `read` the old state is zero.
    pub read: Option<*const St>,
    pub write: Option<*mut St>,
    pub row_stride: usize,
    /// The factors of the column sums, one per row.
    pub x: &'a [f32],
    /// The decays: one for every row, or one per row (`true`).
    pub decays: (&'a [f32], bool),
    pub k: &'a [f32],
    /// The optional second rank-1 term's row factors.
    pub k2: Option<&'a [f32]>,
    pub q: &'a [f32],
    /// Row 0 of the state the next task reads (the next head of the slot; same row stride),
    /// read into L2 a little at every row of both passes, so memory streams while this head
    /// is summed and updated from cache.
    pub next: Option<*const St>,
}

/// Prefetches the rows of the next task's state into L2 over a fixed number of ticks, evenly
/// (a burst of prefetches stalls on the cache's miss buffers).
struct Ahead<St> {
    /// The next line to request: in row `row`, `line` lines on.
    row: *const St,
    line: usize,
    row_stride: usize,
    row_lines: usize,
    /// Lines not yet requested.
    left: usize,
    /// Lines per tick as `lines / ticks`: `carry` accumulates `lines` per tick and pays
    /// `ticks` per line.
    lines: usize,
    ticks: usize,
    carry: usize,
}

impl<St> Ahead<St> {
    fn new(
        row0: Option<*const St>,
        row_stride: usize,
        rows: usize,
        row_bytes: usize,
        ticks: usize,
    ) -> Self {
        let row_lines = row_bytes.div_ceil(64);
        let lines = if row0.is_some() { rows * row_lines } else { 0 };
        Ahead {
            row: row0.unwrap_or(std::ptr::null()),
            line: 0,
            row_stride,
            row_lines,
            left: lines,
            lines,
            ticks: ticks.max(1),
            carry: 0,
        }
    }

    #[inline(always)]
    fn tick(&mut self) {
        self.carry += self.lines;
        while self.carry >= self.ticks && self.left > 0 {
            prefetch_line::<true>(self.row.cast::<u8>().wrapping_add(self.line * 64));
            self.line += 1;
            if self.line == self.row_lines {
                (self.line, self.row) = (0, self.row.wrapping_add(self.row_stride));
            }
            self.left -= 1;
            self.carry -= self.ticks;
        }
    }
}

impl<St: SimdElement> StateRows<'_, St> {
    /// Updates every row and stores `o` (`o.len()` columns).
    ///
    /// # Safety
    /// The pointers are valid for `K` rows of `V` values; the CPU supports `S`.
    #[inline(always)]
    pub(crate) unsafe fn run<S: Simd, T: ColumnTerms>(&self, terms: &T, o: &mut [f32]) {
        assert_eq!(
            self.k2.is_some(),
            T::TWO_TERMS,
            "the second term's row factors"
        );
        unsafe { with_known_presence!(self.tiles::<S>(terms, o)) }
    }

    #[inline(always)]
    unsafe fn tiles<S: Simd, const READ: bool, const WRITE: bool, T: ColumnTerms>(
        &self,
        terms: &T,
        o: &mut [f32],
    ) {
        let (l, vd, rows) = (S::LANES, o.len(), self.k.len());
        let vectors = vd / l;
        let tiles = vectors.div_ceil(column_vectors::<S>());
        let row_bytes = vd * size_of::<St>();
        let ahead = &mut Ahead::new(
            self.next,
            self.row_stride,
            rows,
            row_bytes,
            rows * (1 + tiles),
        );
        unsafe {
            // Pass 1 leaves the column sums in `o`, which each tile then replaces by its outputs.
            match READ {
                true => self.column_sums::<S>(o, ahead),
                false => o.fill(0.0),
            }
            let mut first = 0;
            while first < vectors {
                let col = first * l;
                first += match (vectors - first).min(column_vectors::<S>()) {
                    8 if S::MANY_VECTORS => self.tile::<S, 8, READ, WRITE, T>(col, terms, o, ahead),
                    4..=7 => self.tile::<S, 4, READ, WRITE, T>(col, terms, o, ahead),
                    3 => self.tile::<S, 3, READ, WRITE, T>(col, terms, o, ahead),
                    2 => self.tile::<S, 2, READ, WRITE, T>(col, terms, o, ahead),
                    _ => self.tile::<S, 1, READ, WRITE, T>(col, terms, o, ahead),
                };
            }
            let (decays, per_row) = self.decays;
            let (src, dst) = (self.read, self.write);
            for j in vectors * l..vd {
                let (c, c2) = terms.terms(j, o[j]);
                let mut oj = 0f32;
                for (r, (&kr, &qr)) in self.k.iter().zip(self.q).enumerate() {
                    let at = r * self.row_stride + j;
                    let old = match (READ, src) {
                        (true, Some(src)) => (*src.add(at)).to_f32(),
                        _ => 0.0,
                    };
                    let mut upd = kr * c;
                    if let (true, Some(k2)) = (T::TWO_TERMS, self.k2) {
                        upd = k2[r].mul_add(c2, upd);
                    }
                    let s_new = old.mul_add(decays[if per_row { r } else { 0 }], upd);
                    if let (true, Some(dst)) = (WRITE, dst) {
                        *dst.add(at) = St::from_f32(s_new);
                    }
                    oj = s_new.mul_add(qr, oj);
                }
                o[j] = oj;
            }
        }
    }

    /// Pass 1: `sums[j] = sum_r S[r][j] x[r]`, in row order per column. The rows go in groups
    /// of [`DECODE_ROW_GROUP`], each read whole (every column block in registers, resumed from
    /// `sums`) before the next: memory sees one sequential stream, where a sweep per column
    /// block walked it at a stride (measured: a B = 64 decode read its state 1.4x slower so).
    /// Rows are prefetched [`DECODE_PREFETCH_ROWS`] ahead: the hardware prefetchers stop at
    /// page boundaries.
    ///
    /// # Safety
    /// `read` is valid for `x.len()` rows of `sums.len()` values; the CPU supports `S`.
    #[inline(always)]
    unsafe fn column_sums<S: Simd>(&self, sums: &mut [f32], ahead: &mut Ahead<St>) {
        let Some(src) = self.read else {
            return;
        };
        let (l, vd, rows) = (S::LANES, sums.len(), self.x.len());
        let vectors = vd / l;
        let row_bytes = vd * size_of::<St>();
        sums.fill(0.0);
        unsafe {
            for group in (0..rows).step_by(DECODE_ROW_GROUP) {
                let end = rows.min(group + DECODE_ROW_GROUP);
                for r in group + DECODE_PREFETCH_ROWS..rows.min(end + DECODE_PREFETCH_ROWS) {
                    prefetch(src.add(r * self.row_stride).cast(), row_bytes);
                }
                let mut first = 0;
                while first < vectors {
                    let (col, out) = (first * l, sums.as_mut_ptr().add(first * l));
                    first += match (vectors - first).min(column_vectors::<S>()) {
                        8 if S::MANY_VECTORS => self.sum_block::<S, 8>(src, col, group..end, out),
                        4..=7 => self.sum_block::<S, 4>(src, col, group..end, out),
                        3 => self.sum_block::<S, 3>(src, col, group..end, out),
                        2 => self.sum_block::<S, 2>(src, col, group..end, out),
                        _ => self.sum_block::<S, 1>(src, col, group..end, out),
                    };
                }
                for r in group..end {
                    ahead.tick();
                    let (row, xr) = (src.add(r * self.row_stride), self.x[r]);
                    for j in vectors * l..vd {
                        sums[j] = (*row.add(j)).to_f32().mul_add(xr, sums[j]);
                    }
                }
            }
        }
    }

    /// Adds rows `rows` of the `N` vectors of columns from `col` to `out`.
    #[inline(always)]
    unsafe fn sum_block<S: Simd, const N: usize>(
        &self,
        src: *const St,
        col: usize,
        rows: Range<usize>,
        out: *mut f32,
    ) -> usize {
        let l = S::LANES;
        unsafe {
            let mut acc = [S::zero(); N];
            for (u, a) in acc.iter_mut().enumerate() {
                *a = S::load_f32(out.add(u * l));
            }
            for r in rows {
                let row = src.add(r * self.row_stride + col);
                let xv = S::splat(*self.x.get_unchecked(r));
                for (u, a) in acc.iter_mut().enumerate() {
                    *a = S::fma(St::load::<S>(row.add(u * l)), xv, *a);
                }
            }
            for (u, a) in acc.iter().enumerate() {
                S::store_f32(out.add(u * l), *a);
            }
        }
        N
    }

    /// Pass 2 on the tile of the `N` vectors of columns from `col`: their terms from the column
    /// sums in `o[col..]`, the update of the tile's rows and its outputs, stored over the sums.
    #[inline(always)]
    unsafe fn tile<S: Simd, const N: usize, const READ: bool, const WRITE: bool, T: ColumnTerms>(
        &self,
        col: usize,
        terms: &T,
        o: &mut [f32],
        ahead: &mut Ahead<St>,
    ) -> usize {
        let l = S::LANES;
        let (decays, per_row) = self.decays;
        let src0 = self.read.unwrap_or(std::ptr::null()).wrapping_add(col);
        let dst0 = self.write.unwrap_or(std::ptr::null_mut()).wrapping_add(col);
        let k2: &[f32] = self.k2.unwrap_or(&[]);
        unsafe {
            let mut coefs = [0f32; 32];
            let mut c = [S::zero(); N];
            let mut c2 = [S::zero(); N];
            for u in 0..N {
                for i in 0..l {
                    let j = col + u * l + i;
                    let (cj, c2j) = terms.terms(j, o[j]);
                    (coefs[i], coefs[l + i]) = (cj, c2j);
                }
                c[u] = S::load_f32(coefs.as_ptr());
                c2[u] = S::load_f32(coefs.as_ptr().add(l));
            }
            let mut acc = [S::zero(); N];
            for (r, (&kr, &qr)) in self.k.iter().zip(self.q).enumerate() {
                ahead.tick();
                let offset = r * self.row_stride;
                let a = S::splat(decays[if per_row { r } else { 0 }]);
                let (kv, qv) = (S::splat(kr), S::splat(qr));
                let k2v = if T::TWO_TERMS {
                    S::splat(*k2.as_ptr().add(r))
                } else {
                    S::zero()
                };
                let (src, dst) = (src0.wrapping_add(offset), dst0.wrapping_add(offset));
                for u in 0..N {
                    let mut upd = S::mul(kv, c[u]);
                    if T::TWO_TERMS {
                        upd = S::fma(k2v, c2[u], upd);
                    }
                    let s_new = match READ {
                        true => S::fma(St::load::<S>(src.add(u * l)), a, upd),
                        false => upd,
                    };
                    if WRITE {
                        St::store::<S>(dst.add(u * l), s_new);
                    }
                    acc[u] = S::fma(s_new, qv, acc[u]);
                }
            }
            for (u, a) in acc.iter().enumerate() {
                S::store_f32(o.as_mut_ptr().add(col + u * l), *a);
            }
        }
        N
    }
}
