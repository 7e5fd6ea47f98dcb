//! Vector kernels: channels in SIMD lanes, tokens in tiles of rows. One generic body over
//! [`Simd`], compiled per ISA, activation dtype and width class (3, 4, or any width read at run
//! time, see [`ANY_WIDTH`]) into separate `#[target_feature]` functions (`isa_block!`) that the
//! entry points at the bottom pick from.
//!
//! A task (token group × channel block) widens its block of weights and bias to f32 once, then
//! walks each piece in tiles of `TILE_ROWS` consecutive tokens (half as many when a vector takes
//! two registers, as bf16 does on AVX2: `Avx2Pairs`, channel pairs that widen and narrow without
//! cross-lane shuffles, with the taps laid out in its lane order). For each channel vector of a tile
//! it loads the `W-1+TILE_ROWS` inputs of the tile's windows once into registers and computes all
//! the tile's outputs from them, so an input is converted once per tile rather than once per tap,
//! and silu runs on `TILE_ROWS` independent vectors at a time (its dependency chain is long).
//! Rows are walked across the whole block before the next tile: blocks are thousands of channels
//! wide, so memory is read and written in long runs, which matters on machines where each new page
//! is expensive (a column walk touches one line per page). A window row before the sequence start
//! comes from the state (or is zero), the rest from `x`; the state is written only after all of a
//! piece's outputs are stored, by the task holding the sequence's first piece. Channels past the
//! last full vector take a scalar path with the same order of multiply-adds; NaN outputs are
//! stored as the default quiet NaN, since which NaN an operation passes on differs between the
//! two paths, and the task split decides which path a channel takes. ShortConv's gated
//! inputs are computed once: a tile keeps its last `W-1` for the next ([`KeptCursor`]).

use super::reference::output as scalar_output;
use super::{MAX_WIDTH, Piece, Plan, Problem, Seq, StateUpdate};
use crate::dtype::DType;
use crate::kernels::chunking::TaskBuffer;
use crate::kernels::simd::{Simd, SimdElement, array_of, canonical_nan};

/// Widest vector supported (AVX-512, f32 lanes).
pub(super) const MAX_LANES: usize = 16;
/// Tokens per tile: their windows share `W-1` inputs, and four silu chains keep the FMA units busy
/// while the window and accumulators still fit in sixteen registers.
const TILE_ROWS: usize = 4;
/// Lines ahead in each input row that a tile prefetches.
const PREFETCH_LINES: usize = 8;
/// Most window rows of a tile.
const MAX_WINDOW: usize = MAX_WIDTH - 1 + TILE_ROWS;

/// The width parameter `W` of the instance for rare widths (2 and 5..=8), which reads the width
/// from the problem at run time. The widths models use have their own instances (3: LFM2's
/// ShortConv; 4: Mamba-2's and Qwen3-Next's convs), whose tap and window loops unroll into
/// registers; an instance per rare width cost more compile time and code than all the rest of the
/// crate for calls no model makes.
pub(super) const ANY_WIDTH: usize = 0;

/// The conv width of the instance for `W`: `W` itself, or the problem's for [`ANY_WIDTH`].
#[inline(always)]
fn width<const W: usize>(p: &Problem) -> usize {
    match W {
        ANY_WIDTH => p.width,
        w => w,
    }
}

/// Whether history rows can be read as rows of x: the state holds x's bits in x's layout (and the
/// conv input is x itself).
#[inline(always)]
fn raw_history<A: SimdElement, Io: RowIo>(p: &Problem) -> bool {
    Io::RAW_INPUT && p.state_dtype == A::DTYPE && p.state_ch == 1
}

/// Whether the state holds f32 for 16-bit activations; else it holds x's dtype (validated). The
/// state's element type is no parameter of the block: only the code that reads or writes the
/// state (the first tiles of a sequence, and its new state) is compiled for both.
#[inline(always)]
fn wide_state<A: SimdElement>(p: &Problem) -> bool {
    A::DTYPE != DType::F32 && p.state_dtype == DType::F32
}

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
    crate::kernels::strided::prefetch_line::<false>(p.cast())
}

/// The plain conv: input = x, output = the conv's result.
pub struct Plain;

impl RowIo for Plain {
    const RAW_INPUT: bool = true;
    #[inline(always)]
    unsafe fn load<S: Simd, A: SimdElement>(&self, row: *const A, c: usize) -> S::V {
        unsafe { A::load::<S>(row.wrapping_add(c)) }
    }
    #[inline(always)]
    unsafe fn load1<A: SimdElement>(&self, row: *const A, c: usize) -> f32 {
        unsafe { row.wrapping_add(c).read().to_f32() }
    }
    #[inline(always)]
    unsafe fn store<S: Simd, A: SimdElement>(
        &self,
        out: *mut A,
        _row: *const A,
        c: usize,
        v: S::V,
    ) {
        unsafe { A::store::<S>(out.add(c), S::canonical_nan(v)) }
    }
    #[inline(always)]
    unsafe fn store1<A: SimdElement>(&self, out: *mut A, _row: *const A, c: usize, v: f32) {
        unsafe { out.add(c).write(A::from_f32(canonical_nan(v))) }
    }
}

/// ShortConv's gates around the conv: input `round(B * x)`, output `round(C * round(y))`, where B
/// and C are `b_back` and `c_back` elements before x in the same bcx row. The two products round
/// as products of the activation type (no NaN checks for bf16); `y` keeps the full rounding, since
/// f32 taps or states can give it a NaN with payload bits bf16 lacks.
pub struct Gated {
    pub b_back: usize,
    pub c_back: usize,
}

