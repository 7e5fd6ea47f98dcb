//! Vector kernels: channels in SIMD lanes, tokens in row order. One generic body over [`Simd`],
//! instantiated per ISA by the `#[target_feature]` entry points at the bottom.
//!
//! A task (token group × channel block) first widens its block of weights and bias to f32 once,
//! then walks each piece token by token, all channel vectors of a row before the next row. The
//! window of a token is re-read from the `W` rows of `x` ending at it (the older ones are still in
//! L1), so memory is read row after row: a vertical walk down one channel vector would touch one
//! line per row, rows `D` elements apart, which all fall into the same cache sets when `D` is a
//! power of two. Tokens of a sequence's first `W-1` positions take their older inputs from the
//! state (or zeros). Channels past the last full vector take a scalar path with the same operation
//! order. Only after all of a piece's outputs are stored does the task holding a sequence's first
//! piece write its new state.

use half::{bf16, f16};

use super::reference::output as scalar_output;
use super::{CHANNEL_BLOCK, Piece, Plan, Problem, Seq, StateUpdate};
use crate::dtype::DType;
use crate::kernels::simd::{Avx2, Avx512, Simd, SimdElement};

/// Widest vector supported (AVX-512, f32 lanes).
const MAX_LANES: usize = 16;
/// Rows ahead that the row loop prefetches. Rows are `D` elements apart, so each row's block of
/// channels sits in another page where the hardware prefetchers would start cold.
const PREFETCH_ROWS: usize = 4;

/// How the conv reads its input rows and stores its output rows: plain `x`/`out` here; a fused
/// caller (e.g. LFM2's `C * conv(B * x)`) supplies another implementation to transform the input
/// before the conv and the output after it without another pass over memory. Rows have contiguous
/// channels. Input values must be exactly representable in the activation dtype, since they are
/// also what the state stores.
pub trait RowIo: Sync {
    /// The conv input is `x` itself, bit for bit, so a state of x's dtype may copy it raw.
    const RAW_INPUT: bool = false;
    /// Input lanes of channels `c..c+LANES` of the token row starting at `row`.
    unsafe fn load<S: Simd, A: SimdElement>(&self, row: *const A, c: usize) -> S::V;
    /// Input of channel `c` of the row starting at `row`.
    unsafe fn load1<A: SimdElement>(&self, row: *const A, c: usize) -> f32;
    /// Stores conv outputs `v` for channels `c..c+LANES` of the output row `out`; `row` is the
    /// same token's input row.
    unsafe fn store<S: Simd, A: SimdElement>(&self, out: *mut A, row: *const A, c: usize, v: S::V);
    /// Stores the output of channel `c`.
    unsafe fn store1<A: SimdElement>(&self, out: *mut A, row: *const A, c: usize, v: f32);
    /// Hints that the input of channel `c` of row `row` will be loaded soon.
    #[inline(always)]
    unsafe fn prefetch<A: SimdElement>(&self, row: *const A, c: usize) {
        prefetch(row.wrapping_add(c));
    }
}

/// Asks for the cache line holding `p` (never faults; a hint only).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    // SAFETY: prefetch is SSE (baseline on x86_64) and does not access memory architecturally.
    unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast()) }
}

/// The plain conv: input = x, output = the conv's result.
pub struct Plain;

impl RowIo for Plain {
    const RAW_INPUT: bool = true;
    #[inline(always)]
    unsafe fn load<S: Simd, A: SimdElement>(&self, row: *const A, c: usize) -> S::V {
        unsafe { A::load::<S>(row.add(c)) }
    }
    #[inline(always)]
    unsafe fn load1<A: SimdElement>(&self, row: *const A, c: usize) -> f32 {
        unsafe { row.add(c).read().to_f32() }
    }
    #[inline(always)]
    unsafe fn store<S: Simd, A: SimdElement>(
        &self,
        out: *mut A,
        _row: *const A,
        c: usize,
        v: S::V,
    ) {
        unsafe { A::store::<S>(out.add(c), v) }
    }
    #[inline(always)]
    unsafe fn store1<A: SimdElement>(&self, out: *mut A, _row: *const A, c: usize, v: f32) {
        unsafe { out.add(c).write(A::from_f32(v)) }
    }
}

/// ShortConv's gates around the conv: input `round(B * x)`, output `round(C * round(y))`, where B
/// and C are `b_back` and `c_back` elements before x in the same bcx row.
pub struct Gated {
    pub b_back: usize,
    pub c_back: usize,
}

