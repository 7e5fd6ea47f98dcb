//! Depthwise causal conv1d over packed variable-length sequences with per-slot rolling state
//! (ABI.md §4.1–4.2): prefill, chunked-prefill continuation, decode and speculative verify all run
//! through one description, [`Problem`], whose sequences each say where their tokens, outputs and
//! state live.
//!
//! Work is split into tasks of (token group, channel block). A token group is a run of pieces
//! (a piece = up to `PIECE_TOKENS` tokens of one sequence, several short sequences per group); a
//! channel block is as wide as possible (rows are read and written in long runs) but narrow enough
//! that every thread gets work. A block's history comes from the state for the first piece of a
//! sequence and from `x` for later pieces. Only the task holding a sequence's first piece reads its state, and it writes the new
//! state after all of its outputs have read the old one, so tasks never race. Every output element
//! is computed by exactly one task with a fixed order of operations: results are bitwise identical
//! for any thread count and any batch composition.

pub mod reference;

// Before the architecture files: they instantiate its `conv_entry_points!`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[macro_use]
mod vector;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

use crate::dtype::DType;
use crate::kernels::strided::{load_row, store_row};
use crate::runtime::{Context, Isa};

/// Widths the kernels support (ABI.md §4: W = 2..=8).
pub(crate) const MIN_WIDTH: usize = 2;
pub(crate) const MAX_WIDTH: usize = 8;

/// Most channels per task: its widened taps (`4 * (W+1) * block` bytes) stay in L2.
pub(crate) const MAX_CHANNEL_BLOCK: usize = 8192;
/// Fewest channels per task when blocks are split for parallelism: rows of at least 1 KiB.
pub(crate) const MIN_CHANNEL_BLOCK: usize = 512;
/// Blocks other than the last are multiples of this (every vector width, a cache line of f32), so
/// the channels that take the scalar tail path never depend on the split.
pub(crate) const BLOCK_ALIGN: usize = 64;
/// Tasks per thread the split aims for, so uneven tasks still balance.
const TASKS_PER_THREAD: usize = 4;
/// Longest run of one sequence's tokens in a task.
pub(crate) const PIECE_TOKENS: usize = 256;
/// Work (tokens plus state rows) gathered into one token group before a new one starts.
pub(crate) const GROUP_COST: usize = 512;
/// Smallest group cost a wide pool's split goes down to (see `token_split`).
const MIN_GROUP_COST: usize = 32;
/// Channels per block a wide pool's split keeps before shrinking token groups.
const WIDE_CHANNEL_BLOCK: usize = 1024;
/// Fewest outputs (tokens x channels) worth spreading over threads. Waking the pool cost 10-40 us
/// on the 2-core machine this was measured on: a single decode at D = 1024 took 8 us on one
/// thread and 17-29 on two, 16 decodes 20 us and 31-39; at 64K outputs (~70-100 us) two threads
/// at best broke even (LFM2's 64-sequence decode step: 67-101 us on one, 81-154 on two), and
/// 16 decodes at D = 8192 (128K outputs) took 180 us on one and 121 on two.
pub(crate) const MIN_PARALLEL_OUTPUTS: usize = 1 << 17;

/// A 2-D strided array of floats: element `(i, j)` at `ptr + (i * s0 + j * s1) * size`.
#[derive(Clone, Copy, Debug)]
pub struct Matrix {
    pub ptr: *mut u8,
    pub dtype: DType,
    pub s0: usize,
    pub s1: usize,
}

impl Matrix {
    /// Element `(i, j)` as f32.
    ///
    /// # Safety
    /// `(i, j)` lies inside the validated array.
    #[inline(always)]
    pub unsafe fn get(&self, i: usize, j: usize) -> f32 {
        unsafe { load_f32(self.ptr, self.dtype, i * self.s0 + j * self.s1) }
    }