impl RowIo for Gated {
    #[inline(always)]
    unsafe fn load<S: Simd, A: SimdElement>(&self, row: *const A, c: usize) -> S::V {
        unsafe {
            let x = A::load::<S>(row.add(c));
            let b = A::load::<S>(row.add(c).wrapping_sub(self.b_back));
            A::round_product::<S>(S::mul(b, x))
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
            let y = S::mul(gate, A::round::<S>(v));
            A::store_product::<S>(out.add(c), S::canonical_nan(y))
        }
    }
    #[inline(always)]
    unsafe fn store1<A: SimdElement>(&self, out: *mut A, row: *const A, c: usize, v: f32) {
        unsafe {
            let gate = row.add(c).wrapping_sub(self.c_back).read().to_f32();
            let y = gate * A::from_f32(v).to_f32();
            out.add(c).write(A::from_f32(canonical_nan(y)))
        }
    }
    #[inline(always)]
    unsafe fn prefetch<A: SimdElement>(&self, row: *const A, c: usize) {
        prefetch(row.wrapping_add(c));
        prefetch(row.wrapping_add(c).wrapping_sub(self.b_back));
        prefetch(row.wrapping_add(c).wrapping_sub(self.c_back));
    }
}

/// The row transform of a problem: plain, or ShortConv's gates.
pub(super) fn gated(p: &Problem) -> Gated {
    let g = p.gates.expect("gated task on an ungated problem");
    Gated {
        b_back: g.b_back,
        c_back: g.c_back,
    }
}

/// Coefficients of minimax polynomials for `2^f` on `[-1/2, 1/2]`, constant term first; relative
/// error 2.6e-6 (degree 4) and 1.6e-8 (degree 6).
const EXP2_DEGREE4: [f32; 5] = [
    0.999_999_3,
    0.693_121_85,
    0.240_247_44,
    0.055_917_807,
    0.009_570_069,
];
const EXP2_DEGREE6: [f32; 7] = [
    1.0,
    std::f32::consts::LN_2,
    0.240_226_46,
    0.055_503_286,
    0.009_618_489,
    0.001_339_993,
    1.534_579_2e-4,
];