/// Lanes rounded to the precision of `A` (identity for f32): what storing them in `A` keeps.
#[inline(always)]
unsafe fn round_lanes<S: Simd, A: SimdElement>(v: S::V) -> S::V {
    if A::DTYPE == DType::F32 {
        return v;
    }
    let mut tmp = [A::from_f32(0.0); MAX_LANES];
    unsafe {
        A::store::<S>(tmp.as_mut_ptr(), v);
        A::load::<S>(tmp.as_ptr())
    }
}

impl RowIo for Gated {
    #[inline(always)]
    unsafe fn load<S: Simd, A: SimdElement>(&self, row: *const A, c: usize) -> S::V {
        unsafe {
            let x = A::load::<S>(row.add(c));
            let b = A::load::<S>(row.add(c).wrapping_sub(self.b_back));
            round_lanes::<S, A>(S::mul(b, x))
        }
    }
    #[inline(always)]
    unsafe fn load1<A: SimdElement>(&self, row: *const A, c: usize) -> f32 {
        unsafe {
            let x = row.add(c).read().to_f32();
            let b = row.add(c).wrapping_sub(self.b_back).read().to_f32();
            A::from_f32(b * x).to_f32()
        }
    }
    #[inline(always)]
    unsafe fn store<S: Simd, A: SimdElement>(&self, out: *mut A, row: *const A, c: usize, v: S::V) {
        unsafe {
            let gate = A::load::<S>(row.add(c).wrapping_sub(self.c_back));
            A::store::<S>(out.add(c), S::mul(gate, round_lanes::<S, A>(v)))
        }
    }
    #[inline(always)]
    unsafe fn store1<A: SimdElement>(&self, out: *mut A, row: *const A, c: usize, v: f32) {
        unsafe {
            let gate = row.add(c).wrapping_sub(self.c_back).read().to_f32();
            out.add(c)
                .write(A::from_f32(gate * A::from_f32(v).to_f32()))
        }
    }
}

/// The row transform of a problem: plain, or ShortConv's gates.
fn gated(p: &Problem) -> Gated {
    let g = p.gates.expect("gated task on an ungated problem");
    Gated {
        b_back: g.b_back,
        c_back: g.c_back,
    }
}

/// `x / (1 + e^-x)` with `e^-x` from a Taylor polynomial of `degree` around the nearest multiple
/// of ln 2 (`|r| <= ln2/2`, truncation error `(ln2/2)^(degree+1) / (degree+1)!`). The output dtype
/// picks the degree: its rounding dominates anyway, and silu is most of the kernel's arithmetic.
#[inline(always)]
unsafe fn silu<S: Simd, A: SimdElement>(x: S::V) -> S::V {
    const TAYLOR: [f32; 7] = [
        1.0,
        1.0,
        1.0 / 2.0,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
    ];
    let degree = match A::DTYPE {
        DType::BF16 => 4, // error 4e-5 against a half-unit of 2e-3
        DType::F16 => 5,  // 2.4e-6 against 2.4e-4
        _ => 6,           // 1.2e-7
    };
    unsafe {
        // e^y, y = -x clamped so 2^n stays a finite normal number (n in -126..=127).
        let y = S::min(
            S::max(S::sub(S::zero(), x), S::splat(-87.3)),
            S::splat(88.3),
        );
        let n = S::round(S::mul(y, S::splat(std::f32::consts::LOG2_E)));
        // Cody–Waite: ln 2 = 0.693359375 - 2.12194440e-4, the first part exact in few bits.
        let r = S::fma(n, S::splat(-0.693_359_4), y);
        let r = S::fma(n, S::splat(2.121_944_4e-4), r);
        let mut poly = S::splat(TAYLOR[degree]);
        for &c in TAYLOR[..degree].iter().rev() {
            poly = S::fma(poly, r, S::splat(c));
        }
        let e = S::mul(poly, S::pow2i(n));
        S::div(x, S::add(S::splat(1.0), e))
    }
}

/// `LANES` elements `stride` apart, as f32 lanes.
#[inline(always)]
unsafe fn load_lanes<S: Simd, E: SimdElement>(p: *const E, stride: usize) -> S::V {
    unsafe {
        if stride == 1 {
            return E::load::<S>(p);
        }
        let mut tmp = [0f32; MAX_LANES];
        for (l, v) in tmp.iter_mut().enumerate().take(S::LANES) {
            *v = p.add(l * stride).read().to_f32();
        }
        S::load_f32(tmp.as_ptr())
    }
}

