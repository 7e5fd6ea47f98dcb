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
use crate::kernels::simd::{Simd, SimdElement, array_of};
use crate::kernels::strided::{prefetch, prefetch_line};

/// State rows ahead that a decode's first pass prefetches (4 KiB of f32 rows of 128).
pub(crate) const DECODE_PREFETCH_ROWS: usize = 8;

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
    /// Updates every column and stores `o` (`o.len()` columns), [`interleaved_columns`] at a
    /// time; each row is prefetched [`DECODE_PREFETCH_ROWS`] ahead.
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
        unsafe { with_known_presence!(self.groups::<S>(terms, o)) }
    }

    #[inline(always)]
    unsafe fn groups<S: Simd, const READ: bool, const WRITE: bool, T: ColumnTerms>(
        &self,
        terms: &T,
        o: &mut [f32],
    ) {
        let vd = o.len();
        let mut j = 0;
        unsafe {
            while j < vd {
                // Four stored rows at a time: eight independent sums in flight, where one row's
                // two are a chain of dependent FMAs (measured on Zen 3, AVX2, a B = 1 `[v][k]`
                // GDN decode from L3: 155 us one row at a time, 123 us two, 108 us four). With a
                // second rank-1 term and 16 vector registers, two: the coefficients of four spill.
                j += match (vd - j).min(4) {
                    4 if T::TWO_TERMS => match S::MANY_VECTORS {
                        true => self.update::<S, 4, READ, WRITE, T>(j, terms, o),
                        false => self.update::<S, 2, READ, WRITE, T>(j, terms, o),
                    },
                    4 => self.update::<S, 4, READ, WRITE, T>(j, terms, o),
                    2 | 3 => self.update::<S, 2, READ, WRITE, T>(j, terms, o),
                    _ => self.update::<S, 1, READ, WRITE, T>(j, terms, o),
                };
            }
        }
    }

    /// Columns `j..j + R` of the state, interleaved (one stored row alone is a chain of
    /// dependent sums: measured, a `[v][k]` GDN decode from cache ran at half the FMA rate).
    /// For each, `s = dot . S[j]` (the old row; 0 without `READ`), `(c, c2) = terms.terms(j, s)`,
    /// `S[j] = d S[j] + k c + k2 c2` (stored with `WRITE`) and `o_j = S[j] . q`. Each sum has two
    /// accumulators (even and odd vectors) in a fixed order, whatever `R` is. Returns `R`.
    ///
    /// # Safety
    /// As for [`StateColumns::run`]; `j + R <= o.len()`.
    #[inline(always)]
    unsafe fn update<
        S: Simd,
        const R: usize,
        const READ: bool,
        const WRITE: bool,
        T: ColumnTerms,
    >(
        &self,
        j: usize,
        terms: &T,
        o: &mut [f32],
    ) -> usize {
        let (l, kd, vd) = (S::LANES, self.k.len(), o.len());
        let body = kd / l * l;
        let (decays, per_channel) = self.decays;
        let k2 = self.k2.unwrap_or(&[]);
        let row = |i: usize| (j + i) * self.row_stride;
        let src: [*const St; R] =
            array_of(|i| self.read.unwrap_or(std::ptr::null()).wrapping_add(row(i)));
        let dst: [*mut St; R] = array_of(|i| {
            self.write
                .unwrap_or(std::ptr::null_mut())
                .wrapping_add(row(i))
        });
        unsafe {
            if let Some(read) = self.read {
                let row_bytes = kd * size_of::<St>();
                for i in 0..R {
                    if j + i + DECODE_PREFETCH_ROWS < vd {
                        let ahead =
                            read.wrapping_add((j + i + DECODE_PREFETCH_ROWS) * self.row_stride);
                        prefetch(ahead.cast(), row_bytes);
                    }
                }
            }
            let mut sums = [0f32; R];
            if READ {
                // Even vectors into one accumulator, odd ones into the other.
                let (mut acc0, mut acc1) = ([S::zero(); R], [S::zero(); R]);
                let mut r = 0;
                while r + 2 * l <= body {
                    let (d0, d1) = (self.dot_at::<S>(r), self.dot_at::<S>(r + l));
                    for i in 0..R {
                        acc0[i] = S::fma(St::load::<S>(src[i].add(r)), d0, acc0[i]);
                        acc1[i] = S::fma(St::load::<S>(src[i].add(r + l)), d1, acc1[i]);
                    }
                    r += 2 * l;
                }
                if r < body {
                    let d0 = self.dot_at::<S>(r);
                    for i in 0..R {
                        acc0[i] = S::fma(St::load::<S>(src[i].add(r)), d0, acc0[i]);
                    }
                }
                for i in 0..R {
                    sums[i] = S::reduce_sum(S::add(acc0[i], acc1[i]));
                    for r in body..kd {
                        sums[i] = (*src[i].add(r)).to_f32().mul_add(self.dot[r], sums[i]);
                    }
                }
            }
            let mut coefs = [(0f32, 0f32); R];
            let (mut c, mut c2) = ([S::zero(); R], [S::zero(); R]);
            for i in 0..R {
                coefs[i] = terms.terms(j + i, sums[i]);
                (c[i], c2[i]) = (S::splat(coefs[i].0), S::splat(coefs[i].1));
            }
            let (mut acc0, mut acc1) = ([S::zero(); R], [S::zero(); R]);
            let mut r = 0;
            while r + 2 * l <= body {
                self.update_step::<S, R, READ, WRITE, T>(&src, &dst, r, (&c, &c2), &mut acc0);
                self.update_step::<S, R, READ, WRITE, T>(&src, &dst, r + l, (&c, &c2), &mut acc1);
                r += 2 * l;
            }
            if r < body {
                self.update_step::<S, R, READ, WRITE, T>(&src, &dst, r, (&c, &c2), &mut acc0);
            }
            for i in 0..R {
                let (ci, c2i) = coefs[i];
                let mut oj = S::reduce_sum(S::add(acc0[i], acc1[i]));
                for r in body..kd {
                    let a = decays[if per_channel { r } else { 0 }];
                    let old = if READ { (*src[i].add(r)).to_f32() } else { 0.0 };
                    let mut upd = self.k[r] * ci;
                    if T::TWO_TERMS {
                        upd = k2[r].mul_add(c2i, upd);
                    }
                    let s_new = old.mul_add(a, upd);
                    if WRITE {
                        *dst[i].add(r) = St::from_f32(s_new);
                    }
                    oj = s_new.mul_add(self.q[r], oj);
                }
                o[j + i] = oj;
            }
        }
        R
    }

    /// `dot[r..]`, one vector.
    #[inline(always)]
    unsafe fn dot_at<S: Simd>(&self, r: usize) -> S::V {
        unsafe { S::load_f32(self.dot.as_ptr().add(r)) }
    }

    /// One vector of [`StateColumns::update`]'s second sweep for each of its columns: the new
    /// values at `r` (stored with `WRITE`), `acc[i] += q[r..] * S[j + i][r..]`.
    #[inline(always)]
    unsafe fn update_step<
        S: Simd,
        const R: usize,
        const READ: bool,
        const WRITE: bool,
        T: ColumnTerms,
    >(
        &self,
        src: &[*const St; R],
        dst: &[*mut St; R],
        r: usize,
        (c, c2): (&[S::V; R], &[S::V; R]),
        acc: &mut [S::V; R],
    ) {
        let (decays, per_channel) = self.decays;
        unsafe {
            let kv = S::load_f32(self.k.as_ptr().add(r));
            let k2v = match (T::TWO_TERMS, self.k2) {
                (true, Some(k2)) => S::load_f32(k2.as_ptr().add(r)),
                _ => S::zero(),
            };
            let a = match per_channel {
                true => S::load_f32(decays.as_ptr().add(r)),
                false => S::splat(decays[0]),
            };
            let qv = S::load_f32(self.q.as_ptr().add(r));
            for i in 0..R {
                let mut upd = S::mul(kv, c[i]);
                if T::TWO_TERMS {
                    upd = S::fma(k2v, c2[i], upd);
                }
                let s_new = match READ {
                    true => S::fma(St::load::<S>(src[i].add(r)), a, upd),
                    false => upd,
                };
                if WRITE {
                    St::store::<S>(dst[i].add(r), s_new);
                }
                acc[i] = S::fma(s_new, qv, acc[i]);
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