/// `x / (1 + e^-x)` for `R` independent vectors, each step applied to all of them before the next
/// so the long dependency chain of one vector overlaps the others'.
///
/// `e^-x = 2^(n + f)` with `n = round(-x log2 e)` (by the 1.5·2^23 rounding trick, which also leaves
/// the biased exponent `n + 127` in the low bits) and `f` in `[-1/2, 1/2]`. The polynomial's error
/// reaches silu's result scaled by `e^-x / (1 + e^-x)`: at most 7e-7 in absolute terms for a
/// 16-bit output (degree 4; a rounding to bf16 or f16 can flip only within that of a midpoint),
/// and about 3e-8 relative for f32 (degree 6). `x` is clamped so `2^n` runs from 2^-126 (x large:
/// silu(x) = x) to +inf (x below -88.7: silu(x) = -0, as with libm's `expf`).
#[inline(always)]
unsafe fn silu_rows<S: Simd, A: SimdElement, const R: usize>(acc: &mut [S::V; R]) {
    unsafe {
        let poly: &[f32] = match A::DTYPE {
            DType::F32 => &EXP2_DEGREE6,
            _ => &EXP2_DEGREE4,
        };
        let magic = S::splat(1.5 * 8_388_608.0 + 127.0);
        let neg_log2e = S::splat(-std::f32::consts::LOG2_E);
        let mut t = [S::zero(); R];
        let mut f = [S::zero(); R];
        for r in 0..R {
            let x = S::clamp(acc[r], -88.75, 87.0);
            t[r] = S::fma(x, neg_log2e, magic);
            let n = S::sub(t[r], magic);
            f[r] = S::fms(x, neg_log2e, n);
            if A::DTYPE == DType::F32 {
                // -log2(e) = -1.4426950 - 1.9259630e-8: the low part keeps f exact enough for f32.
                f[r] = S::fma(x, S::splat(-1.925_963e-8), f[r]);
            }
        }
        let mut p = [S::splat(poly[poly.len() - 1]); R];
        for &c in poly[..poly.len() - 1].iter().rev() {
            for r in 0..R {
                p[r] = S::fma(p[r], f[r], S::splat(c));
            }
        }
        for r in 0..R {
            let e = S::mul(p[r], S::exponent_from_low_bits(t[r]));
            acc[r] = S::div(acc[r], S::add(S::splat(1.0), e));
        }
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

/// The input rows of a tile's windows, row `k` holding relative time `t - (W-1) + k`.
trait Window: Copy {
    /// Lanes of channels `c..c+LANES` of row `k`.
    unsafe fn load<S: Simd, A: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> S::V;
    /// Channel `c` of row `k`.
    unsafe fn load1<A: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> f32;
    /// Called once the outputs of channels `c..c+n` are stored (nothing by default).
    #[inline(always)]
    unsafe fn stored(&self, _c: usize, _n: usize) {}
}

/// A decode's window (state rows `0..W-1`, then the token's row of x), which also appends the
/// token to the state channel by channel as soon as the output has read it: row `k` takes row
/// `k+1` while both are in L1, instead of a second pass over the state after the whole block.
#[derive(Clone, Copy)]
struct DecodeRows<A> {
    rows: Rows<A>,
    history: usize,
}

impl<A: SimdElement> Window for DecodeRows<A> {
    #[inline(always)]
    unsafe fn load<S: Simd, B: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> S::V {
        unsafe { self.rows.load::<S, B, Io>(k, io, c) }
    }
    #[inline(always)]
    unsafe fn load1<B: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> f32 {
        unsafe { self.rows.load1::<B, Io>(k, io, c) }
    }
    #[inline(always)]
    unsafe fn stored(&self, c: usize, n: usize) {
        for k in 0..self.history {
            let (from, to) = (self.rows.0[k + 1], self.rows.0[k].cast_mut());
            // SAFETY: rows 0..history are the slot's state rows, which this task owns.
            unsafe { std::ptr::copy_nonoverlapping(from.add(c), to.add(c), n) };
        }
    }
}

/// Whether `tokens` of `s` are a decode that [`DecodeRows`] appends to its state (x's bits kept in a
/// contiguous state of x's dtype), so [`write_state`] must not.
#[inline(always)]
fn appends_in_tile<A: SimdElement, Io: RowIo>(
    p: &Problem,
    s: &Seq,
    tokens: std::ops::Range<usize>,
) -> bool {
    Io::RAW_INPUT
        && p.state_dtype == A::DTYPE
        && p.state_ch == 1
        && (tokens.start, tokens.end, s.len) == (0, 1, 1)
        && s.read_state
        && s.state.is_some()
        && matches!(s.update, StateUpdate::Append)
}

/// Rows all read through the [`RowIo`], channel `c` at `row + c`: token rows, and history rows of
/// the state (or of zeros) when those hold the same values the [`RowIo`] returns.
#[derive(Clone, Copy)]
struct Rows<A>([*const A; MAX_WINDOW]);

impl<A: SimdElement> Window for Rows<A> {
    #[inline(always)]
    unsafe fn load<S: Simd, B: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> S::V {
        unsafe { io.load::<S, B>(self.0[k].cast::<B>(), c) }
    }
    #[inline(always)]
    unsafe fn load1<B: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> f32 {
        unsafe { io.load1::<B>(self.0[k].cast::<B>(), c) }
    }
}

/// Where one input row of a window comes from, in general.
#[derive(Clone, Copy)]
enum Source<St> {
    /// A token row of the sequence (read through the [`RowIo`]).
    Input(*const u8),
    /// A history row of the state slot (channel `c` at `c * state_ch`): already the conv input.
    State(*const St),
    /// History of a sequence without initial state.
    Zero,
}

/// Rows from anywhere: history rows of another dtype, a strided pool, or a gated input.
#[derive(Clone, Copy)]
struct Sources<St> {
    rows: [Source<St>; MAX_WINDOW],
    state_ch: usize,
}

impl<St: SimdElement> Window for Sources<St> {
    #[inline(always)]
    unsafe fn load<S: Simd, A: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> S::V {
        unsafe {
            match self.rows[k] {
                Source::Input(row) => io.load::<S, A>(row.cast::<A>(), c),
                Source::State(row) => {
                    load_lanes::<S, St>(row.add(c * self.state_ch), self.state_ch)
                }
                Source::Zero => S::zero(),
            }
        }
    }
    #[inline(always)]
    unsafe fn load1<A: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> f32 {
        unsafe {
            match self.rows[k] {
                Source::Input(row) => io.load1::<A>(row.cast::<A>(), c),
                Source::State(row) => row.add(c * self.state_ch).read().to_f32(),
                Source::Zero => 0.0,
            }
        }
    }
}

/// History rows from the state (contiguous channels, or gathered so) or zeros, then token rows
/// through the [`RowIo`]: the windows of decodes and of a sequence's first tiles whose state does
/// not hold x's bits in x's layout (a state of another dtype or of strided channels, or
/// ShortConv's gated input).
#[derive(Clone, Copy)]
struct Split<St> {
    history: [*const St; MAX_WINDOW],
    inputs: [*const u8; MAX_WINDOW],
    /// Rows `0..n_history` are history.
    n_history: usize,
}

impl<St: SimdElement> Window for Split<St> {
    #[inline(always)]
    unsafe fn load<S: Simd, A: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> S::V {
        unsafe {
            match k < self.n_history {
                true => St::load::<S>(self.history[k].add(c)),
                false => io.load::<S, A>(self.inputs[k].cast::<A>(), c),
            }
        }
    }
    #[inline(always)]
    unsafe fn load1<A: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> f32 {
        unsafe {
            match k < self.n_history {
                true => self.history[k].add(c).read().to_f32(),
                false => io.load1::<A>(self.inputs[k].cast::<A>(), c),
            }
        }
    }
}

/// The input row at time `rel` of a sequence (negative: history).
#[inline(always)]
fn source<A, St>(p: &Problem, s: &Seq, rel: isize) -> Source<St> {
    if rel >= 0 {
        return Source::Input(s.x.cast::<A>().wrapping_add(rel as usize * p.x_tok).cast());
    }
    match (s.state, s.read_state) {
        (Some(st), true) => {
            let row = (first_history_row(s) + p.width - 1).wrapping_add_signed(rel);
            Source::State(st.cast::<St>().wrapping_add(row * p.state_row))
        }
        _ => Source::Zero,
    }
}

/// One block kernel: an activation dtype, a width class and an ISA, compiled as its own function.
/// (Inlined into one function per ISA, the 35 combinations took LLVM many minutes to optimize.)
pub(super) type BlockFn<Io> = unsafe fn(&Problem, &[Piece], usize, usize, &Io);

/// Runs task `i` of a plan with `block`: token group `i / channel_blocks`, channel block
/// `i % channel_blocks`.
#[inline(always)]
pub(super) unsafe fn run_task<Io: RowIo>(
    p: &Problem,
    plan: &Plan,
    i: usize,
    io: &Io,
    block: BlockFn<Io>,
) {
    let (g, cb) = (i / plan.channel_blocks, i % plan.channel_blocks);
    let pieces = &plan.pieces[plan.groups[g].clone()];
    let c0 = cb * plan.block;
    let cn = plan.block.min(p.channels - c0);
    unsafe { block(p, pieces, c0, cn, io) }
}

/// `$f::<A, $Io, W>` for width `$w`: its own instance for 3 and 4, else [`ANY_WIDTH`]'s.
macro_rules! by_width {
    ($f:ident, $A:ty, $Io:ty, $w:expr) => {
        match $w {
            3 => $f::<$A, $Io, 3> as BlockFn<$Io>,
            4 => $f::<$A, $Io, 4>,
            _ => $f::<$A, $Io, ANY_WIDTH>,
        }
    };
}

/// The block kernel for problem `$p`'s dtypes and width: `$bf` for bf16 activations, else `$f`.
macro_rules! block_for {
    ($f:ident, $bf:ident, $Io:ty, $p:expr) => {
        match $p.act {
            DType::F32 => by_width!($f, f32, $Io, $p.width),
            DType::BF16 => by_width!($bf, bf16, $Io, $p.width),
            DType::F16 => by_width!($f, f16, $Io, $p.width),
            a => unreachable!("validated dtype {a:?}"),
        }
    };
}

/// The conv entry points of one ISA, for a module of its own in the architecture's file: `run`,
/// which runs a whole problem (plain or ShortConv-gated) on the context's threads, and [`block`]
/// compiled under `$features` for `$S` (and `$Sbf` for bf16 activations) as one
/// `#[target_feature]` function per (dtypes, width).
macro_rules! conv_entry_points {
    ($S:ty, $Sbf:ty, $features:literal) => {
        use crate::dtype::DType;
        use crate::kernels::conv::vector::{
            ANY_WIDTH, BlockFn, Gated, MAX_LANES, Plain, RowIo, block, gated, run_task,
        };
        use crate::kernels::conv::{Piece, Plan, Problem};
        use crate::kernels::simd::{Simd, SimdElement};
        use half::{bf16, f16};

        /// # Safety
        /// The CPU supports the ISA; as for [`block`].
        #[target_feature(enable = $features)]
        unsafe fn block_simd<A: SimdElement, Io: RowIo, const W: usize>(
            p: &Problem,
            pieces: &[Piece],
            c0: usize,
            cn: usize,
            io: &Io,
        ) {
            const { assert!(<$S as Simd>::LANES <= MAX_LANES) };
            unsafe { block::<$S, A, Io, W>(p, pieces, c0, cn, io) }
        }

        /// [`block_simd`] with the vector type for bf16 activations.
        ///
        /// # Safety
        /// As for [`block_simd`].
        #[target_feature(enable = $features)]
        unsafe fn block_bf16<A: SimdElement, Io: RowIo, const W: usize>(
            p: &Problem,
            pieces: &[Piece],
            c0: usize,
            cn: usize,
            io: &Io,
        ) {
            const { assert!(<$Sbf as Simd>::LANES <= MAX_LANES) };
            unsafe { block::<$Sbf, A, Io, W>(p, pieces, c0, cn, io) }
        }

        /// Task `i` of a plan.
        ///
        /// # Safety
        /// The CPU supports the ISA; `p` is validated and `i < plan.tasks()`.
        unsafe fn task(p: &Problem, plan: &Plan, i: usize) {
            unsafe {
                run_task(
                    p,
                    plan,
                    i,
                    &Plain,
                    block_for!(block_simd, block_bf16, Plain, p),
                )
            }
        }

        /// [`task`] for ShortConv (`p.gates` is set).
        ///
        /// # Safety
        /// As for [`task`].
        unsafe fn task_gated(p: &Problem, plan: &Plan, i: usize) {
            unsafe {
                run_task(
                    p,
                    plan,
                    i,
                    &gated(p),
                    block_for!(block_simd, block_bf16, Gated, p),
                )
            }
        }

        /// Runs `p` with this ISA's kernels (the CPU supports it: [`super::super::conv_fn`]
        /// checks).
        pub(in crate::kernels::conv) fn run(ctx: &crate::runtime::Context, p: &Problem) {
            let task = match p.gates {
                Some(_) => task_gated,
                None => task,
            };
            crate::kernels::conv::run_tasks(ctx, p, task)
        }
    };
}

/// A channel block's taps and bias widened to f32 (rows `0..W`, the bias in row `W`) and, for
/// gated inputs, its kept inputs (rows `W+1..2W`, see [`KeptCursor`]): rows of `cn` channels in
/// one buffer, aligned to a cache line. Consecutive rows start `4 KiB / rows` apart modulo 4 KiB,
/// never at the same offset: the same channel of two rows then never shares an L1 set, and a tap
/// load never looks, by its low 12 address bits, like a read of the kept input stored just before
/// (4K aliasing: the load waits for the store). With ShortConv's 4 KiB rows and the kept inputs a
/// separate allocation 32 bytes past the taps, that cost 5-9% of its time.
struct Taps {
    /// Owns the rows, then the zeros and gathered rows below; once the taps are filled they are
    /// accessed only through `base`, since kept inputs are written while taps are read. The
    /// running thread's task buffer, not a heap allocation per task (up to 180 KiB at 8192
    /// channels: malloc, free and faulting in the pages were ~5% of a conv bench run's samples;
    /// a 256-sequence decode took 726 us instead of 759, median of five runs).
    _buffer: TaskBuffer,
    base: *mut f32,
    /// Elements from one row to the next.
    stride: usize,
    /// Rows in the buffer: `W + 1`, plus `W - 1` with room for kept inputs.
    rows: usize,
    /// The conv width `W`.
    width: usize,
    cn: usize,
    /// `cn` zero elements of any dtype: the history of a sequence without initial state.
    zeros: *const f32,
    /// For a state of strided channels, `W - 1` rows of `cn` elements of any dtype that a tile
    /// gathers its history into (see [`gather_history`]); else null.
    gathered: *mut f32,
}

impl Taps {
    /// The taps of channels `c0..c0+cn`, with room for `kept` rows of kept inputs.
    fn new<S: Simd>(p: &Problem, c0: usize, cn: usize, kept: usize) -> Taps {
        const PAGE: usize = 4096 / size_of::<f32>();
        const LINE: usize = 64 / size_of::<f32>();
        let w = p.width;
        let rows = w + 1 + kept;
        let phase = PAGE / rows / LINE * LINE;
        let stride = cn + (phase + PAGE - cn % PAGE) % PAGE;
        let gathered_len = if p.state_ch != 1 { (w - 1) * cn } else { 0 };
        // Rows, zeros, gathered rows: the task buffer starts on a cache line, `stride` keeps each
        // row on one, and the buffer comes zeroed.
        let mut buffer = TaskBuffer::take(rows * stride + cn + gathered_len);
        unsafe { p.weight.columns(c0, cn, w, buffer.as_mut_ptr(), stride) };
        for (k, row) in buffer.chunks_mut(stride).take(w + 1).enumerate() {
            let row = &mut row[..cn];
            if let (true, Some(bias)) = (k == w, p.bias) {
                unsafe { bias.column(0, c0, row) };
            }
            if (0..S::LANES).any(|l| S::lane_channel(l) != l) {
                for lanes in row.chunks_exact_mut(S::LANES) {
                    let channels: [f32; MAX_LANES] = array_of(|l| lanes[l % S::LANES]);
                    for (l, v) in lanes.iter_mut().enumerate() {
                        *v = channels[S::lane_channel(l)];
                    }
                }
            }
        }
        // Every pointer into the buffer derives from this one, taken once the taps are filled.
        let base = buffer.as_mut_ptr();
        let zeros = base.wrapping_add(rows * stride).cast_const();
        let gathered = match gathered_len {
            0 => std::ptr::null_mut(),
            _ => base.wrapping_add(rows * stride + cn),
        };
        Taps {
            _buffer: buffer,
            base,
            stride,
            rows,
            width: w,
            cn,
            zeros,
            gathered,
        }
    }

    /// Row `k` of the gathered history, at block channel 0.
    #[inline(always)]
    fn gathered_row(&self, k: usize) -> *mut f32 {
        assert!(k + 1 < self.width && !self.gathered.is_null());
        self.gathered.wrapping_add(k * self.cn)
    }

    /// Pointer to row `k` (tap `k`; `k == W`: the bias) at block channel 0.
    #[inline(always)]
    fn row(&self, k: usize) -> *const f32 {
        self.base.wrapping_add(k * self.stride)
    }

    /// Row `k`'s value for block channel `j`.
    #[inline(always)]
    fn value(&self, k: usize, j: usize) -> f32 {
        assert!(j < self.cn, "block channel {j} of {}", self.cn);
        // SAFETY: rows `0..=W` hold `cn` initialized channels each (`k` is at most `W` here).
        unsafe { self.row(k).add(j).read() }
    }

    /// The kept inputs, for the gated piece of tokens `piece` (the rows `new` made
    /// room for).
    #[inline(always)]
    fn kept(&self, piece: std::ops::Range<usize>) -> KeptCursor {
        assert_eq!(
            self.rows,
            2 * self.width,
            "taps made without room for kept inputs"
        );
        KeptCursor {
            values: self.base.wrapping_add((self.width + 1) * self.stride),
            stride: self.stride,
            piece,
        }
    }
}

/// Channels `c0..c0+cn` of every piece of a token group.
#[inline(always)]
pub(super) unsafe fn block<S: Simd, A: SimdElement, Io: RowIo, const W: usize>(
    p: &Problem,
    pieces: &[Piece],
    c0: usize,
    cn: usize,
    io: &Io,
) {
    // Gated pieces of more than one token keep their inputs for the next tile.
    let keeps = |pc: &Piece| !Io::RAW_INPUT && pc.t1 - pc.t0 > 1;
    let kept_rows = if pieces.iter().any(keeps) {
        p.width - 1
    } else {
        0
    };
    let taps = Taps::new::<S>(p, c0, cn, kept_rows);
    for pc in pieces {
        let s = &p.seqs[pc.seq];
        if s.pad {
            unsafe { zero_rows::<S, A>(p, s.out.cast::<A>(), pc.t0..pc.t1, c0, cn) };
            continue;
        }
        let cursor = keeps(pc).then(|| taps.kept(pc.t0..pc.t1));
        let kept = cursor.as_ref();
        // Tiles whose window reaches into a history not in x's layout (see [`tile`]) take one
        // token each: the first `W-1` of an ungated sequence, the first of a gated one (later
        // tiles read the kept inputs). Compiled for whole tiles too, they were a seventh of the
        // library's code, for a token or three per sequence.
        let head = match pc.t0 == 0 && !raw_history::<A, Io>(p) {
            true => pc.t1.min(if Io::RAW_INPUT { width::<W>(p) - 1 } else { 1 }),
            false => pc.t0,
        };
        let mut t = pc.t0;
        // One call site per tile size, so each is compiled once.
        for (end, whole_tiles) in [(head, false), (pc.t1, true)] {
            if whole_tiles {
                // Two-register vectors (bf16 channel pairs): half the tile keeps the window in
                // registers (measured: tiles of 4 spill and lose ~5%).
                t = match S::FEW_VECTORS {
                    true => unsafe {
                        tiles::<S, A, Io, W, { TILE_ROWS / 2 }>(
                            p,
                            s,
                            t..end,
                            c0,
                            cn,
                            &taps,
                            kept,
                            io,
                        )
                    },
                    false => unsafe {
                        tiles::<S, A, Io, W, TILE_ROWS>(p, s, t..end, c0, cn, &taps, kept, io)
                    },
                };
            }
            t = unsafe { tiles::<S, A, Io, W, 1>(p, s, t..end, c0, cn, &taps, kept, io) };
        }
        if let (0, Some(state)) = (pc.t0, s.state)
            && !appends_in_tile::<A, Io>(p, s, pc.t0..pc.t1)
        {
            unsafe {
                match wide_state::<A>(p) {
                    true => write_state::<S, A, f32, Io>(p, s, state.cast(), c0, cn, io),
                    false => write_state::<S, A, A, Io>(p, s, state.cast(), c0, cn, io),
                }
            }
        }
    }
}

/// Whole tiles of `R` tokens from the start of `tokens`; returns the first token left over. With
/// [`KeptCursor`] (gated inputs), a tile after the piece's first reads its history there and keeps
/// its own last `W-1` inputs there for the next.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tiles<S: Simd, A: SimdElement, Io: RowIo, const W: usize, const R: usize>(
    p: &Problem,
    s: &Seq,
    tokens: std::ops::Range<usize>,
    c0: usize,
    cn: usize,
    taps: &Taps,
    kept: Option<&KeptCursor>,
    io: &Io,
) -> usize {
    let mut t = tokens.start;
    while t + R <= tokens.end {
        match kept {
            // A tile after the piece's first: the one before kept (or filled) its history.
            Some(r) if t > r.piece.start => unsafe {
                kept_tile::<S, A, Io, W, R>(p, s, t, c0, cn, taps, r, io)
            },
            _ => unsafe {
                tile::<S, A, Io, W, R>(p, s, t, c0, cn, taps, io);
                // Only when another tile follows (not for a decode).
                if let Some(r) = kept.filter(|r| t + R < r.piece.end) {
                    match wide_state::<A>(p) {
                        true => fill_kept::<S, A, f32, Io, W>(p, s, t + R, c0, cn, r, io),
                        false => fill_kept::<S, A, A, Io, W>(p, s, t + R, c0, cn, r, io),
                    }
                }
            },
        }
        t += R;
    }
    t
}

/// Keeps the history of token `t` (its `W-1` preceding inputs) for the next tile.
#[inline(always)]
unsafe fn fill_kept<S: Simd, A: SimdElement, St: SimdElement, Io: RowIo, const W: usize>(
    p: &Problem,
    s: &Seq,
    t: usize,
    c0: usize,
    cn: usize,
    kept: &KeptCursor,
    io: &Io,
) {
    let mut history = Sources {
        rows: [Source::<St>::Zero; MAX_WINDOW],
        state_ch: p.state_ch,
    };
    let w = width::<W>(p);
    for (k, row) in history.rows.iter_mut().enumerate().take(w - 1) {
        *row = source::<A, St>(p, s, t as isize + k as isize - (w as isize - 1));
    }
    let vec_end = cn / S::LANES * S::LANES;
    for k in 0..w - 1 {
        unsafe {
            for v in (0..vec_end).step_by(S::LANES) {
                let value = history.load::<S, A, Io>(k, io, c0 + v);
                S::store_lane_order(kept.at(k, v), value);
            }
            for j in vec_end..cn {
                kept.at(k, j).write(history.load1::<A, Io>(k, io, c0 + j));
            }
        }
    }
}

/// The kept inputs of one piece: the conv inputs of the last `W-1` tokens its task computed, per
/// block channel, as f32 (full vectors in their lane order), in rows of [`Taps`]. ShortConv's
/// inputs are gated (`round(B * x)`), which costs more than a round trip through L1, so a tile
/// after the piece's first reads its history rows here instead of gating them again. Row `k`
/// holds history entry `k`, oldest first.
struct KeptCursor {
    values: *mut f32,
    stride: usize,
    /// The piece's tokens.
    piece: std::ops::Range<usize>,
}

impl KeptCursor {
    /// Row `k`, block channel `j`.
    #[inline(always)]
    fn at(&self, k: usize, j: usize) -> *mut f32 {
        self.values.wrapping_add(k * self.stride + j)
    }
}

/// A tile's window with the history rows in its [`KeptCursor`], and token rows through the
/// [`RowIo`].
#[derive(Clone, Copy)]
struct KeptRows {
    kept: *const f32,
    stride: usize,
    c0: usize,
    history: usize,
    inputs: [*const u8; MAX_WINDOW],
}

impl Window for KeptRows {
    #[inline(always)]
    unsafe fn load<S: Simd, A: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> S::V {
        unsafe {
            match k < self.history {
                true => S::load_lane_order(self.kept.add(k * self.stride + c - self.c0)),
                false => io.load::<S, A>(self.inputs[k].cast::<A>(), c),
            }
        }
    }
    #[inline(always)]
    unsafe fn load1<A: SimdElement, Io: RowIo>(&self, k: usize, io: &Io, c: usize) -> f32 {
        unsafe {
            match k < self.history {
                true => self.kept.add(k * self.stride + c - self.c0).read(),
                false => io.load1::<A>(self.inputs[k].cast::<A>(), c),
            }
        }
    }
}

/// Outputs of tokens `t..t+R` with the history in [`KeptCursor`], which then keeps this tile's
/// last inputs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn kept_tile<S: Simd, A: SimdElement, Io: RowIo, const W: usize, const R: usize>(
    p: &Problem,
    s: &Seq,
    t: usize,
    c0: usize,
    cn: usize,
    taps: &Taps,
    kept: &KeptCursor,
    io: &Io,
) {
    let w = width::<W>(p);
    let window = KeptRows {
        kept: kept.values,
        stride: kept.stride,
        c0,
        history: w - 1,
        inputs: array_of(|k| {
            let row = (t + k).wrapping_sub(w - 1);
            s.x.cast::<A>()
                .wrapping_add(row.wrapping_mul(p.x_tok))
                .cast()
        }),
    };
    unsafe { tile_rows::<S, A, Io, _, W, R>(p, s, t, c0, cn, taps, Some(kept), io, &window) }
}