/// Stores f32 lanes to `LANES` elements `stride` apart (rounded to nearest-even).
#[inline(always)]
unsafe fn store_lanes<S: Simd, E: SimdElement>(p: *mut E, stride: usize, v: S::V) {
    unsafe {
        if stride == 1 {
            return E::store::<S>(p, v);
        }
        let mut tmp = [0f32; MAX_LANES];
        S::store_f32(tmp.as_mut_ptr(), v);
        for (l, x) in tmp.iter().enumerate().take(S::LANES) {
            p.add(l * stride).write(E::from_f32(*x));
        }
    }
}

/// One task: token group `i / channel_blocks`, channel block `i % channel_blocks`.
#[inline(always)]
pub unsafe fn task<S: Simd, Io: RowIo>(p: &Problem, plan: &Plan, i: usize, io: &Io) {
    const { assert!(S::LANES <= MAX_LANES && CHANNEL_BLOCK.is_multiple_of(S::LANES)) };
    let (g, cb) = (i / plan.channel_blocks, i % plan.channel_blocks);
    let pieces = &plan.pieces[plan.groups[g].clone()];
    let c0 = cb * CHANNEL_BLOCK;
    let cn = CHANNEL_BLOCK.min(p.channels - c0);
    macro_rules! go {
        ($A:ty, $St:ty) => {
            match p.width {
                2 => block::<S, $A, $St, Io, 2>(p, pieces, c0, cn, io),
                3 => block::<S, $A, $St, Io, 3>(p, pieces, c0, cn, io),
                4 => block::<S, $A, $St, Io, 4>(p, pieces, c0, cn, io),
                5 => block::<S, $A, $St, Io, 5>(p, pieces, c0, cn, io),
                6 => block::<S, $A, $St, Io, 6>(p, pieces, c0, cn, io),
                7 => block::<S, $A, $St, Io, 7>(p, pieces, c0, cn, io),
                8 => block::<S, $A, $St, Io, 8>(p, pieces, c0, cn, io),
                w => unreachable!("validated width {w}"),
            }
        };
    }
    unsafe {
        match (p.act, p.state_dtype) {
            (DType::F32, _) => go!(f32, f32),
            (DType::BF16, DType::F32) => go!(bf16, f32),
            (DType::BF16, _) => go!(bf16, bf16),
            (DType::F16, DType::F32) => go!(f16, f32),
            (DType::F16, _) => go!(f16, f16),
            (a, s) => unreachable!("validated dtypes {a:?}/{s:?}"),
        }
    }
}