    /// Rows `i0..i0 + out.len()` of column `j` as f32, with one dtype dispatch for the whole
    /// column (kernels widen a block of taps per task; per element it cost more than a decode).
    ///
    /// # Safety
    /// Those elements lie inside the validated array.
    pub unsafe fn column(&self, j: usize, i0: usize, out: &mut [f32]) {
        unsafe fn read<E: crate::dtype::Element>(m: &Matrix, j: usize, i0: usize, out: &mut [f32]) {
            let base = m.ptr.cast::<E>().wrapping_add(j * m.s1);
            for (i, o) in out.iter_mut().enumerate() {
                *o = unsafe { base.add((i0 + i) * m.s0).read() }.to_f32();
            }
        }
        unsafe {
            match self.dtype {
                DType::F32 => read::<f32>(self, j, i0, out),
                DType::BF16 => read::<half::bf16>(self, j, i0, out),
                DType::F16 => read::<half::f16>(self, j, i0, out),
                d => unreachable!("validated float dtype {d:?}"),
            }
        }
    }

    /// Columns `0..cols` of rows `i0..i0 + n` as f32, column `j` to `out[j * stride..][..n]`: one
    /// pass reading each row's columns together (a conv's `[D, W]` taps, widened per task), where
    /// a pass per column reads every row `cols` times. Widths 3 and 4 (the models' convs) unroll.
    ///
    /// # Safety
    /// Those elements lie inside the validated array; `out` holds `(cols - 1) * stride + n`
    /// floats and overlaps nothing read.
    pub unsafe fn columns(&self, i0: usize, n: usize, cols: usize, out: *mut f32, stride: usize) {
        unsafe fn read<E: crate::dtype::Element>(
            m: &Matrix,
            i0: usize,
            n: usize,
            cols: usize,
            out: *mut f32,
            stride: usize,
        ) {
            let base = m.ptr.cast::<E>().wrapping_add(i0 * m.s0);
            let row = |i: usize, cols: usize| {
                let row = base.wrapping_add(i * m.s0);
                for j in 0..cols {
                    unsafe {
                        out.add(j * stride + i)
                            .write(row.add(j * m.s1).read().to_f32())
                    };
                }
            };
            for i in 0..n {
                match cols {
                    3 => row(i, 3),
                    4 => row(i, 4),
                    _ => row(i, cols),
                }
            }
        }
        unsafe {
            match self.dtype {
                DType::F32 => read::<f32>(self, i0, n, cols, out, stride),
                DType::BF16 => read::<half::bf16>(self, i0, n, cols, out, stride),
                DType::F16 => read::<half::f16>(self, i0, n, cols, out, stride),
                d => unreachable!("validated float dtype {d:?}"),
            }
        }
    }
}

/// Reads element `index` of a float array of `dtype` as f32.
///
/// # Safety
/// The element lies inside validated memory.
#[inline(always)]
pub unsafe fn load_f32(ptr: *const u8, dtype: DType, index: usize) -> f32 {
    use crate::dtype::Element;
    unsafe {
        match dtype {
            DType::F32 => ptr.cast::<f32>().add(index).read(),
            DType::BF16 => ptr.cast::<half::bf16>().add(index).read().to_f32(),
            DType::F16 => Element::to_f32(ptr.cast::<half::f16>().add(index).read()),
            other => unreachable!("conv float load of {other:?}"),
        }
    }
}

/// Stores `v` (rounded to nearest-even) into element `index` of a float array of `dtype`.
///
/// # Safety
/// The element lies inside validated, writable memory.
#[inline(always)]
pub unsafe fn store_f32(ptr: *mut u8, dtype: DType, index: usize, v: f32) {
    use crate::dtype::Element;
    unsafe {
        match dtype {
            DType::F32 => ptr.cast::<f32>().add(index).write(v),
            DType::BF16 => ptr
                .cast::<half::bf16>()
                .add(index)
                .write(half::bf16::from_f32(v)),
            DType::F16 => ptr
                .cast::<half::f16>()
                .add(index)
                .write(<half::f16 as Element>::from_f32(v)),
            other => unreachable!("conv float store of {other:?}"),
        }
    }
}

