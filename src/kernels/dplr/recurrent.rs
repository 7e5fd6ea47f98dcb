//! The per-token recurrence in f32 SIMD, for every sequence of a call.
//!
//! A task runs one sequence's group of heads (see [`sequence_heads`]). Columns of the state
//! evolve independently, so the `K x V` state is held in column blocks of `2 * LANES` (see
//! [`crate::kernels::state_blocks`]), loaded once per call and stored once (once per token written
//! in speculative mode or at a checkpoint), whatever the pool's layout: `[k][v]`, ggml's
//! transposed `[v][k]`, or other strides. At head size 64 the whole f32 state (16 KiB) stays in
//! L1 while a head runs.
//!
//! Each token is one pass over the state, fused: row `x` of a block becomes
//! `d[x] S[x] + b[x] sa + k[x] v`, is stored, and adds `r[x] S[x]` to the output and
//! `a'[x] S[x]` to the next token's `sa` (`a'` = the next token's `a`): 5 vector operations per
//! state element, no horizontal sums. Every sum runs in row order, so results do not depend on
//! where a task runs.

use super::DplrRule;
use crate::dtype::DType;
use crate::kernels::chunking::TaskBuffer;
use crate::kernels::simd::{
    Simd, SimdElement, exp_in_place, load_row_simd, scale_in_place, store_row_simd,
};
use crate::kernels::state_blocks::HeadStates;
use crate::kernels::strided::{Strided, prefetch, prefetch_l2};
use crate::kernels::{Sequence, StateWrite};

/// How many tokens ahead a head run alone prefetches its input rows into L2. A head's rows of
/// successive tokens are `H K` values apart (a page or more), where the hardware prefetchers
/// stop; the latency to cover is DRAM's plus a page walk per row. Measured on Zen 3 (a C replica
/// of the loop, 32 heads of 64, 2048 tokens, CPU time): no input loads 27 ms, rows prefetched 4
/// tokens ahead 65-70 ms, 32 ahead 43-46 ms. Heads run in groups prefetch the next run instead
/// ([`Ahead::Run`]).
const PREFETCH_TOKENS: usize = 32;

/// One token's inputs as f32 (`r` times the scale, the decay factors `d`), each row padded with
/// zeros to whole column blocks where it spans V.
pub(super) struct TokenRow<'a> {
    pub r: &'a [f32],
    pub d: &'a [f32],
    pub k: &'a [f32],
    pub a: &'a [f32],
    pub b: &'a [f32],
    pub v: &'a [f32],
}

/// Floats of one [`TokenRow`]: five rows of K, one of V rounded up to `padded_v`.
pub(super) fn token_floats(kd: usize, padded_v: usize) -> usize {
    5 * kd + padded_v
}

pub(super) fn split_token(buf: &[f32], kd: usize) -> TokenRow<'_> {
    let (r, rest) = buf.split_at(kd);
    let (d, rest) = rest.split_at(kd);
    let (k, rest) = rest.split_at(kd);
    let (a, rest) = rest.split_at(kd);
    let (b, v) = rest.split_at(kd);
    TokenRow { r, d, k, a, b, v }
}

/// Loads `[token, h]` of `t` into `dst` as f32.
#[inline(always)]
unsafe fn load<S: Simd>(t: &Strided, token: usize, h: usize, dst: &mut [f32]) {
    unsafe { load_row_simd::<S>(t.at(&[token, h]), t.dtype, t.strides[2], dst) }
}

/// Which input rows a task asks into L2 while it runs a token: rows it reads a while later.
#[derive(Clone, Copy)]
pub(super) enum Ahead {
    /// The same head's, [`PREFETCH_TOKENS`] tokens later: a head run alone through its tokens.
    Tokens,
    /// Head `head`'s, `tokens` later: the run that follows this one in a group of heads, a
    /// run's time ahead.
    Run { head: usize, tokens: usize },
}

impl Ahead {
    /// Reads into L2 the rows this asks for while token `token` of head `h` runs.
    #[inline(always)]
    fn prefetch(self, args: &DplrRule, token: usize, h: usize) {
        let (token, h) = match self {
            Ahead::Tokens => (token + PREFETCH_TOKENS, h),
            Ahead::Run { head, tokens } => (token + tokens, head),
        };
        if token < args.tokens {
            for t in [&args.r, &args.w, &args.k, &args.a, &args.b] {
                prefetch_l2(t.at(&[token, h]), args.k_dim * t.dtype.size());
            }
            prefetch_l2(args.v.at(&[token, h]), args.v_dim * args.v.dtype.size());
        }
    }
}

