//! The chunked SSD form for long prefills (chunks of [`CHUNK`] tokens; the last one may be short).
//!
//! Within a chunk of one head, with `cs_i` the inclusive cumulative sum of `d_j A` and `h0` the
//! state at its start, the per-token recurrence is exactly
//! `y_i = e^(cs_i) C_i h0^T + sum_{j <= i} (C_i . B_j) e^(cs_i - cs_j) d_j x_j (+ D x_i, gate)`,
//! `h_end = e^(cs_last) h0 + sum_j e^(cs_last - cs_j) d_j x_j (x) B_j`.
//! Every exponent `cs_i - cs_j` (`j <= i`) is summed over its own segment, `d_(j+1) A + .. + d_i A`,
//! so it is `<= 0` for decaying heads (no `e^(+cs)` is ever formed) and accurate to a few ulps
//! of itself, not of the cumulative sums. The state is kept transposed as `hT [N][P]` in f32, so all three
//! products are row-major GEMMs: `Y = (C hT) o e^cs`, `Y += (CB o L) X`, `hT += B^T (X o w)`.
//! Pass 1 ([`intra`], one task per (chunk, group)) stores C, `B^T` and `C B^T` in f32, shared by
//! the group's heads; pass 2 ([`inter`], one task per (sequence, head)) runs the chunks in order.

use super::recurrent::finish_row;
use super::{CHUNK, Scan};
use crate::kernels::chunking::Chunk;
use crate::kernels::gemm::{MatA, gemm};
use crate::kernels::simd::{Simd, exp_into};
use crate::kernels::strided::{load_row, read_f32, store_row, write_f32};
use crate::kernels::{Sequence, StateWrite};

const L: usize = CHUNK;

/// Scratch of one wave of groups `first_group .. first_group + groups`, in f32 elements, per chunk
/// and group: `C [L][N]`, `B^T [N][L]`, `C B^T [L][L]`.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub first_group: usize,
    pub groups: usize,
    pub state_dim: usize,
}

impl Layout {
    fn group_size(&self) -> usize {
        2 * L * self.state_dim + L * L
    }
    pub fn chunk_size(&self) -> usize {
        self.groups * self.group_size()
    }
    /// `(C, B^T, C B^T)` of chunk `c`, group `g`.
    fn group(&self, base: *mut f32, c: usize, g: usize) -> (*mut f32, *mut f32, *mut f32) {
        let cf =
            base.wrapping_add(c * self.chunk_size() + (g - self.first_group) * self.group_size());
        let bt = cf.wrapping_add(L * self.state_dim);
        (cf, bt, bt.wrapping_add(L * self.state_dim))
    }
}

/// Pass 1 for chunk `c` (tokens `chunk`) and group `g`.
///
/// # Safety
/// As for [`super::mamba2_scan`]; `base` holds the wave's scratch; the CPU supports `S`.
#[inline(always)]
pub unsafe fn intra<S: Simd>(
    args: &Scan,
    layout: &Layout,
    base: *mut f32,
    c: usize,
    chunk: Chunk,
    g: usize,
) {
    let (nd, m) = (args.state_dim, chunk.len);
    let (cf, bt, cb) = layout.group(base, c, g);
    let mut b_row = vec![0f32; nd];
    unsafe {
        for i in 0..m {
            let t = chunk.start + i;
            let c_row = std::slice::from_raw_parts_mut(cf.add(i * nd), nd);
            load_row(args.c.at(&[t, g]), args.c.dtype, args.c.strides[2], c_row);
            load_row(
                args.b.at(&[t, g]),
                args.b.dtype,
                args.b.strides[2],
                &mut b_row,
            );
            for (n, &v) in b_row.iter().enumerate() {
                *bt.add(n * L + i) = v;
            }
        }
        let c_rows = MatA {
            ptr: cf,
            row_stride: nd,
            col_stride: 1,
        };
        gemm::<S>(m, m, nd, c_rows, bt, L, cb, L, false, false);
    }
}