/// How a sequence's state slot changes after its outputs are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateUpdate {
    /// Rows `0..W-1` become the last `W-1` inputs of `[history, x_seq]` (fwd and plain update).
    Append,
    /// Speculative rolling buffer, `accepted` (1..=L-W+2) tokens of the previous step accepted:
    /// history is rows `accepted-1 .. accepted+W-3`, and rows `0..W-2+Q` become
    /// `[rows accepted .. accepted+W-3, x_seq]` (the rows above are not touched), so that the next
    /// step finds its window at rows `n-1 .. n+W-3` whatever `Q` this step had.
    Rolling { accepted: usize },
}

/// One sequence of the call. Pointers address token 0, channel 0 (x, out) and row 0, channel 0
/// of the slot (state).
#[derive(Clone, Copy, Debug)]
pub struct Seq {
    pub x: *const u8,
    pub out: *mut u8,
    pub len: usize,
    /// Padded sequence: outputs are zeros, the state is neither read nor written.
    pub pad: bool,
    /// The slot of this sequence, or `None` when the call has no state pool.
    pub state: Option<*mut u8>,
    /// History comes from the slot (else zeros).
    pub read_state: bool,
    pub update: StateUpdate,
}

/// LFM2 ShortConv gating (ABI.md §4.7): the conv reads `round(B * x)` and stores
/// `round(C * round(y))`, rounding to the activation dtype exactly where the unfused composition
/// stores, so the fused result is bit-identical to it. B and C sit in the same token row as x
/// (`bcx = [B | C | x]`), `b_back` and `c_back` elements before x's channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gates {
    pub b_back: usize,
    pub c_back: usize,
}

/// A state checkpoint inside a prefill (ABI.md §4.10): rows `0..W-1` of the slot at `state`
/// (row 0, channel 0) receive the state after the first `after` tokens of sequence `seq`.
#[derive(Clone, Copy, Debug)]
pub struct Checkpoint {
    pub seq: usize,
    pub after: usize,
    pub state: *mut u8,
}

/// A whole call, validated. Strides are in elements.
#[derive(Clone, Debug)]
pub struct Problem {
    /// dtype of x and out.
    pub act: DType,
    pub channels: usize,
    pub width: usize,
    pub silu: bool,
    pub x_tok: usize,
    pub x_ch: usize,
    pub out_tok: usize,
    pub out_ch: usize,
    /// `[D, W]`.
    pub weight: Matrix,
    /// `[D]` in `s0`, or none (zero bias).
    pub bias: Option<Matrix>,
    pub state_dtype: DType,
    /// Rows `L` of a slot, and the element strides of a slot's row and channel.
    pub state_rows: usize,
    pub state_row: usize,
    pub state_ch: usize,
    /// ShortConv's input and output gates, if any.
    pub gates: Option<Gates>,
    pub seqs: Vec<Seq>,
    /// Checkpoints of the prefill's sequences (none for decodes).
    pub checkpoints: Vec<Checkpoint>,
}

// SAFETY: a Problem describes caller memory validated by the FFI layer; the work split below
// gives every task disjoint outputs and state.
unsafe impl Send for Problem {}
unsafe impl Sync for Problem {}

impl Problem {
    /// Both x and out have contiguous channels: the vector kernels apply.
    pub fn channels_contiguous(&self) -> bool {
        (self.x_ch == 1 && self.out_ch == 1) || self.channels <= 1
    }
}

/// Up to `PIECE_TOKENS` consecutive tokens `t0..t1` of sequence `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub seq: usize,
    pub t0: usize,
    pub t1: usize,
}

/// The task split: token groups (ranges of `pieces`) times channel blocks of `block` channels (the
/// last may be narrower).
#[derive(Clone, Debug)]
pub struct Plan {
    pub pieces: Vec<Piece>,
    pub groups: Vec<std::ops::Range<usize>>,
    pub block: usize,
    pub channel_blocks: usize,
}