/// Channels `c0..c0+cn` of every piece of a token group.
#[inline(always)]
unsafe fn block<S: Simd, A: SimdElement, St: SimdElement, Io: RowIo, const W: usize>(
    p: &Problem,
    pieces: &[Piece],
    c0: usize,
    cn: usize,
    io: &Io,
) {
    // Weights as [tap][channel] f32 and the bias, widened once per task.
    let mut weight = [[0f32; CHANNEL_BLOCK]; W];
    let mut bias = [0f32; CHANNEL_BLOCK];
    for j in 0..cn {
        for (k, row) in weight.iter_mut().enumerate() {
            row[j] = unsafe { p.weight.get(c0 + j, k) };
        }
        bias[j] = p.bias.map_or(0.0, |m| unsafe { m.get(c0 + j, 0) });
    }
    let vec_end = cn / S::LANES * S::LANES;
    for (i, pc) in pieces.iter().enumerate() {
        let s = &p.seqs[pc.seq];
        // The next sequence start in this group, whose first rows the passes prefetch.
        let next_seq = pieces
            .get(i + 1)
            .filter(|n| n.t0 == 0)
            .map(|n| &p.seqs[n.seq])
            .filter(|n| !n.pad && n.len > 0);
        let (x, out) = (s.x.cast::<A>(), s.out.cast::<A>());
        if s.pad {
            unsafe { zero_rows::<S, A>(p, out, pc.t0..pc.t1, c0, cn) };
            continue;
        }
        let line = 64 / size_of::<A>();
        // Tokens whose window reaches into the history exist only at a sequence start.
        let fast_from = pc.t0.max(W - 1).min(pc.t1);
        for t in pc.t0..fast_from {
            let (xrow, orow) = unsafe { (x.add(t * p.x_tok), out.add(t * p.out_tok)) };
            let rel = |k: usize| t as isize + k as isize - (W as isize - 1);
            for v in (0..vec_end).step_by(S::LANES) {
                let c = c0 + v;
                unsafe {
                    if let (0, Some(next)) = (v % line, next_seq) {
                        prefetch_start::<A, St, Io>(p, next, c, io);
                    }
                    let mut acc = S::load_f32(bias.as_ptr().add(v));
                    for (k, wk) in weight.iter().enumerate() {
                        let xin = input::<S, A, St, Io>(p, s, rel(k), c, io);
                        acc = S::fma(S::load_f32(wk.as_ptr().add(v)), xin, acc);
                    }
                    if p.silu {
                        acc = silu::<S, A>(acc);
                    }
                    io.store::<S, A>(orow, xrow, c, acc);
                }
            }
            for j in vec_end..cn {
                let c = c0 + j;
                let taps: [f32; W] = std::array::from_fn(|k| weight[k][j]);
                let win: [f32; W] =
                    std::array::from_fn(|k| unsafe { input1::<A, St, Io>(p, s, rel(k), c, io) });
                unsafe {
                    io.store1::<A>(orow, xrow, c, scalar_output(&taps, &win, bias[j], p.silu))
                };
            }
        }
        for t in fast_from..pc.t1 {
            // Rows t-W+1 ..= t: all this sequence's own tokens; the older ones are still in L1.
            let rows: [*const A; W] =
                std::array::from_fn(|k| unsafe { x.add((t + k + 1 - W) * p.x_tok) });
            let orow = unsafe { out.add(t * p.out_tok) };
            let ahead = t + PREFETCH_ROWS;
            // Only dereferenced (as a prefetch hint) while `ahead` is inside the piece.
            let (pf_x, pf_out) = (
                x.wrapping_add(ahead * p.x_tok),
                out.wrapping_add(ahead * p.out_tok),
            );
            let prefetch_on = ahead < pc.t1;
            let mut v = 0;
            // Two vectors per step while they fit: silu's constants and the loop are shared.
            while v + 2 * S::LANES <= vec_end {
                unsafe {
                    row_vectors::<S, A, Io, W, 2>(
                        io,
                        &rows,
                        orow,
                        &weight,
                        &bias,
                        v,
                        c0,
                        line,
                        p.silu,
                        prefetch_on,
                        pf_x,
                        pf_out,
                    )
                };
                v += 2 * S::LANES;
            }
            if v < vec_end {
                unsafe {
                    row_vectors::<S, A, Io, W, 1>(
                        io,
                        &rows,
                        orow,
                        &weight,
                        &bias,
                        v,
                        c0,
                        line,
                        p.silu,
                        prefetch_on,
                        pf_x,
                        pf_out,
                    )
                };
            }
            for j in vec_end..cn {
                let c = c0 + j;
                let taps: [f32; W] = std::array::from_fn(|k| weight[k][j]);
                let win: [f32; W] = std::array::from_fn(|k| unsafe { io.load1::<A>(rows[k], c) });
                unsafe {
                    io.store1::<A>(
                        orow,
                        rows[W - 1],
                        c,
                        scalar_output(&taps, &win, bias[j], p.silu),
                    )
                };
            }
        }
        if let (0, Some(state)) = (pc.t0, s.state) {
            unsafe { write_state::<S, A, St, Io>(p, s, state.cast::<St>(), c0, cn, io) };
        }
    }
}

/// Outputs of one row for `N` consecutive channel vectors starting at block offset `v`, from the
/// `W` input rows ending at this token; prefetches the row `PREFETCH_ROWS` ahead at line starts.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn row_vectors<S: Simd, A: SimdElement, Io: RowIo, const W: usize, const N: usize>(
    io: &Io,
    rows: &[*const A; W],
    orow: *mut A,
    weight: &[[f32; CHANNEL_BLOCK]; W],
    bias: &[f32; CHANNEL_BLOCK],
    v: usize,
    c0: usize,
    line: usize,
    use_silu: bool,
    prefetch_on: bool,
    pf_x: *const A,
    pf_out: *mut A,
) {
    unsafe {
        for u in 0..N {
            let vu = v + u * S::LANES;
            if prefetch_on && vu.is_multiple_of(line) {
                io.prefetch::<A>(pf_x, c0 + vu);
                prefetch(pf_out.wrapping_add(c0 + vu));
            }
        }
        let mut acc: [S::V; N] =
            std::array::from_fn(|u| S::load_f32(bias.as_ptr().add(v + u * S::LANES)));
        for k in 0..W {
            for (u, a) in acc.iter_mut().enumerate() {
                let vu = v + u * S::LANES;
                *a = S::fma(
                    S::load_f32(weight[k].as_ptr().add(vu)),
                    io.load::<S, A>(rows[k], c0 + vu),
                    *a,
                );
            }
        }
        if use_silu {
            for a in acc.iter_mut() {
                *a = silu::<S, A>(*a);
            }
        }
        for (u, a) in acc.iter().enumerate() {
            io.store::<S, A>(orow, rows[W - 1], c0 + v + u * S::LANES, *a);
        }
    }
}