/// Outputs of tokens `t..t+R` of sequence `s`, channels `c0..c0+cn`: through plain row pointers
/// when every window row can be read as a row of x, else through [`history_tile`] for the state's
/// element type.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<S: Simd, A: SimdElement, Io: RowIo, const W: usize, const R: usize>(
    p: &Problem,
    s: &Seq,
    t: usize,
    c0: usize,
    cn: usize,
    taps: &Taps,
    io: &Io,
) {
    let w = width::<W>(p);
    unsafe {
        if t < w - 1 && !raw_history::<A, Io>(p) {
            assert!(
                R == 1,
                "a history tile of {R} tokens (the block gives them one each)"
            );
            return match wide_state::<A>(p) {
                true => history_tile::<S, A, f32, Io, W, R>(p, s, t, c0, cn, taps, io),
                false => history_tile::<S, A, A, Io, W, R>(p, s, t, c0, cn, taps, io),
            };
        }
        let mut rows = Rows([std::ptr::null::<A>(); MAX_WINDOW]);
        for (k, row) in rows.0.iter_mut().enumerate().take(w - 1 + R) {
            *row = match source::<A, A>(p, s, t as isize + k as isize - (w as isize - 1)) {
                Source::Input(r) => r.cast(),
                Source::State(r) => r,
                Source::Zero => taps.zeros.cast::<A>().wrapping_sub(c0),
            };
        }
        if appends_in_tile::<A, Io>(p, s, t..t + R) {
            let rows = DecodeRows {
                rows,
                history: w - 1,
            };
            tile_rows::<S, A, Io, _, W, R>(p, s, t, c0, cn, taps, None, io, &rows)
        } else {
            tile_rows::<S, A, Io, _, W, R>(p, s, t, c0, cn, taps, None, io, &rows)
        }
    }
}