impl Plan {
    /// The split for `threads` threads. Results do not depend on it: every output element is
    /// computed the same way whichever task holds it.
    pub fn new(p: &Problem, threads: usize) -> Plan {
        let (piece_tokens, group_cost) = token_split(p, threads);
        let mut pieces = Vec::new();
        for (b, s) in p.seqs.iter().enumerate() {
            // A zero-length sequence still gets a piece: its state may change.
            let mut t0 = 0;
            loop {
                let t1 = (t0 + piece_tokens).min(s.len);
                pieces.push(Piece { seq: b, t0, t1 });
                t0 = t1;
                if t0 >= s.len {
                    break;
                }
            }
        }
        let state_cost = 2 * p.width;
        let mut groups = Vec::new();
        let (mut start, mut cost) = (0, 0);
        for (i, pc) in pieces.iter().enumerate() {
            let s = &p.seqs[pc.seq];
            cost += pc.t1 - pc.t0
                + 1
                + if pc.t0 == 0 && s.state.is_some() {
                    state_cost
                } else {
                    0
                };
            if cost >= group_cost {
                groups.push(start..i + 1);
                start = i + 1;
                cost = 0;
            }
        }
        if start < pieces.len() {
            groups.push(start..pieces.len());
        }
        let mut blocks = p.channels.div_ceil(MAX_CHANNEL_BLOCK);
        if threads > 1 {
            let wanted = (TASKS_PER_THREAD * threads).div_ceil(groups.len().max(1));
            blocks = blocks.max(wanted.min(p.channels / MIN_CHANNEL_BLOCK));
        }
        let block = p
            .channels
            .div_ceil(blocks.max(1))
            .next_multiple_of(BLOCK_ALIGN)
            .max(1);
        Plan {
            pieces,
            groups,
            block,
            channel_blocks: p.channels.div_ceil(block).max(1),
        }
    }

    pub fn tasks(&self) -> usize {
        self.groups.len() * self.channel_blocks
    }
}

/// Longest piece and group cost for `threads` threads. Up to two threads, [`PIECE_TOKENS`] and
/// [`GROUP_COST`]. For more, the groups shrink (to [`MIN_GROUP_COST`]) until the tasks a wide
/// pool wants fit in blocks of at least [`WIDE_CHANNEL_BLOCK`] channels: a task then streams
/// whole rows of a few KiB, where narrow blocks of many rows cost ~50% more per byte (rows a page
/// apart each, measured with `--simulate-threads`), and a group only re-reads `W - 1` rows of
/// history.
fn token_split(p: &Problem, threads: usize) -> (usize, usize) {
    if threads <= 2 {
        return (PIECE_TOKENS, GROUP_COST);
    }
    let tokens: usize = p.seqs.iter().map(|s| s.len + 1).sum();
    let wide_blocks = (p.channels / WIDE_CHANNEL_BLOCK).max(1);
    let groups = (TASKS_PER_THREAD * threads).div_ceil(wide_blocks);
    let cost = (tokens / groups).clamp(MIN_GROUP_COST, GROUP_COST);
    (PIECE_TOKENS.min(cost), cost)
}

/// Runs task `i` of a plan (the vector kernels; one entry per ISA and dtype pair).
type TaskFn = unsafe fn(&Problem, &Plan, usize);

/// Runs a whole problem on the context's threads with the kernels of one ISA.
pub type ConvFn = fn(&Context, &Problem);

/// The conv implementation for `isa` (the best one at or below it, never above the CPU's).
pub fn conv_fn(isa: Isa) -> ConvFn {
    match isa.for_this_cpu() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::avx2::run,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Bf16 => x86::avx512::run,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => aarch64::neon::run,
        _ => run_reference,
    }
}

fn active_conv_fn() -> ConvFn {
    static CHOSEN: OnceLock<ConvFn> = OnceLock::new();
    *CHOSEN.get_or_init(|| conv_fn(Isa::active()))
}

/// Runs the problem with this thread's instruction set ([`Isa::dispatch`]).
pub fn run(ctx: &Context, p: &Problem) {
    // SAFETY: the problem is validated; checkpoint slots are distinct from each other and from
    // every sequence's slot, so writing them first leaves every history the main pass reads.
    unsafe { write_checkpoints(ctx, p) };
    match Isa::dispatch() {
        isa if isa == Isa::active() => active_conv_fn()(ctx, p),
        isa => conv_fn(isa)(ctx, p),
    }
}