/// Prefetches, at channel `c`, the rows a sequence's first pass reads and writes first: its
/// first input and output rows and its history rows in the state.
#[inline(always)]
unsafe fn prefetch_start<A: SimdElement, St: SimdElement, Io: RowIo>(
    p: &Problem,
    s: &Seq,
    c: usize,
    io: &Io,
) {
    unsafe { io.prefetch::<A>(s.x.cast::<A>(), c) };
    prefetch(s.out.cast::<A>().wrapping_add(c));
    if let (Some(st), true) = (s.state, s.read_state) {
        let first = first_history_row(s);
        for j in 0..p.width - 1 {
            prefetch(
                st.cast::<St>()
                    .wrapping_add((first + j) * p.state_row + c * p.state_ch),
            );
        }
    }
}

/// Row of the slot holding history entry 0 (relative time `-(W-1)`).
#[inline(always)]
fn first_history_row(s: &Seq) -> usize {
    match s.update {
        StateUpdate::Append => 0,
        StateUpdate::Rolling { accepted } => accepted - 1,
    }
}

/// Input at relative time `rel` of the sequence for channels `c..c+LANES`: x for `rel >= 0`, else
/// the history (state rows, or zeros).
#[inline(always)]
unsafe fn input<S: Simd, A: SimdElement, St: SimdElement, Io: RowIo>(
    p: &Problem,
    s: &Seq,
    rel: isize,
    c: usize,
    io: &Io,
) -> S::V {
    unsafe {
        if rel >= 0 {
            return io.load::<S, A>(s.x.cast::<A>().add(rel as usize * p.x_tok), c);
        }
        match (s.state, s.read_state) {
            (Some(st), true) => {
                let row = (first_history_row(s) + p.width - 1).wrapping_add_signed(rel);
                load_lanes::<S, St>(
                    st.cast::<St>().add(row * p.state_row + c * p.state_ch),
                    p.state_ch,
                )
            }
            _ => S::zero(),
        }
    }
}

/// Scalar [`input`] for one channel.
#[inline(always)]
unsafe fn input1<A: SimdElement, St: SimdElement, Io: RowIo>(
    p: &Problem,
    s: &Seq,
    rel: isize,
    c: usize,
    io: &Io,
) -> f32 {
    unsafe {
        if rel >= 0 {
            return io.load1::<A>(s.x.cast::<A>().add(rel as usize * p.x_tok), c);
        }
        match (s.state, s.read_state) {
            (Some(st), true) => {
                let row = (first_history_row(s) + p.width - 1).wrapping_add_signed(rel);
                st.cast::<St>()
                    .add(row * p.state_row + c * p.state_ch)
                    .read()
                    .to_f32()
            }
            _ => 0.0,
        }
    }
}

/// Output rows `rows` of a padded sequence become zeros.
#[inline(always)]
unsafe fn zero_rows<S: Simd, A: SimdElement>(
    p: &Problem,
    out: *mut A,
    rows: std::ops::Range<usize>,
    c0: usize,
    cn: usize,
) {
    let vec_end = cn / S::LANES * S::LANES;
    for t in rows {
        unsafe {
            let row = out.add(t * p.out_tok + c0);
            for v in (0..vec_end).step_by(S::LANES) {
                A::store::<S>(row.add(v), S::zero());
            }
            for j in vec_end..cn {
                row.add(j).write(A::from_f32(0.0));
            }
        }
    }
}