/// Whether the recurrence can read its token rows where the caller keeps them, as [`TokenRow`]s
/// without a copy: f32 rows of unit stride that need no scale, no `exp` and no padding (RWKV-7
/// from llama.cpp or the `rwkv` package: `w` linear, scale 1, V a multiple of `2 * LANES`). The
/// values are the copy's, so are the results.
fn rows_in_place<S: Simd>(args: &DplrRule) -> bool {
    let unit_f32 = |t: &Strided| t.dtype == DType::F32 && t.strides[2] == 1;
    args.scale == 1.0
        && args.w_linear
        && args.v_dim.is_multiple_of(2 * S::LANES)
        && [&args.r, &args.w, &args.k, &args.a, &args.b, &args.v]
            .into_iter()
            .all(unit_f32)
}

/// Token `token`'s rows of head `h` in the caller's tensors (see [`rows_in_place`]), the next
/// token's asked into L1.
///
/// # Safety
/// As for [`super::dplr_delta_rule`], and [`rows_in_place`] holds.
#[inline(always)]
unsafe fn borrow_token(args: &DplrRule, token: usize, h: usize) -> TokenRow<'_> {
    let (kd, vd) = (args.k_dim, args.v_dim);
    if token + 1 < args.tokens {
        for t in [&args.r, &args.w, &args.k, &args.a, &args.b] {
            prefetch(t.at(&[token + 1, h]), kd * 4);
        }
        prefetch(args.v.at(&[token + 1, h]), vd * 4);
    }
    unsafe {
        TokenRow {
            r: borrow_row(&args.r, token, h, kd),
            d: borrow_row(&args.w, token, h, kd),
            k: borrow_row(&args.k, token, h, kd),
            a: borrow_row(&args.a, token, h, kd),
            b: borrow_row(&args.b, token, h, kd),
            v: borrow_row(&args.v, token, h, vd),
        }
    }
}

/// Row `[token, h]` of `t`, `n` f32 values of unit stride.
///
/// # Safety
/// As for [`borrow_token`].
#[inline(always)]
unsafe fn borrow_row(t: &Strided, token: usize, h: usize, n: usize) -> &[f32] {
    // SAFETY: validated, aligned f32 elements of unit stride, not written during the call.
    unsafe { std::slice::from_raw_parts(t.at(&[token, h]).cast::<f32>(), n) }
}

/// Fills `buf` (see [`token_floats`]) with token `token`'s inputs for head `h`; the V row's
/// padding is left as it is (zero).
#[inline(always)]
pub(super) unsafe fn load_token<S: Simd>(args: &DplrRule, token: usize, h: usize, buf: &mut [f32]) {
    let (kd, vd) = (args.k_dim, args.v_dim);
    let (r, rest) = buf.split_at_mut(kd);
    let (d, rest) = rest.split_at_mut(kd);
    let (k, rest) = rest.split_at_mut(kd);
    let (a, rest) = rest.split_at_mut(kd);
    let (b, v) = rest.split_at_mut(kd);
    unsafe {
        load::<S>(&args.r, token, h, r);
        if args.scale != 1.0 {
            scale_in_place::<S>(r, args.scale);
        }
        debug_assert!(args.w.dtype == DType::F32);
        load::<S>(&args.w, token, h, d);
        if !args.w_linear {
            // The vector exp clamps below at LOG_DECAY_FLOOR: never 0, NaN or inf.
            exp_in_place::<S>(d);
        }
        load::<S>(&args.k, token, h, k);
        load::<S>(&args.a, token, h, a);
        load::<S>(&args.b, token, h, b);
        load::<S>(&args.v, token, h, &mut v[..vd]);
    }
}

/// `sums[j] = sum_x a[x] S[x][j]` over one column block (`K x 2 LANES` at `block`).
#[inline(always)]
unsafe fn column_sums<S: Simd>(block: *const f32, a: &[f32], sums: *mut f32) {
    let l = S::LANES;
    unsafe {
        let (mut n0, mut n1) = (S::zero(), S::zero());
        for (x, &ax) in a.iter().enumerate() {
            let row = block.add(x * 2 * l);
            let ax = S::splat(ax);
            n0 = S::fma(S::load_f32(row), ax, n0);
            n1 = S::fma(S::load_f32(row.add(l)), ax, n1);
        }
        S::store_f32(sums, n0);
        S::store_f32(sums.add(l), n1);
    }
}