/// A [`tile`] whose window reaches into a history not in x's layout (a state of f32 or of strided
/// channels, or ShortConv's gated inputs), for state elements `St`: the state type is a parameter
/// of these tiles only, so the rest of the block is compiled once per activation dtype.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn history_tile<
    S: Simd,
    A: SimdElement,
    St: SimdElement,
    Io: RowIo,
    const W: usize,
    const R: usize,
>(
    p: &Problem,
    s: &Seq,
    t: usize,
    c0: usize,
    cn: usize,
    taps: &Taps,
    io: &Io,
) {
    let w = width::<W>(p);
    let window = w - 1 + R;
    let mut sources = Sources {
        rows: [Source::<St>::Zero; MAX_WINDOW],
        state_ch: p.state_ch,
    };
    for (k, sk) in sources.rows.iter_mut().enumerate().take(window) {
        *sk = source::<A, St>(p, s, t as isize + k as isize - (w as isize - 1));
    }
    unsafe {
        if p.state_ch != 1 {
            gather_history(&mut sources, c0, taps);
        }
        let split = split::<St>(&sources, window, c0, taps);
        tile_rows::<S, A, Io, _, W, R>(p, s, t, c0, cn, taps, None, io, &split)
    }
}

/// Copies the rows of a state with strided channels (channel `c` at `c * state_ch`) that
/// `sources` reads into [`Taps`]' gathered rows, contiguous, and points `sources` at them: one
/// scalar pass per row, and no window of strided loads to compile for the tiles.
#[inline(always)]
unsafe fn gather_history<St: SimdElement>(sources: &mut Sources<St>, c0: usize, taps: &Taps) {
    let state_ch = sources.state_ch;
    for (k, src) in sources.rows.iter_mut().enumerate().take(taps.width - 1) {
        if let Source::State(row) = *src {
            let dst = taps.gathered_row(k).cast::<St>();
            for j in 0..taps.cn {
                unsafe { dst.add(j).write(row.add((c0 + j) * state_ch).read()) };
            }
            *src = Source::State(dst.wrapping_sub(c0));
        }
    }
    sources.state_ch = 1;
}

