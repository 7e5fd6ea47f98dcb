//! One-token state updates straight on a slot's rows, shared by the delta rules (Gated DeltaNet,
//! KDA and RWKV-7's DPLR rule): a decode reads each state element once from memory and writes it
//! once, with no copy of the state.
//!
//! Every one of these rules updates a `K x V` state row by row as
//! `S[r] = d_r S[r] + k[r] c + k2[r] c2` (`d` a decay per row, `c`, `c2` V-vectors, the second
//! term optional) and reads `o = S^T q` from the new rows, where `c` or `c2` depends on a
//! column sum of the old state (`S^T x`). On a v-contiguous state that is two passes over the
//! rows ([`OldRows`], [`UpdateRows`]); on a k-contiguous one (ggml's transposed `[v][k]` heads)
//! each stored row is one column of `S`, whose sum, update and output need that row alone
//! ([`StateColumns`]): one pass.

use crate::kernels::Sequence;
use crate::kernels::simd::{Simd, SimdElement};
use crate::kernels::strided::{prefetch, prefetch_l2};

/// State rows ahead that a decode's first pass prefetches (4 KiB of an f32 row of 128).
pub(crate) const DECODE_PREFETCH_ROWS: usize = 8;

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

pub(crate) fn src_none<St>() -> *const St {
    std::ptr::null()
}

pub(crate) fn dst_none<St>() -> *mut St {
    std::ptr::null_mut()
}

/// The coefficients `(c, c2)` of the rank-1 terms of column `j`, from its column sum (a trait
/// with an inlined method rather than a closure: closures do not inherit the caller's target
/// features, so a closure here was a call per row that spilled every vector register).
pub(crate) trait ColumnTerms {
    fn terms(&self, column_sum: f32) -> (f32, f32);
}

/// The update of every column of `S` stored as a k-contiguous row `S[j]` (one pass).
pub(crate) struct StateColumns<'a> {
    /// The vector the old row is dotted with (`x` of the column sum `x . S[j]`).
    pub dot: &'a [f32],
    /// The decays: one for every element, or one per element (`true`).
    pub decays: (&'a [f32], bool),
    pub k: &'a [f32],
    /// The optional second rank-1 term's row factors.
    pub k2: Option<&'a [f32]>,
    pub q: &'a [f32],
}

