//! A decode (one token) straight on the slot's rows, with the shared one-token machinery of
//! [`crate::kernels::decode_rows`]: each state element is read once from memory and written once,
//! where the blocked recurrence copies the state into column blocks and back.
//!
//! RWKV-7's update `S = diag(d) S + b (x) sa + k (x) v` is that machinery's two rank-1 terms:
//! `k` with the coefficients `v`, and `b` with `sa = a^T S`. On a v-contiguous (`[k][v]`) state
//! `sa` is a column sum (pass 1) before the rows are updated (pass 2), in the blocked path's
//! order, so the results are bitwise those of the blocked path; on a k-contiguous (`[v][k]`,
//! ggml's) state each stored row is one column of `S` and takes one pass.

use super::DplrRule;
use super::recurrent::{load_token, split_token, token_floats};
use crate::kernels::Sequence;
use crate::kernels::chunking::TaskBuffer;
use crate::kernels::decode_rows::{ColumnTerms, StateColumns, StateRows, copy_to_checkpoints};
use crate::kernels::simd::{Simd, SimdElement, store_row_simd};

/// Runs a one-token sequence on a state of dtype `St` whose rows are contiguous along K or V.
/// Returns false (nothing done) for anything else, which the blocked recurrence then runs.
///
/// # Safety
/// As for [`super::dplr_delta_rule`]; the CPU supports `S`.
#[inline(always)]
pub unsafe fn decode<S: Simd, St: SimdElement>(args: &DplrRule, seq: &Sequence, h: usize) -> bool {
    let Some(st) = args.state.as_ref() else {
        return false;
    };
    let v_contiguous = st.strides[3] == 1;
    if seq.len != 1 || st.dtype != St::DTYPE || !(v_contiguous || st.strides[2] == 1) {
        return false;
    }
    let write = seq.write.after_first_token();
    let (kd, vd) = (args.k_dim, args.v_dim);
    let row_len = token_floats(kd, vd);
    let mut buf = TaskBuffer::take(row_len + vd);
    let (row, o) = buf.split_at_mut(row_len);
    unsafe { load_token::<S>(args, seq.start, h, row) };
    let t = split_token(row, kd);
    // The state's contiguous rows: `[k][v]` row `x` (V values), or `[v][k]` row `j` (K values).
    let (rows, row_elems) = match v_contiguous {
        true => (kd, vd),
        false => (vd, kd),
    };
    let row_at = |slot: usize, i: usize| match v_contiguous {
        true => st.at(&[slot, h, i, 0]).cast::<St>(),
        false => st.at(&[slot, h, 0, i]).cast::<St>(),
    };
    let (read, write_to) = (
        seq.read.map(|slot| row_at(slot, 0).cast_const()),
        write.map(|slot| row_at(slot, 0)),
    );
    let terms = &Terms { v: &t.v[..vd] };
    unsafe {
        match v_contiguous {
            true => StateRows {
                read,
                write: write_to,
                row_stride: st.strides[2],
                x: t.a,
                decays: (t.d, true),
                k: t.k,
                k2: Some(t.b),
                q: t.r,
                // The next task is usually the next head of this slot.
                next: seq
                    .read
                    .filter(|_| h + 1 < args.heads)
                    .map(|slot| st.at(&[slot, h + 1, 0, 0]).cast::<St>().cast_const()),
            }
            .run::<S, _>(terms, o),
            false => StateColumns {
                read,
                write: write_to,
                row_stride: st.strides[3],
                dot: t.a,
                decays: (t.d, true),
                k: t.k,
                k2: Some(t.b),
                q: t.r,
            }
            .run::<S, _>(terms, o),
        }
        copy_to_checkpoints(seq, write, rows, row_elems, row_at);
        let out = &args.out;
        store_row_simd::<S>(out.at(&[seq.start, h]), out.dtype, out.strides[2], o);
    }
    true
}

/// RWKV-7's two rank-1 terms of column `j`: `k v_j` and `b sa_j`, `sa_j = a . S[j]`.
struct Terms<'a> {
    v: &'a [f32],
}

impl ColumnTerms for Terms<'_> {
    const TWO_TERMS: bool = true;
    #[inline(always)]
    fn terms(&self, j: usize, sa: f32) -> (f32, f32) {
        (self.v[j], sa)
    }
}
