//! Register-blocked f32 GEMM for the small fixed shapes of the chunked form (C x C, C x K and
//! K x V for chunks of C tokens): `C (+)= A B` with `A` addressed through row and column strides
//! (so a transposed operand costs nothing: its elements are broadcast one by one) and `B`, `C`
//! row-major. The micro-tile is `MR` rows x `NV * LANES` columns, as many accumulators as the
//! register file leaves room for: 6 x 16 on AVX2 (12 accumulators, 2 B vectors, 1 broadcast of 16
//! registers) and 6 x 64 on AVX-512 (24 accumulators, 4 B vectors, 1 broadcast of 32: per B row
//! loaded, twice the FMAs of 6 x 32, which measured 7-8% faster on a whole Gated DeltaNet
//! prefill).
//!
//! [`gemm_bf16_pairs`] is the same tile over bf16 operands on a CPU with a bf16 dot product
//! ([`Simd::dot_bf16_pairs`]): `A` row-major in pairs along the sum, `B` packed as pairs
//! `[p/2][n][2]` ([`pack_bf16_pairs_transposed`]) — the "VNNI" layout AMX's `tdpbf16ps` also takes
//! for its B tiles, so an AMX tile kernel can be added behind the same packed operands.

use crate::kernels::simd::Simd;

const MR: usize = 6;

/// What C holds before the product is added to it.
#[derive(Clone, Copy)]
pub enum Start {
    /// `C = A B`.
    Zero,
    /// `C += A B`.
    C,
    /// `C = diag(d) C + A B`, `d[i]` the factor of row `i`: a state's decay applied as the tile
    /// loads its rows, rather than in a pass of its own over C.
    DecayedC(*const f32),
}

impl Start {
    /// The start of the rows from `i` on.
    fn at_row(self, i: usize) -> Start {
        match self {
            Start::DecayedC(d) => Start::DecayedC(d.wrapping_add(i)),
            s => s,
        }
    }
}

/// `A` element `(i, l)` lives at `ptr + i * row_stride + l * col_stride`.
#[derive(Clone, Copy)]
pub struct MatA {
    pub ptr: *const f32,
    pub row_stride: usize,
    pub col_stride: usize,
}

/// `C[m x n] = start + A[m x p] B[p x n]` (see [`Start`]). With `lower`, `A[i][l]` is zero for
/// `l > i` and those products are skipped (the zeros must still be stored for `l < p`).
///
/// # Safety
/// Every addressed element of A (`i < m`, `l < p`), B (`l < p`, `j < n`, row stride `ldb`) and
/// C (`i < m`, `j < n`, row stride `ldc`) must be valid, and with [`Start::DecayedC`] its `m`
/// factors; C must not overlap A or B.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm<S: Simd>(
    m: usize,
    n: usize,
    p: usize,
    a: MatA,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    start: Start,
    lower: bool,
) {
    unsafe { product::<S, false>(m, n, p, a, b, ldb, c, ldc, start, lower) }
}

/// `C[m x n] = start + A B` over bf16 operands: `a` holds the rows of `A` as `pairs` pairs of
/// bf16 (`u32`, lower half first) a row, `lda` pairs apart; `b` holds `B` packed as
/// [`pack_bf16_pairs_transposed`] leaves it, `ldb` pairs apart. Each pair step is one
/// [`Simd::dot_bf16_pairs`]: exact products of normal values, f32 sums, bf16 denormal inputs
/// and f32 denormal sums as zero. Whole vectors only: the columns from `n` up to the next
/// multiple of `S::LANES` are computed too (from whatever B holds there), so no column is left
/// to scalar code that would round differently.
///
/// # Safety
/// `S::BF16_DOT`; with `nv = n.next_multiple_of(S::LANES)`, every addressed pair of `a` (`i < m`,
/// `l < pairs`) and `b` (`l < pairs`, `j < nv`) and C's elements `(i, j < nv)` (row stride `ldc`,
/// `Start` as for [`gemm`]) must be valid, C not overlapping A or B.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_bf16_pairs<S: Simd>(
    m: usize,
    n: usize,
    pairs: usize,
    (a, lda): (*const u32, usize),
    (b, ldb): (*const u32, usize),
    c: *mut f32,
    ldc: usize,
    start: Start,
) {
    debug_assert!(S::BF16_DOT);
    let a = MatA {
        ptr: a.cast(),
        row_stride: lda,
        col_stride: 1,
    };
    let n = n.next_multiple_of(S::LANES);
    unsafe { product::<S, true>(m, n, pairs, a, b.cast(), ldb, c, ldc, start, false) }
}