impl StateColumns<'_> {
    /// Column `j` of the state: `s = dot . S[j]` (the old row, read through `src`; 0 without:
    /// `READ`), `(c, c2) = terms.terms(s)`, `S[j] = d S[j] + k c + k2 c2` (stored through `dst`:
    /// `WRITE`); returns `o_j = S[j] . q`. Two accumulators per sum, in a fixed order.
    ///
    /// # Safety
    /// `src` (with `READ`) and `dst` (with `WRITE`) address `K` values; the CPU supports `S`.
    #[inline(always)]
    pub(crate) unsafe fn update<S: Simd, St: SimdElement, const READ: bool, const WRITE: bool>(
        &self,
        src: *const St,
        dst: *mut St,
        terms: &impl ColumnTerms,
    ) -> f32 {
        let (l, kd) = (S::LANES, self.k.len());
        let body = kd / l * l;
        let (decays, per_channel) = self.decays;
        unsafe {
            let mut sum = 0f32;
            if READ {
                // Even vectors into one accumulator, odd ones into the other (named, not an
                // indexed array, which the compiler kept in memory; helpers, not closures, which
                // do not inherit the caller's target features).
                let (mut acc0, mut acc1) = (S::zero(), S::zero());
                let mut r = 0;
                while r + 2 * l <= body {
                    acc0 = self.dot_step::<S, St>(src, r, acc0);
                    acc1 = self.dot_step::<S, St>(src, r + l, acc1);
                    r += 2 * l;
                }
                if r < body {
                    acc0 = self.dot_step::<S, St>(src, r, acc0);
                }
                sum = S::reduce_sum(S::add(acc0, acc1));
                for r in body..kd {
                    sum = (*src.add(r)).to_f32().mul_add(self.dot[r], sum);
                }
            }
            let (c, c2) = terms.terms(sum);
            let (cv, c2v) = (S::splat(c), S::splat(c2));
            let (mut acc0, mut acc1) = (S::zero(), S::zero());
            let mut r = 0;
            while r + 2 * l <= body {
                acc0 = self.update_step::<S, St, READ, WRITE>(src, dst, r, (cv, c2v), acc0);
                acc1 = self.update_step::<S, St, READ, WRITE>(src, dst, r + l, (cv, c2v), acc1);
                r += 2 * l;
            }
            if r < body {
                acc0 = self.update_step::<S, St, READ, WRITE>(src, dst, r, (cv, c2v), acc0);
            }
            let mut o = S::reduce_sum(S::add(acc0, acc1));
            for r in body..kd {
                let a = decays[if per_channel { r } else { 0 }];
                let old = if READ { (*src.add(r)).to_f32() } else { 0.0 };
                let mut upd = self.k[r] * c;
                if let Some(k2) = self.k2 {
                    upd = k2[r].mul_add(c2, upd);
                }
                let s_new = old.mul_add(a, upd);
                if WRITE {
                    *dst.add(r) = St::from_f32(s_new);
                }
                o = s_new.mul_add(self.q[r], o);
            }
            o
        }
    }

    /// `acc + dot[r..] * S[j][r..]`, one vector.
    #[inline(always)]
    unsafe fn dot_step<S: Simd, St: SimdElement>(
        &self,
        src: *const St,
        r: usize,
        acc: S::V,
    ) -> S::V {
        unsafe {
            S::fma(
                St::load::<S>(src.add(r)),
                S::load_f32(self.dot.as_ptr().add(r)),
                acc,
            )
        }
    }

    /// One vector of [`StateColumns::update`]'s second sweep: the new row values at `r`
    /// (stored with `WRITE`), returns `acc + q[r..] * S[j][r..]`.
    #[inline(always)]
    unsafe fn update_step<S: Simd, St: SimdElement, const READ: bool, const WRITE: bool>(
        &self,
        src: *const St,
        dst: *mut St,
        r: usize,
        (c, c2): (S::V, S::V),
        acc: S::V,
    ) -> S::V {
        let (decays, per_channel) = self.decays;
        unsafe {
            let mut upd = S::mul(S::load_f32(self.k.as_ptr().add(r)), c);
            if let Some(k2) = self.k2 {
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
            S::fma(s_new, S::load_f32(self.q.as_ptr().add(r)), acc)
        }
    }
}

/// Vectors of columns a decode pass keeps in registers (accumulators and, in pass 2, `c`):
/// half the register file (8 with AVX-512, 4 with AVX2). Summed in registers rather than in a
/// row of memory, each row's update no longer waits for the previous row's store to forward
/// (measured: a 1-sequence GDN decode from cache went from 125 to 57-63 us).
fn column_vectors<S: Simd>() -> usize {
    if S::VECTORS_IN_REGISTERS >= 32 { 8 } else { 4 }
}

/// Pass 1 of a decode on a v-contiguous state: the rows of one slot and head, read in place.
pub(crate) struct OldRows<'a, St> {
    /// Row 0; row `r` is `r * row_stride` elements on.
    pub row0: *const St,
    pub row_stride: usize,
    /// One factor per row.
    pub x: &'a [f32],
}