/// Pass 2: the chunks of `seq` (all of it) for head `h`, in order, through its state.
///
/// # Safety
/// As for [`super::mamba2_scan`]; pass 1 stored every chunk of `seq` for `h`'s group; the CPU
/// supports `S`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn inter<S: Simd>(
    args: &Scan,
    layout: &Layout,
    base: *mut f32,
    seq: &Sequence,
    first: usize,
    chunks: &[Chunk],
    h: usize,
) {
    let (pd, nd) = (args.head_dim, args.state_dim);
    let g = args.group(h);
    let a = args.a[h];
    // hT [N][P], the chunk's x [L][P], x scaled for the state update, outputs, the masked C B^T.
    let mut state_t = vec![0f32; nd * pd];
    let mut x = vec![0f32; L * pd];
    let mut xs = vec![0f32; L * pd];
    let mut y = vec![0f32; L * pd];
    let mut z = vec![0f32; if args.z.is_some() { L * pd } else { 0 }];
    let mut masked = vec![0f32; L * L];
    let (mut step, mut cs, mut tmp, mut e) = ([0f32; L], [0f32; L], [0f32; L], [0f32; L]);
    let mut have_state = seq.read.is_some();
    if let Some(slot) = seq.read {
        unsafe { load_transposed(args, slot, h, &mut state_t) };
    }
    for (ci, chunk) in chunks.iter().enumerate() {
        let m = chunk.len;
        let (cf, bt, cb) = layout.group(base, first + ci, g);
        unsafe {
            let mut sum = 0f32;
            for i in 0..m {
                let t = chunk.start + i;
                step[i] = args.step(t, h);
                sum += step[i] * a;
                cs[i] = sum;
                load_row(
                    args.x.at(&[t, h]),
                    args.x.dtype,
                    args.x.strides[2],
                    &mut x[i * pd..(i + 1) * pd],
                );
                if let Some(zt) = &args.z {
                    load_row(
                        zt.at(&[t, h]),
                        zt.dtype,
                        zt.strides[2],
                        &mut z[i * pd..(i + 1) * pd],
                    );
                }
            }
            // masked[i][j] = (C_i . B_j) e^(cs_i - cs_j) d_j for j <= i, zero above the diagonal,
            // with each exponent summed over its own segment, `d_(j+1) A + .. + d_i A`: the
            // difference of two cumulative sums would carry their rounding, `|cs| eps` per term,
            // far more than the segment's own when a head decays hard and then softly.
            for i in 0..m {
                tmp[i] = 0.0;
                for j in (0..i).rev() {
                    tmp[j] = tmp[j + 1] + step[j + 1] * a;
                }
                exp_into::<S>(&tmp[..=i], &mut e[..=i]);
                let row = &mut masked[i * L..i * L + m];
                for j in 0..=i {
                    row[j] = *cb.add(i * L + j) * e[j] * step[j];
                }
                row[i + 1..].iter_mut().for_each(|v| *v = 0.0);
            }
            // Y = e^cs o (C hT), then Y += masked X.
            if have_state {
                let c_rows = MatA {
                    ptr: cf,
                    row_stride: nd,
                    col_stride: 1,
                };
                gemm::<S>(
                    m,
                    pd,
                    nd,
                    c_rows,
                    state_t.as_ptr(),
                    pd,
                    y.as_mut_ptr(),
                    pd,
                    false,
                    false,
                );
                exp_into::<S>(&cs[..m], &mut e[..m]);
                for i in 0..m {
                    y[i * pd..(i + 1) * pd].iter_mut().for_each(|v| *v *= e[i]);
                }
            }
            let mask_rows = MatA {
                ptr: masked.as_ptr(),
                row_stride: L,
                col_stride: 1,
            };
            gemm::<S>(
                m,
                pd,
                m,
                mask_rows,
                x.as_ptr(),
                pd,
                y.as_mut_ptr(),
                pd,
                have_state,
                true,
            );
            let out = &args.out;
            for i in 0..m {
                let rows = i * pd..(i + 1) * pd;
                let zi = args.z.as_ref().map(|_| &z[rows.clone()]);
                finish_row::<S>(&mut y[rows.clone()], &x[rows.clone()], zi, args.d[h]);
                store_row(
                    out.at(&[chunk.start + i, h]),
                    out.dtype,
                    out.strides[2],
                    &y[rows],
                );
            }
            // hT = e^(cs_last) hT + B^T (X o e^(cs_last - cs_j) d_j).
            // The same segment sums for row `m - 1`.
            tmp[m - 1] = 0.0;
            for j in (0..m - 1).rev() {
                tmp[j] = tmp[j + 1] + step[j + 1] * a;
            }
            exp_into::<S>(&tmp[..m], &mut e[..m]);
            for j in 0..m {
                let w = e[j] * step[j];
                for p in 0..pd {
                    xs[j * pd + p] = x[j * pd + p] * w;
                }
            }
            if have_state {
                let decay = cs[m - 1].exp();
                state_t.iter_mut().for_each(|v| *v *= decay);
            }
            let b_cols = MatA {
                ptr: bt,
                row_stride: L,
                col_stride: 1,
            };
            gemm::<S>(
                nd,
                pd,
                m,
                b_cols,
                xs.as_ptr(),
                pd,
                state_t.as_mut_ptr(),
                pd,
                have_state,
                false,
            );
            have_state = true;
        }
    }
    if let StateWrite::Final(slot) = seq.write {
        unsafe { store_transposed(args, slot, h, &state_t) };
    }
}

/// Reads `[P][N]` of a state slot into `hT [N][P]`.
unsafe fn load_transposed(args: &Scan, slot: usize, h: usize, state_t: &mut [f32]) {
    let st = args
        .state
        .as_ref()
        .expect("a state slot without a state tensor");
    let (pd, nd) = (args.head_dim, args.state_dim);
    for p in 0..pd {
        for n in 0..nd {
            state_t[n * pd + p] = unsafe { read_f32(st.at(&[slot, h, p, n]), st.dtype) };
        }
    }
}

/// Writes `hT [N][P]` to `[P][N]` of a state slot, rounded to its dtype.
unsafe fn store_transposed(args: &Scan, slot: usize, h: usize, state_t: &[f32]) {
    let st = args
        .state
        .as_ref()
        .expect("a state slot without a state tensor");
    let (pd, nd) = (args.head_dim, args.state_dim);
    for p in 0..pd {
        for n in 0..nd {
            unsafe { write_f32(st.at(&[slot, h, p, n]), st.dtype, state_t[n * pd + p]) };
        }
    }
}