/// Writes every checkpoint's rows `0..W-1`: the last `W-1` inputs of `[history, x_seq[0..after)]`,
/// the very values a call ending after that token stores (inputs copied exactly, ShortConv's
/// `B * x` rounded to the activation dtype as the conv rounds it). A checkpoint within `W-1`
/// tokens of the start takes history rows from the sequence's own slot, so this runs before the
/// main pass rewrites it. One task per checkpoint (each writes its own slot) when there are rows
/// enough to spread over the threads ([`parallel_threads`]'s rule), else all on the caller's.
///
/// # Safety
/// `p` is validated; no other thread touches the checkpoint slots.
unsafe fn write_checkpoints(ctx: &Context, p: &Problem) {
    let rows = p.checkpoints.len() * (p.width - 1) * p.channels;
    let write = |i: usize| unsafe { write_checkpoint(p, &p.checkpoints[i]) };
    match rows < MIN_PARALLEL_OUTPUTS && !crate::runtime::every_call_parallel() {
        true => (0..p.checkpoints.len()).for_each(write),
        false => ctx.for_each(p.checkpoints.len(), write),
    }
}

/// One checkpoint of [`write_checkpoints`].
///
/// # Safety
/// As for [`write_checkpoints`].
unsafe fn write_checkpoint(p: &Problem, cp: &Checkpoint) {
    let (w, act) = (p.width as isize, p.act);
    let (mut row, mut gate) = (vec![0f32; p.channels], vec![0f32; p.channels]);
    let state_row =
        |base: *mut u8, r: usize| base.wrapping_add(r * p.state_row * p.state_dtype.size());
    let s = &p.seqs[cp.seq];
    // The state holds x's bits in x's layout: rows are copied as bytes (as the vector kernels'
    // final states are).
    let raw = p.gates.is_none() && p.state_dtype == act && p.x_ch == 1 && p.state_ch == 1;
    for j in 0..w - 1 {
        // Relative time of row j: negative is the history.
        let rel = cp.after as isize - (w - 1) + j;
        unsafe {
            if raw && rel >= 0 {
                let x_row = s.x.wrapping_add(rel as usize * p.x_tok * act.size());
                let bytes = p.channels * act.size();
                std::ptr::copy_nonoverlapping(x_row, state_row(cp.state, j as usize), bytes);
                continue;
            }
            if rel >= 0 {
                let x_row = s.x.wrapping_add(rel as usize * p.x_tok * act.size());
                load_row(x_row, act, p.x_ch, &mut row);
                if let Some(g) = p.gates {
                    let b_row = x_row.wrapping_sub(g.b_back * act.size());
                    load_row(b_row, act, p.x_ch, &mut gate);
                    for (x, b) in row.iter_mut().zip(&gate) {
                        *x = reference::round_to(act, b * *x);
                    }
                }
            } else if let (Some(st), true) = (s.state, s.read_state) {
                let r = (w - 1 + rel) as usize;
                load_row(state_row(st, r), p.state_dtype, p.state_ch, &mut row);
            } else {
                row.fill(0.0);
            }
            store_row(
                state_row(cp.state, j as usize),
                p.state_dtype,
                p.state_ch,
                &row,
            );
        }
    }
}

/// The portable reference, one task per sequence (sequences own disjoint outputs and slots).
fn run_reference(ctx: &Context, p: &Problem) {
    // SAFETY: the problem is validated; sequence b writes only its output rows and its slot.
    ctx.for_each(p.seqs.len(), |b| unsafe { reference::sequence(p, b) });
}

/// Runs `p` with `task`, one ISA's entry point, on the context's threads.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn run_tasks(ctx: &Context, p: &Problem, task: TaskFn) {
    if !p.channels_contiguous() {
        // Strided channels: the portable path is correct for any layout.
        return run_reference(ctx, p);
    }
    let threads = parallel_threads(p, ctx.threads());
    let plan = Plan::new(p, threads);
    // SAFETY: the entry's ISA is at most the detected one (conv_fn clamps); tasks touch disjoint
    // outputs and slots (see the module docs).
    let run = |i| unsafe { task(p, &plan, i) };
    match threads {
        1 => (0..plan.tasks()).for_each(run),
        _ => ctx.for_each(plan.tasks(), run),
    }
}