/// `sources` (history rows of contiguous channels or zeros, then token rows) as a [`Split`]
/// window.
#[inline(always)]
fn split<St: SimdElement>(
    sources: &Sources<St>,
    window: usize,
    c0: usize,
    taps: &Taps,
) -> Split<St> {
    assert_eq!(sources.state_ch, 1, "history rows of strided channels");
    let mut split = Split {
        history: [std::ptr::null(); MAX_WINDOW],
        inputs: [std::ptr::null(); MAX_WINDOW],
        n_history: 0,
    };
    for (k, src) in sources.rows.iter().enumerate().take(window) {
        let history = match *src {
            Source::Input(row) => {
                split.inputs[k] = row;
                continue;
            }
            Source::State(row) => row,
            Source::Zero => taps.zeros.cast::<St>().wrapping_sub(c0),
        };
        assert_eq!(k, split.n_history, "a history row after a token row");
        split.history[k] = history;
        split.n_history += 1;
    }
    split
}

/// [`tile`] with its window rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_rows<
    S: Simd,
    A: SimdElement,
    Io: RowIo,
    Win: Window,
    const W: usize,
    const R: usize,
>(
    p: &Problem,
    s: &Seq,
    t: usize,
    c0: usize,
    cn: usize,
    taps: &Taps,
    keep: Option<&KeptCursor>,
    io: &Io,
    win: &Win,
) {
    let w = width::<W>(p);
    let window = w - 1 + R;
    let keep = keep.filter(|_| !Io::RAW_INPUT);
    let x = s.x.cast::<A>();
    let out = s.out.cast::<A>();
    let orows: [*mut A; R] = array_of(|r| out.wrapping_add((t + r) * p.out_tok));
    let xrows: [*const A; R] = array_of(|r| x.wrapping_add((t + r) * p.x_tok));
    let line = 64 / size_of::<A>();
    // Runs of at most a page per row are too short for the hardware prefetchers to ramp up on:
    // also ask for the next tile's rows, if any, output rows included so its stores find their
    // lines (measured on ShortConv at D=1024: input rows 0.8x the time, output rows then
    // 0.85-0.97x; with 16 KiB rows the check cost 4%).
    let next_tile = cn * size_of::<A>() <= 4096 && t + R < s.len;
    let vec_end = cn / S::LANES * S::LANES;
    let tap: [*const f32; MAX_WIDTH + 1] = array_of(|k| taps.row(k.min(w)));
    let mut v = 0;
    if R == 1 && keep.is_none() {
        let (orow, xrow) = (orows[0], xrows[0]);
        v = match S::FEW_VECTORS {
            true => unsafe {
                one_token_groups::<S, A, Io, Win, W, 2>(p, c0, vec_end, &tap, orow, xrow, io, win)
            },
            false => unsafe {
                one_token_groups::<S, A, Io, Win, W, 4>(p, c0, vec_end, &tap, orow, xrow, io, win)
            },
        };
    }
    while v < vec_end {
        let c = c0 + v;
        unsafe {
            if c.is_multiple_of(line) {
                // A few lines ahead in the tile's own rows: several streams at once are more than
                // the hardware prefetchers follow. (Past the row's end this is only a hint.)
                for xr in xrows {
                    io.prefetch::<A>(xr, c + PREFETCH_LINES * line);
                    if next_tile {
                        io.prefetch::<A>(xr.wrapping_add(R * p.x_tok), c);
                    }
                }
                if next_tile {
                    for o in orows {
                        prefetch(o.wrapping_add(R * p.out_tok + c));
                    }
                }
            }
            let mut xv = [S::zero(); MAX_WINDOW];
            for (k, xk) in xv.iter_mut().enumerate().take(window) {
                *xk = win.load::<S, A, Io>(k, io, c);
            }
            if let Some(kept) = keep {
                for k in 0..w - 1 {
                    S::store_lane_order(kept.at(k, v), xv[R + k]);
                }
            }
            let mut acc = [S::load_lane_order(tap[w].add(v)); R];
            for k in 0..w {
                let wk = S::load_lane_order(tap[k].add(v));
                for r in 0..R {
                    acc[r] = S::fma(wk, xv[r + k], acc[r]);
                }
            }
            if p.silu {
                silu_rows::<S, A, R>(&mut acc);
            }
            for r in 0..R {
                io.store::<S, A>(orows[r], xrows[r], c, acc[r]);
            }
            win.stored(c, S::LANES);
        }
        v += S::LANES;
    }
    for j in vec_end..cn {
        let c = c0 + j;
        let mut weights = [0f32; MAX_WIDTH];
        for (k, wk) in weights.iter_mut().enumerate().take(w) {
            *wk = taps.value(k, j);
        }
        let bias = taps.value(w, j);
        for r in 0..R {
            let mut x = [0f32; MAX_WIDTH];
            for (k, xk) in x.iter_mut().enumerate().take(w) {
                *xk = unsafe { win.load1::<A, Io>(r + k, io, c) };
            }
            let y = scalar_output(&weights[..w], &x[..w], bias, p.silu);
            unsafe { io.store1::<A>(orows[r], xrows[r], c, y) };
        }
        if let Some(kept) = keep {
            let mut inputs = [0f32; MAX_WIDTH];
            for (k, v) in inputs.iter_mut().enumerate().take(w - 1) {
                *v = unsafe { win.load1::<A, Io>(R + k, io, c) };
            }
            for (k, v) in inputs.iter().take(w - 1).enumerate() {
                unsafe { kept.at(k, j).write(*v) };
            }
        }
        unsafe { win.stored(c, 1) };
    }
}