/// One token over `N / 2` adjacent column blocks (each `K x 2 LANES`, `block_len` floats apart,
/// from `block`: `N` vectors of columns from `col`): reads this token's `sa` from `sa` and replaces
/// it with the next token's (`a_next`, when `NEXT`), writes `S^T r` to `o`. Two blocks a sweep
/// (where the registers hold them) share each row's five broadcasts and double the independent
/// sums in flight; every column's operations and their order are the same for any `N`.
#[inline(always)]
unsafe fn token_blocks<S: Simd, const NEXT: bool, const N: usize>(
    block: *mut f32,
    block_len: usize,
    t: &TokenRow,
    a_next: &[f32],
    col: usize,
    sa: *mut f32,
    o: *mut f32,
) {
    let l = S::LANES;
    let kd = t.k.len();
    unsafe {
        // Plain loops, no closures: a closure does not inherit the entry point's target
        // features, and where a build did not inline `std::array::from_fn`'s, every vector load
        // here was a call (the recurrence 4x slower).
        let v = t.v.as_ptr().add(col);
        let (mut sav, mut vv, mut at) = ([S::zero(); N], [S::zero(); N], [0; N]);
        for u in 0..N {
            // Vector `u` of a row: block `u / 2`, half `u % 2`.
            at[u] = (u / 2) * block_len + (u % 2) * l;
            sav[u] = S::load_f32(sa.add(u * l));
            vv[u] = S::load_f32(v.add(u * l));
        }
        let mut ov = [S::zero(); N];
        let mut nv = [S::zero(); N];
        let (rp, dp, kp, bp) = (t.r.as_ptr(), t.d.as_ptr(), t.k.as_ptr(), t.b.as_ptr());
        for x in 0..kd {
            let row = block.add(x * 2 * l);
            let (kx, bx, dx, rx) = (
                S::splat(*kp.add(x)),
                S::splat(*bp.add(x)),
                S::splat(*dp.add(x)),
                S::splat(*rp.add(x)),
            );
            let ax = if NEXT {
                S::splat(*a_next.as_ptr().add(x))
            } else {
                S::zero()
            };
            // Every old vector of the row is loaded before any new one is stored: blocks of
            // head size 64 are 8 KiB apart, and a load behind a store to an address equal in its
            // low 12 bits waits for that store (4K aliasing). Measured on a Xeon, 32 heads of 64
            // from llama.cpp's f32 rows: 10.4 ms for 512 tokens in a build that stored first,
            // 6.1 ms so.
            let mut old = [S::zero(); N];
            for u in 0..N {
                old[u] = S::load_f32(row.add(at[u]));
            }
            for u in 0..N {
                let upd = S::fma(bx, sav[u], S::mul(kx, vv[u]));
                let s_new = S::fma(old[u], dx, upd);
                S::store_f32(row.add(at[u]), s_new);
                ov[u] = S::fma(s_new, rx, ov[u]);
                if NEXT {
                    nv[u] = S::fma(s_new, ax, nv[u]);
                }
            }
        }
        for u in 0..N {
            S::store_f32(o.add(u * l), ov[u]);
            if NEXT {
                S::store_f32(sa.add(u * l), nv[u]);
            }
        }
    }
}

/// Tokens a task runs of one head before it turns to the next head of its group.
pub(super) const CHUNK_TOKENS: usize = 64;

/// Runs heads `heads` of a live (not padded) sequence through the recurrence, with the state pool
/// (if any) of dtype `St`, in runs of [`CHUNK_TOKENS`] tokens taken by each head in turn: the
/// group's rows of a token are adjacent in every input (`[T, H, K]`), where one head's rows of
/// successive tokens lie `H K` values apart, a page or more, on the same cache sets. Each head
/// keeps its state (column blocks) and its next token's `sa` between runs, so a head's
/// arithmetic is the same for any group.
///
/// # Safety
/// As for [`super::dplr_delta_rule`]; the CPU supports `S`.
#[inline(always)]
pub unsafe fn sequence_heads<S: Simd, St: SimdElement>(
    args: &DplrRule,
    seq: &Sequence,
    heads: std::ops::Range<usize>,
) {
    let (kd, vd, w) = (args.k_dim, args.v_dim, 2 * S::LANES);
    let blocks_n = vd.div_ceil(w);
    let padded_v = blocks_n * w;
    let row_len = token_floats(kd, padded_v);
    let state_len = blocks_n * kd * w;
    let carried = state_len + padded_v;
    let mut buf = TaskBuffer::take(heads.len() * carried + 2 * row_len + padded_v);
    let (heads_buf, rest) = buf.split_at_mut(heads.len() * carried);
    let (rows, o) = rest.split_at_mut(2 * row_len);
    let states = || HeadStates::of(args.state.as_ref(), kd, vd);
    let borrowed = rows_in_place::<S>(args);
    unsafe {
        if let Some(slot) = seq.read {
            for (head, h) in heads_buf.chunks_mut(carried).zip(heads.clone()) {
                states().load::<S, St>(slot, h, &mut head[..state_len]);
            }
            // A decode's next task is usually the next head of this slot.
            if seq.len == 1 && heads.end < args.heads {
                states().prefetch_l2(slot, heads.end);
            }
        }
        let chunk = match heads.len() {
            1 => seq.len,
            _ => CHUNK_TOKENS,
        };
        let mut t0 = 0;
        while t0 < seq.len {
            let t1 = (t0 + chunk).min(seq.len);
            for (head, h) in heads_buf.chunks_mut(carried).zip(heads.clone()) {
                let (blocks, sa) = head.split_at_mut(state_len);
                let ahead = match (heads.len(), h + 1 < heads.end) {
                    (1, _) => Ahead::Tokens,
                    (_, true) => Ahead::Run {
                        head: h + 1,
                        tokens: 0,
                    },
                    (_, false) => Ahead::Run {
                        head: heads.start,
                        tokens: chunk,
                    },
                };
                let scratch = (&mut *rows, &mut *o);
                head_tokens::<S, St>(args, seq, h, t0..t1, blocks, sa, scratch, borrowed, ahead);
            }
            t0 = t1;
        }
        if let StateWrite::Final(slot) = seq.write {
            for (head, h) in heads_buf.chunks(carried).zip(heads.clone()) {
                states().store::<S, St>(slot, h, &head[..state_len], 0, blocks_n);
            }
        }
    }
}