/// [`gemm`] (`DOT` false: f32 FMA) or [`gemm_bf16_pairs`] (`DOT`: the elements of A and B are
/// bf16 pairs carried as f32 bits, never used as numbers).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn product<S: Simd, const DOT: bool>(
    m: usize,
    n: usize,
    p: usize,
    a: MatA,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    start: Start,
    lower: bool,
) {
    let lanes = S::LANES;
    // Vectors per column panel (a constant of `S`: the branches fold away).
    let nv = if S::MANY_VECTORS { 4 } else { 2 };
    let mut j = 0;
    unsafe {
        while j + nv * lanes <= n {
            let (b_j, c_j) = (b.add(j), c.add(j));
            match S::MANY_VECTORS {
                true => rows::<S, 4, DOT>(m, p, a, b_j, ldb, c_j, ldc, start, lower),
                false => rows::<S, 2, DOT>(m, p, a, b_j, ldb, c_j, ldc, start, lower),
            }
            j += nv * lanes;
        }
        if nv > 2 && j + 2 * lanes <= n {
            // E.g. the 32- and 48-column bands of k k^T and q k^T: a 1-vector panel issues 7 loads
            // (1 B vector, 6 broadcasts) per 6 FMAs, bound by the loads.
            rows::<S, 2, DOT>(m, p, a, b.add(j), ldb, c.add(j), ldc, start, lower);
            j += 2 * lanes;
        }
        while j + lanes <= n {
            rows::<S, 1, DOT>(m, p, a, b.add(j), ldb, c.add(j), ldc, start, lower);
            j += lanes;
        }
        if j < n {
            debug_assert!(!DOT, "gemm_bf16_pairs runs whole vectors");
            scalar_columns(m, n - j, p, a, b.add(j), ldb, c.add(j), ldc, start);
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<S: Simd, const NV: usize, const DOT: bool>(
    m: usize,
    p: usize,
    a: MatA,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    start: Start,
    lower: bool,
) {
    let mut i = 0;
    while i < m {
        let mr = MR.min(m - i);
        let depth = if lower { p.min(i + mr) } else { p };
        let a_i = MatA {
            ptr: a.ptr.wrapping_add(i * a.row_stride),
            ..a
        };
        let (c_i, start_i) = (c.wrapping_add(i * ldc), start.at_row(i));
        unsafe {
            match mr {
                6 => tile::<S, 6, NV, DOT>(depth, a_i, b, ldb, c_i, ldc, start_i),
                5 => tile::<S, 5, NV, DOT>(depth, a_i, b, ldb, c_i, ldc, start_i),
                4 => tile::<S, 4, NV, DOT>(depth, a_i, b, ldb, c_i, ldc, start_i),
                3 => tile::<S, 3, NV, DOT>(depth, a_i, b, ldb, c_i, ldc, start_i),
                2 => tile::<S, 2, NV, DOT>(depth, a_i, b, ldb, c_i, ldc, start_i),
                _ => tile::<S, 1, NV, DOT>(depth, a_i, b, ldb, c_i, ldc, start_i),
            }
        }
        i += mr;
    }
}

/// One `R x NV*LANES` block of C over `depth` terms, accumulators in registers.
#[inline(always)]
unsafe fn tile<S: Simd, const R: usize, const NV: usize, const DOT: bool>(
    depth: usize,
    a: MatA,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    start: Start,
) {
    let lanes = S::LANES;
    unsafe {
        let mut acc = [[S::zero(); NV]; R];
        if let Start::C | Start::DecayedC(_) = start {
            for (r, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = S::load_f32(c.add(r * ldc + v * lanes));
                    if let Start::DecayedC(d) = start {
                        *x = S::mul(*x, S::splat(*d.add(r)));
                    }
                }
            }
        }
        let mut ap = a.ptr;
        let mut bp = b;
        for _ in 0..depth {
            let mut bv = [S::zero(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = S::load_f32(bp.add(v * lanes));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av = S::splat(*ap.add(r * a.row_stride));
                for (v, x) in row.iter_mut().enumerate() {
                    *x = match DOT {
                        true => S::dot_bf16_pairs(*x, av, bv[v]),
                        false => S::fma(av, bv[v], *x),
                    };
                }
            }
            ap = ap.add(a.col_stride);
            bp = bp.add(ldb);
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, x) in row.iter().enumerate() {
                S::store_f32(c.add(r * ldc + v * lanes), *x);
            }
        }
    }
}

/// The last `n < LANES` columns, one dot product each.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scalar_columns(
    m: usize,
    n: usize,
    p: usize,
    a: MatA,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    start: Start,
) {
    for i in 0..m {
        for j in 0..n {
            unsafe {
                let mut s = match start {
                    Start::Zero => 0.0,
                    Start::C => *c.add(i * ldc + j),
                    Start::DecayedC(d) => *c.add(i * ldc + j) * *d.add(i),
                };
                for l in 0..p {
                    s = (*a.ptr.add(i * a.row_stride + l * a.col_stride))
                        .mul_add(*b.add(l * ldb + j), s);
                }
                *c.add(i * ldc + j) = s;
            }
        }
    }
}

/// Packs rows of bf16 (`rows` rows of `len` values, element `(i, l)` at `src + i * row_stride +
/// l * col_stride`) as pairs along each row: `dst[i * ld + l / 2]` holds values `l` and `l + 1`
/// (lower half first), a missing last value zero. For the `A` operand of [`gemm_bf16_pairs`].
///
/// # Safety
/// Every addressed source element and `dst[i * ld + l]` for `i < rows`, `l < len.div_ceil(2)`.
pub unsafe fn pack_bf16_pairs(
    src: *const u16,
    strides: (usize, usize),
    rows: usize,
    len: usize,
    dst: *mut u32,
    ld: usize,
) {
    unsafe { pack_pairs(src, strides, (rows, len), dst, (ld, 1)) }
}

/// Packs the transpose of rows of bf16 (as [`pack_bf16_pairs`] reads them) for the `B` operand
/// of [`gemm_bf16_pairs`]: `dst[(l / 2) * ld + i]` holds values `l` and `l + 1` of row `i`, so
/// `B = rows^T` (`len x rows`) in pairs along its `len` rows.
///
/// # Safety
/// Every addressed source element and `dst[l * ld + i]` for `i < rows`, `l < len.div_ceil(2)`.
pub unsafe fn pack_bf16_pairs_transposed(
    src: *const u16,
    strides: (usize, usize),
    rows: usize,
    len: usize,
    dst: *mut u32,
    ld: usize,
) {
    unsafe { pack_pairs(src, strides, (rows, len), dst, (1, ld)) }
}

/// Pair `l / 2` of row `i` to `dst[i * steps.0 + (l / 2) * steps.1]`.
#[inline(always)]
unsafe fn pack_pairs(
    src: *const u16,
    (row_stride, col_stride): (usize, usize),
    (rows, len): (usize, usize),
    dst: *mut u32,
    steps: (usize, usize),
) {
    for i in 0..rows {
        for l in 0..len.div_ceil(2) {
            unsafe {
                let at = |e: usize| match e < len {
                    true => u32::from(*src.add(i * row_stride + e * col_stride)),
                    false => 0,
                };
                *dst.add(i * steps.0 + l * steps.1) = at(2 * l) | at(2 * l + 1) << 16;
            }
        }
    }
}