/// The threads worth using for `p` out of `threads`: one for a small call
/// ([`MIN_PARALLEL_OUTPUTS`]) unless [`crate::runtime::with_every_call_parallel`] is in force.
fn parallel_threads(p: &Problem, threads: usize) -> usize {
    let outputs = p.seqs.iter().map(|s| s.len).sum::<usize>() * p.channels;
    match outputs < MIN_PARALLEL_OUTPUTS && !crate::runtime::every_call_parallel() {
        true => 1,
        false => threads,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(lens: &[usize], with_state: bool) -> Problem {
        let seq = |len| Seq {
            x: std::ptr::null(),
            out: std::ptr::null_mut(),
            len,
            pad: false,
            state: with_state.then_some(std::ptr::null_mut()),
            read_state: false,
            update: StateUpdate::Append,
        };
        let m = Matrix {
            ptr: std::ptr::null_mut(),
            dtype: DType::F32,
            s0: 1,
            s1: 1,
        };
        Problem {
            act: DType::F32,
            channels: 1000,
            width: 4,
            silu: false,
            x_tok: 1000,
            x_ch: 1,
            out_tok: 1000,
            out_ch: 1,
            weight: m,
            bias: None,
            state_dtype: DType::F32,
            state_rows: 3,
            state_row: 1000,
            state_ch: 1,
            gates: None,
            seqs: lens.iter().map(|&l| seq(l)).collect(),
            checkpoints: Vec::new(),
        }
    }

    #[test]
    fn small_calls_stay_on_one_thread() {
        let small = problem(&[1; 64], true);
        assert_eq!(parallel_threads(&small, 2), 1);
        assert_eq!(
            crate::runtime::with_every_call_parallel(|| parallel_threads(&small, 2)),
            2
        );
        let prefill = problem(&[MIN_PARALLEL_OUTPUTS.div_ceil(1000)], true);
        assert_eq!(parallel_threads(&prefill, 2), 2);
    }

    #[test]
    fn plan_covers_every_token_once() {
        let lens = [0, 1, 600, 3, 0, 256, 257, 1];
        let plan = Plan::new(&problem(&lens, true), 1);
        assert_eq!((plan.channel_blocks, plan.block), (1, 1024));
        // Few token groups: channels are split so two threads get four tasks each.
        let mut wide = problem(&[5], true);
        wide.channels = 4100;
        let split = Plan::new(&wide, 2);
        assert_eq!((split.channel_blocks, split.block), (8, 576));
        let one = Plan::new(&wide, 1);
        assert_eq!((one.channel_blocks, one.block), (1, 4160));
        for threads in [1, 2, 3, 16, 64] {
            let plan = Plan::new(&problem(&lens, true), threads);
            let mut covered = vec![0usize; lens.len()];
            let mut expect_next = vec![0usize; lens.len()];
            let mut count_pieces = vec![0usize; lens.len()];
            for g in &plan.groups {
                for pc in &plan.pieces[g.clone()] {
                    assert_eq!(pc.t0, expect_next[pc.seq]);
                    assert!(pc.t1 - pc.t0 <= PIECE_TOKENS);
                    expect_next[pc.seq] = pc.t1;
                    covered[pc.seq] += pc.t1 - pc.t0;
                    count_pieces[pc.seq] += 1;
                }
            }
            assert_eq!(covered, lens, "{threads} threads");
            assert!(
                count_pieces.iter().all(|&n| n >= 1),
                "zero-length sequences keep a piece"
            );
            assert_eq!(plan.groups.last().unwrap().end, plan.pieces.len());
        }
    }

    #[test]
    fn a_wide_pool_gets_enough_tasks_of_whole_kib_rows() {
        let mut long = problem(&[2048], true);
        long.channels = 8192;
        for (threads, tasks) in [(2, 8), (16, 64), (64, 256)] {
            let plan = Plan::new(&long, threads);
            assert!(plan.tasks() >= tasks, "{threads}: {} tasks", plan.tasks());
            assert!(
                plan.block >= WIDE_CHANNEL_BLOCK,
                "{threads}: {}",
                plan.block
            );
        }
        assert_eq!(
            Plan::new(&long, 2).groups.len(),
            4,
            "two threads: as before"
        );
    }
}
