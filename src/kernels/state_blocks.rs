//! A head's `K x V` recurrent state held as column blocks in a task buffer, shared by the
//! per-token recurrences (delta rule, DPLR delta rule). Columns of these states evolve
//! independently, so block `b` holds columns `b*W .. b*W+W` (W = `2*LANES`) as `K x W` rows,
//! zero-padded past `V`: a block stays in L1 while tokens run over it, and any state layout
//! (`[k][v]`, the transposed `[v][k]` view, other strides) is read and written through it.

use super::simd::{Simd, SimdElement};
use super::strided::{Strided, load_row, prefetch, store_row, write_f32};

/// The state tensor `[S, heads, K, V]` of a call and its two head dimensions.
#[derive(Clone, Copy)]
pub(crate) struct HeadStates<'a> {
    pub pool: &'a Strided,
    pub k_dim: usize,
    pub v_dim: usize,
}

impl HeadStates<'_> {
    /// Loads the state of `slot`, head `head` into `blocks` (see the module doc). Rows are read
    /// in memory order, so the hardware prefetcher streams the slot.
    ///
    /// # Safety
    /// `slot` and `head` are in bounds; `blocks` holds `V.div_ceil(W) * K * W` floats; the CPU
    /// supports `S`.
    #[inline(always)]
    pub(crate) unsafe fn load<S: Simd, St: SimdElement>(
        self,
        slot: usize,
        head: usize,
        blocks: &mut [f32],
    ) {
        let st = self.pool;
        let (kd, vd, w) = (self.k_dim, self.v_dim, 2 * S::LANES);
        let contiguous = st.strides[3] == 1 && st.dtype == St::DTYPE;
        let row_bytes = vd * st.dtype.size();
        for r in 0..kd {
            // Prefetch four rows ahead: the hardware prefetchers stop at page boundaries.
            if st.strides[3] == 1 && r + 4 < kd {
                prefetch(st.at(&[slot, head, r + 4, 0]), row_bytes);
            }
            let mut v0 = 0;
            while v0 < vd {
                let width = w.min(vd - v0);
                let src = st.at(&[slot, head, r, v0]);
                let dst = &mut blocks[((v0 / w) * kd + r) * w..][..w];
                unsafe {
                    if contiguous && width == w {
                        S::store_f32(dst.as_mut_ptr(), St::load::<S>(src.cast()));
                        S::store_f32(
                            dst.as_mut_ptr().add(S::LANES),
                            St::load::<S>(src.cast::<St>().add(S::LANES)),
                        );
                    } else {
                        load_row(src, st.dtype, st.strides[3], &mut dst[..width]);
                        dst[width..].iter_mut().for_each(|x| *x = 0.0);
                    }
                }
                v0 += w;
            }
        }
    }

    /// Stores column blocks `first..end` of `blocks` to `slot`, head `head`, rounding to the
    /// state dtype.
    ///
    /// # Safety
    /// As for [`HeadStates::load`]; the slot is this task's alone.
    #[inline(always)]
    pub(crate) unsafe fn store<S: Simd, St: SimdElement>(
        self,
        slot: usize,
        head: usize,
        blocks: &[f32],
        first: usize,
        end: usize,
    ) {
        let st = self.pool;
        let (kd, vd, w) = (self.k_dim, self.v_dim, 2 * S::LANES);
        let contiguous = st.strides[3] == 1 && st.dtype == St::DTYPE;
        for r in 0..kd {
            for b in first..end {
                let v0 = b * w;
                let width = w.min(vd - v0);
                let dst = st.at(&[slot, head, r, v0]);
                let src = &blocks[(b * kd + r) * w..][..w];
                unsafe {
                    if contiguous && width == w {
                        St::store::<S>(dst.cast(), S::load_f32(src.as_ptr()));
                        St::store::<S>(
                            dst.cast::<St>().add(S::LANES),
                            S::load_f32(src.as_ptr().add(S::LANES)),
                        );
                    } else {
                        store_row(dst, st.dtype, st.strides[3], &src[..width]);
                    }
                }
            }
        }
    }
}

/// Zeroes `width` values of head `head` in output rows `tokens` of `out` (`[T, heads, width]`):
/// a padded sequence's output.
///
/// # Safety
/// The rows are in bounds and this task's alone.
pub(crate) unsafe fn zero_rows(
    out: &Strided,
    tokens: std::ops::Range<usize>,
    head: usize,
    width: usize,
) {
    for t in tokens {
        for j in 0..width {
            unsafe { write_f32(out.at(&[t, head, j]), out.dtype, 0.0) };
        }
    }
}