/// The channel vectors of a one-token tile (a decode, or a piece's last tokens), `G` at a time
/// from block channel 0; returns the first not done. One token gives silu one vector per
/// channel vector, and its dependency chain (clamp, exp polynomial, divide) is longer than the
/// rest of a vector's work: `G` chains side by side keep the FP units busy (per vector the same
/// operations as [`tile_rows`]' loop, so the same results).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn one_token_groups<
    S: Simd,
    A: SimdElement,
    Io: RowIo,
    Win: Window,
    const W: usize,
    const G: usize,
>(
    p: &Problem,
    c0: usize,
    vec_end: usize,
    tap: &[*const f32; MAX_WIDTH + 1],
    orow: *mut A,
    xrow: *const A,
    io: &Io,
    win: &Win,
) -> usize {
    let w = width::<W>(p);
    let line = 64 / size_of::<A>();
    let mut v = 0;
    while v + G * S::LANES <= vec_end {
        let mut acc = [unsafe { S::zero() }; G];
        for (g, acc) in acc.iter_mut().enumerate() {
            let (vg, c) = (v + g * S::LANES, c0 + v + g * S::LANES);
            unsafe {
                if c.is_multiple_of(line) {
                    io.prefetch::<A>(xrow, c + PREFETCH_LINES * line);
                }
                *acc = S::load_lane_order(tap[w].add(vg));
                for k in 0..w {
                    let wk = S::load_lane_order(tap[k].add(vg));
                    *acc = S::fma(wk, win.load::<S, A, Io>(k, io, c), *acc);
                }
            }
        }
        unsafe {
            if p.silu {
                silu_rows::<S, A, G>(&mut acc);
            }
            for (g, acc) in acc.into_iter().enumerate() {
                io.store::<S, A>(orow, xrow, c0 + v + g * S::LANES, acc);
            }
            win.stored(c0 + v, G * S::LANES);
        }
        v += G * S::LANES;
    }
    v
}

/// Row of the slot holding history entry 0 (relative time `-(W-1)`).
#[inline(always)]
fn first_history_row(s: &Seq) -> usize {
    match s.update {
        StateUpdate::Append => 0,
        StateUpdate::Rolling { accepted } => accepted - 1,
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
                let keep = w - 2;
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