impl<St: SimdElement> OldRows<'_, St> {
    /// `sums[j] = sum_r row_r[j] * x[r]` over every column, summed in row order per column (as
    /// the blocked paths sum). Columns go in register blocks of [`column_vectors`]; the
    /// first block's sweep prefetches whole rows ahead (the hardware prefetchers stop at page
    /// boundaries), which the later blocks then find in cache.
    ///
    /// # Safety
    /// `row0` is valid for `x.len()` rows of `sums.len()` values; the CPU supports `S`.
    #[inline(always)]
    pub(crate) unsafe fn column_sums<S: Simd>(&self, sums: &mut [f32]) {
        let (l, vd) = (S::LANES, sums.len());
        let vectors = vd / l;
        let mut first = 0;
        unsafe {
            while first < vectors {
                let (col, out) = (first * l, sums.as_mut_ptr().add(first * l));
                first += match (vectors - first).min(column_vectors::<S>()) {
                    8 => self.column_block::<S, 8>(col, vd, out),
                    4..=7 => self.column_block::<S, 4>(col, vd, out),
                    3 => self.column_block::<S, 3>(col, vd, out),
                    2 => self.column_block::<S, 2>(col, vd, out),
                    _ => self.column_block::<S, 1>(col, vd, out),
                };
            }
            for (r, &xr) in self.x.iter().enumerate() {
                let row = self.row0.add(r * self.row_stride);
                for j in vectors * l..vd {
                    sums[j] = (*row.add(j)).to_f32().mul_add(xr, sums[j]);
                }
            }
        }
    }

    /// [`OldRows::column_sums`] of the `N` vectors from column `col` into `out`.
    #[inline(always)]
    unsafe fn column_block<S: Simd, const N: usize>(
        &self,
        col: usize,
        vd: usize,
        out: *mut f32,
    ) -> usize {
        let l = S::LANES;
        let row_bytes = vd * size_of::<St>();
        unsafe {
            let mut acc = [S::zero(); N];
            for (r, &xr) in self.x.iter().enumerate() {
                if col == 0 && r + DECODE_PREFETCH_ROWS < self.x.len() {
                    let ahead = self.row0.add((r + DECODE_PREFETCH_ROWS) * self.row_stride);
                    prefetch(ahead.cast(), row_bytes);
                }
                let row = self.row0.add(r * self.row_stride + col);
                let xv = S::splat(xr);
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
}

/// Pass 2 of a decode on a v-contiguous state: row `r` becomes
/// `d_r S[r] + k[r] c + k2[r] c2` (read through `read`, zeros without; stored through `write`
/// when given) and `o += q[r] S[r]`.
pub(crate) struct UpdateRows<'a, St> {
    /// Row 0 of the old and the new state; row `r` is `r * row_stride` elements on.
    pub read: Option<*const St>,
    pub write: Option<*mut St>,
    pub row_stride: usize,
    /// The next head's state, read into L2 while this pass computes from cache.
    pub next_head: Option<*const u8>,
    /// The decays: one for every row, or one per row (`true`).
    pub decays: (&'a [f32], bool),
    pub k: &'a [f32],
    pub q: &'a [f32],
    pub c: &'a [f32],
    /// The optional second rank-1 term: its row factors `k2` and its V-vector `c2`.
    pub second: Option<(&'a [f32], &'a [f32])>,
}

impl<St: SimdElement> UpdateRows<'_, St> {
    /// The rows, with the presence of the old and the new state and of the second term fixed at
    /// compile time (matching the `Option`s per vector kept the loop's values on the stack).
    /// Columns go in register blocks as in pass 1; `o` is summed in row order per column.
    ///
    /// # Safety
    /// The pointers are valid for `K` rows of `V` values; the CPU supports `S`.
    #[inline(always)]
    pub(crate) unsafe fn run<S: Simd>(&self, o: &mut [f32]) {
        unsafe {
            match (
                self.read.is_some(),
                self.write.is_some(),
                self.second.is_some(),
            ) {
                (true, true, false) => self.columns::<S, true, true, false>(o),
                (true, false, false) => self.columns::<S, true, false, false>(o),
                (false, true, false) => self.columns::<S, false, true, false>(o),
                (false, false, false) => self.columns::<S, false, false, false>(o),
                (true, true, true) => self.columns::<S, true, true, true>(o),
                (true, false, true) => self.columns::<S, true, false, true>(o),
                (false, true, true) => self.columns::<S, false, true, true>(o),
                (false, false, true) => self.columns::<S, false, false, true>(o),
            }
        }
    }

    #[inline(always)]
    unsafe fn columns<S: Simd, const READ: bool, const WRITE: bool, const TWO: bool>(
        &self,
        o: &mut [f32],
    ) {
        let (l, vd) = (S::LANES, o.len());
        let vectors = vd / l;
        let mut first = 0;
        unsafe {
            while first < vectors {
                let col = first * l;
                first += match (vectors - first).min(column_vectors::<S>()) {
                    8 => self.block::<S, 8, READ, WRITE, TWO>(col, o),
                    4..=7 => self.block::<S, 4, READ, WRITE, TWO>(col, o),
                    3 => self.block::<S, 3, READ, WRITE, TWO>(col, o),
                    2 => self.block::<S, 2, READ, WRITE, TWO>(col, o),
                    _ => self.block::<S, 1, READ, WRITE, TWO>(col, o),
                };
            }
            let (decays, per_channel) = self.decays;
            for (r, (&kr, &qr)) in self.k.iter().zip(self.q).enumerate() {
                let a = decays[if per_channel { r } else { 0 }];
                let offset = r * self.row_stride;
                for j in vectors * l..vd {
                    let old = match (READ, self.read) {
                        (true, Some(src)) => (*src.add(offset + j)).to_f32(),
                        _ => 0.0,
                    };
                    let mut upd = kr * self.c[j];
                    if let (true, Some((k2, c2))) = (TWO, self.second) {
                        upd = k2[r].mul_add(c2[j], upd);
                    }
                    let s_new = old.mul_add(a, upd);
                    if let (true, Some(dst)) = (WRITE, self.write) {
                        *dst.add(offset + j) = St::from_f32(s_new);
                    }
                    o[j] = s_new.mul_add(qr, o[j]);
                }
            }
        }
    }

    /// [`UpdateRows::run`] on the `N` vectors from column `col`; the first block's sweep reads
    /// the next head's state into L2 (the next task is usually that head), so memory is never
    /// idle while this pass computes from cache.
    #[inline(always)]
    unsafe fn block<
        S: Simd,
        const N: usize,
        const READ: bool,
        const WRITE: bool,
        const TWO: bool,
    >(
        &self,
        col: usize,
        o: &mut [f32],
    ) -> usize {
        let l = S::LANES;
        let row_bytes = o.len() * size_of::<St>();
        let (decays, per_channel) = self.decays;
        let src0 = self.read.unwrap_or(std::ptr::null()).wrapping_add(col);
        let dst0 = self.write.unwrap_or(std::ptr::null_mut()).wrapping_add(col);
        let (k2, c2_row): (&[f32], &[f32]) = self.second.unwrap_or((&[], &[]));
        unsafe {
            let mut c = [S::zero(); N];
            let mut c2 = [S::zero(); N];
            for u in 0..N {
                c[u] = S::load_f32(self.c.as_ptr().add(col + u * l));
                if TWO {
                    c2[u] = S::load_f32(c2_row.as_ptr().add(col + u * l));
                }
            }
            let mut acc = [S::zero(); N];
            for (r, (&kr, &qr)) in self.k.iter().zip(self.q).enumerate() {
                let offset = r * self.row_stride;
                if let (0, Some(next)) = (col, self.next_head) {
                    prefetch_l2(next.wrapping_add(offset * size_of::<St>()), row_bytes);
                }
                let a = S::splat(decays[if per_channel { r } else { 0 }]);
                let (kv, qv) = (S::splat(kr), S::splat(qr));
                let k2v = if TWO {
                    S::splat(*k2.as_ptr().add(r))
                } else {
                    S::zero()
                };
                let (src, dst) = (src0.wrapping_add(offset), dst0.wrapping_add(offset));
                for u in 0..N {
                    let mut upd = S::mul(kv, c[u]);
                    if TWO {
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