/// Tokens `tokens` of head `h`: `blocks` holds its state after the tokens before them and `sa`
/// the first token's `a^T S` (set here for the sequence's first token); `scratch` is two token
/// rows (unless [`rows_in_place`]) and an output row; `ahead` says what to prefetch.
///
/// # Safety
/// As for [`sequence_heads`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn head_tokens<S: Simd, St: SimdElement>(
    args: &DplrRule,
    seq: &Sequence,
    h: usize,
    tokens: std::ops::Range<usize>,
    blocks: &mut [f32],
    sa: &mut [f32],
    (rows, o): (&mut [f32], &mut [f32]),
    borrowed: bool,
    ahead: Ahead,
) {
    let (kd, vd, w) = (args.k_dim, args.v_dim, 2 * S::LANES);
    let blocks_n = vd.div_ceil(w);
    let row_len = rows.len() / 2;
    let states = || HeadStates::of(args.state.as_ref(), kd, vd);
    unsafe {
        // The first token's rows, in the half the loop reads it from.
        let first = tokens.start;
        let half = (first % 2) * row_len;
        if !borrowed {
            load_token::<S>(args, seq.start + first, h, &mut rows[half..half + row_len]);
        }
        if first == 0 && seq.read.is_some() {
            let a = match borrowed {
                true => borrow_row(&args.a, seq.start, h, kd),
                false => split_token(&rows[..row_len], kd).a,
            };
            for bi in 0..blocks_n {
                column_sums::<S>(
                    blocks.as_ptr().add(bi * kd * w),
                    a,
                    sa.as_mut_ptr().add(bi * w),
                );
            }
        }
        let out = &args.out;
        for i in tokens {
            ahead.prefetch(args, seq.start + i, h);
            let more = i + 1 < seq.len;
            let (t, a_next) = match borrowed {
                true => {
                    let t = borrow_token(args, seq.start + i, h);
                    let a_next = match more {
                        true => borrow_row(&args.a, seq.start + i + 1, h, kd),
                        false => t.a,
                    };
                    (t, a_next)
                }
                false => {
                    let (cur, next) = rows.split_at_mut(row_len);
                    let (cur, next) = match i % 2 {
                        0 => (&*cur, next),
                        _ => (&*next, cur),
                    };
                    if more {
                        load_token::<S>(args, seq.start + i + 1, h, next);
                    }
                    (split_token(cur, kd), split_token(next, kd).a)
                }
            };
            let mut bi = 0;
            while bi < blocks_n {
                let block = blocks.as_mut_ptr().add(bi * kd * w);
                let (col, sa, o) = (
                    bi * w,
                    sa.as_mut_ptr().add(bi * w),
                    o.as_mut_ptr().add(bi * w),
                );
                let pair = S::MANY_VECTORS && bi + 1 < blocks_n;
                let len = kd * w;
                match (more, pair) {
                    (true, true) => token_blocks::<S, true, 4>(block, len, &t, a_next, col, sa, o),
                    (false, true) => {
                        token_blocks::<S, false, 4>(block, len, &t, a_next, col, sa, o)
                    }
                    (true, false) => token_blocks::<S, true, 2>(block, len, &t, a_next, col, sa, o),
                    (false, false) => {
                        token_blocks::<S, false, 2>(block, len, &t, a_next, col, sa, o)
                    }
                }
                bi += if pair { 2 } else { 1 };
            }
            store_row_simd::<S>(
                out.at(&[seq.start + i, h]),
                out.dtype,
                out.strides[2],
                &o[..vd],
            );
            if let StateWrite::PerToken(slots) = &seq.write
                && let Some(slot) = slots[i]
            {
                states().store::<S, St>(slot, h, blocks, 0, blocks_n);
            }
            for cp in seq.checkpoints_after(i + 1) {
                states().store::<S, St>(cp.slot, h, blocks, 0, blocks_n);
            }
        }
    }
}
