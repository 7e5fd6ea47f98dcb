//! A head's `K x V` recurrent state held as column blocks in a task buffer, shared by the
//! per-token recurrences (delta rule, DPLR delta rule). Columns of these states evolve
//! independently, so block `b` holds columns `b*W .. b*W+W` (W = `2*LANES`) as `K x W` rows,
//! zero-padded past `V`: a block stays in L1 while tokens run over it, and any state layout
//! (`[k][v]`, the transposed `[v][k]` view, other strides) is read and written through it.

use super::simd::{Simd, SimdElement, transpose};
use super::strided::{Strided, load_row, prefetch, prefetch_l2, store_row, write_f32};
use crate::dtype::DType;

/// The state tensor `[S, heads, K, V]` of a call and its two head dimensions.
#[derive(Clone, Copy)]
pub(crate) struct HeadStates<'a> {
    pub pool: &'a Strided,
    pub k_dim: usize,
    pub v_dim: usize,
}

impl<'a> HeadStates<'a> {
    /// A call's state pool as column blocks: a task reads or writes a slot only when the call
    /// has a pool.
    pub(crate) fn of(pool: Option<&'a Strided>, k_dim: usize, v_dim: usize) -> HeadStates<'a> {
        HeadStates {
            pool: pool.expect("state slot without a state tensor"),
            k_dim,
            v_dim,
        }
    }

    /// An f32 pool with k contiguous (ggml's `[v][k]` rows seen as `[k][v]`): a column block is
    /// a transposed run of state rows, moved through registers rather than element by element.
    fn value_major_f32(self) -> bool {
        self.pool.strides[2] == 1 && self.pool.strides[3] != 1 && self.pool.dtype == DType::F32
    }

    /// Asks for the state of `slot`, head `head` in L2, row by row in memory order: a decode
    /// reads the next head's state while it computes this one's from cache.
    #[inline(always)]
    pub(crate) fn prefetch_l2(self, slot: usize, head: usize) {
        let st = self.pool;
        let size = st.dtype.size();
        match st.strides[3] == 1 {
            true => (0..self.k_dim)
                .for_each(|r| prefetch_l2(st.at(&[slot, head, r, 0]), self.v_dim * size)),
            false if st.strides[2] == 1 => (0..self.v_dim)
                .for_each(|j| prefetch_l2(st.at(&[slot, head, 0, j]), self.k_dim * size)),
            false => {}
        }
    }

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
        if self.value_major_f32() {
            for v0 in (0..vd).step_by(w) {
                let width = w.min(vd - v0);
                let block = &mut blocks[(v0 / w) * kd * w..][..kd * w];
                unsafe {
                    let src = st.at(&[slot, head, 0, v0]).cast::<f32>();
                    transpose(src, st.strides[3], block.as_mut_ptr(), w, width, kd);
                }
                if width < w {
                    block.chunks_mut(w).for_each(|row| row[width..].fill(0.0));
                }
            }
            return;
        }
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
        if self.value_major_f32() {
            for b in first..end {
                let v0 = b * w;
                let width = w.min(vd - v0);
                unsafe {
                    let dst = st.at(&[slot, head, 0, v0]).cast::<f32>();
                    transpose(
                        blocks[b * kd * w..].as_ptr(),
                        w,
                        dst,
                        st.strides[3],
                        kd,
                        width,
                    );
                }
            }
            return;
        }
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