/// Copies state row `from` to row `to` for channels `c0..c0+cn` (elements as they are).
#[inline(always)]
unsafe fn copy_row<St: Copy>(
    p: &Problem,
    st: *mut St,
    from: usize,
    to: usize,
    c0: usize,
    cn: usize,
) {
    unsafe {
        let (src, dst) = (
            st.add(from * p.state_row + c0 * p.state_ch),
            st.add(to * p.state_row + c0 * p.state_ch),
        );
        if p.state_ch == 1 {
            std::ptr::copy(src, dst, cn);
        } else {
            for j in 0..cn {
                dst.add(j * p.state_ch)
                    .write(src.add(j * p.state_ch).read());
            }
        }
    }
}

/// Writes input row `row` of the sequence (channels `c0..c0+cn`) into state row `to`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn input_to_row<S: Simd, A: SimdElement, St: SimdElement, Io: RowIo>(
    p: &Problem,
    s: &Seq,
    st: *mut St,
    row: usize,
    to: usize,
    c0: usize,
    cn: usize,
    io: &Io,
) {
    let vec_end = cn / S::LANES * S::LANES;
    unsafe {
        let xr = s.x.cast::<A>().add(row * p.x_tok);
        let dst = st.add(to * p.state_row + c0 * p.state_ch);
        if Io::RAW_INPUT && A::DTYPE == St::DTYPE && p.state_ch == 1 {
            // Same dtype: the state keeps x's bits (x rows have contiguous channels here).
            return std::ptr::copy_nonoverlapping(xr.add(c0).cast::<St>(), dst, cn);
        }
        for v in (0..vec_end).step_by(S::LANES) {
            store_lanes::<S, St>(
                dst.add(v * p.state_ch),
                p.state_ch,
                io.load::<S, A>(xr, c0 + v),
            );
        }
        for j in vec_end..cn {
            dst.add(j * p.state_ch)
                .write(St::from_f32(io.load1::<A>(xr, c0 + j)));
        }
    }
}

/// The sequence's new state for channels `c0..c0+cn`, after all its outputs have been stored.
#[inline(always)]
unsafe fn write_state<S: Simd, A: SimdElement, St: SimdElement, Io: RowIo>(
    p: &Problem,
    s: &Seq,
    st: *mut St,
    c0: usize,
    cn: usize,
    io: &Io,
) {
    let w = p.width;
    unsafe {
        match s.update {
            StateUpdate::Append => {
                // Row j := input at relative time len - (W-1) + j. Ascending j only reads rows
                // above the ones already written.
                for j in 0..w - 1 {
                    if s.len + j >= w - 1 {
                        input_to_row::<S, A, St, Io>(p, s, st, s.len + j - (w - 1), j, c0, cn, io);
                    } else if !s.read_state {
                        let dst = st.add(j * p.state_row + c0 * p.state_ch);
                        for jj in 0..cn {
                            dst.add(jj * p.state_ch).write(St::from_f32(0.0));
                        }
                    } else if s.len > 0 {
                        copy_row(p, st, s.len + j, j, c0, cn);
                    }
                }
            }
            StateUpdate::Rolling { accepted } => {
                let keep = p.state_rows - s.len;
                for r in 0..keep {
                    copy_row(p, st, r + accepted, r, c0, cn);
                }
                for q in 0..s.len {
                    input_to_row::<S, A, St, Io>(p, s, st, q, keep + q, c0, cn, io);
                }
            }
        }
    }
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `p` is validated and `i < plan.tasks()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn task_avx2(p: &Problem, plan: &Plan, i: usize) {
    unsafe { task::<Avx2, Plain>(p, plan, i, &Plain) }
}

/// # Safety
/// As for [`task_avx2`], with AVX-512 F/BW/VL/DQ.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub unsafe fn task_avx512(p: &Problem, plan: &Plan, i: usize) {
    unsafe { task::<Avx512, Plain>(p, plan, i, &Plain) }
}

/// [`task_avx2`] for ShortConv (`p.gates` is set).
///
/// # Safety
/// As for [`task_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn task_gated_avx2(p: &Problem, plan: &Plan, i: usize) {
    unsafe { task::<Avx2, Gated>(p, plan, i, &gated(p)) }
}

/// [`task_avx512`] for ShortConv (`p.gates` is set).
///
/// # Safety
/// As for [`task_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub unsafe fn task_gated_avx512(p: &Problem, plan: &Plan, i: usize) {
    unsafe { task::<Avx512, Gated>(p, plan, i, &gated(p)) }
}
