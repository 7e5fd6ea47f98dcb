//! The SIMD driver: splits a call into recurrent, chunked and padded work and runs it on the
//! context's threads with the entry points of one instruction set. The kernel bodies are generic
//! over [`crate::kernels::simd::Simd`]; each ISA only instantiates them under its
//! `#[target_feature]` with `gdn_entry_points!`, in its architecture's file (`x86.rs`,
//! `aarch64.rs`).

use std::ops::Range;

use super::chunked::{Chunk, Layout};
use super::gating::KdaGating;
use super::{CHUNK, DeltaRule, Path, RECURRENT_MAX_LEN, Sequence};
use crate::error::{Error, Result, Status};
use crate::kernels::chunking::{Plan, Waves, with_scratch};
use crate::kernels::recurrent_bytes;
use crate::kernels::state_blocks::zero_rows;
use crate::runtime::{Context, Isa};

pub(super) type RecurrentFn = unsafe fn(&DeltaRule, &Sequence, usize);
pub(super) type IntraFn = unsafe fn(&DeltaRule, &Layout, *mut f32, usize, Chunk, usize);
pub(super) type InterFn =
    unsafe fn(&DeltaRule, &Layout, *mut f32, &Sequence, usize, &[Chunk], usize, Range<usize>);
pub(super) type FusedFn =
    unsafe fn(&DeltaRule, &Sequence, &[Chunk], Range<usize>, Range<usize>, Range<usize>);
/// One row of `ssmk_kda_gating` (see [`super::gating::kda_gate_row`]).
pub type KdaGateRowFn = unsafe fn(&KdaGating, &[f32], &[f32], usize, &mut [f32]);

/// The entry points of one instruction set.
pub(super) struct Kernels {
    pub(super) recurrent: RecurrentFn,
    pub(super) intra: IntraFn,
    pub(super) inter: InterFn,
    pub(super) fused: FusedFn,
    pub(super) kda_gate_row: KdaGateRowFn,
}

/// A module `$module` whose `KERNELS` are the generic bodies instantiated for `$simd` under
/// `$features`.
macro_rules! gdn_entry_points {
    ($module:ident, $simd:ty, $features:literal) => {
        mod $module {
            use std::ops::Range;

            use crate::dtype::DType;
            use crate::kernels::gdn::chunked::{self, Chunk, EachHead, HeadScratch, Layout, Pass1, Steps};
            use crate::kernels::gdn::driver::Kernels;
            use crate::kernels::gdn::gating::{self, KdaGating};
            use crate::kernels::gdn::{DeltaRule, Sequence, recurrent};

            #[target_feature(enable = $features)]
            unsafe fn recurrent(args: &DeltaRule, seq: &Sequence, hv: usize) {
                let dtype = args.state.as_ref().map_or(DType::F32, |s| s.dtype);
                crate::with_float_type!(dtype, St => unsafe {
                    if !recurrent::decode::<$simd, St>(args, seq, hv)
                        && !recurrent::decode_transposed::<$simd, St>(args, seq, hv)
                    {
                        recurrent::sequence_head::<$simd, St>(args, seq, hv)
                    }
                })
            }

            #[target_feature(enable = $features)]
            #[inline(never)]
            unsafe fn intra_step(task: &Pass1, buf: &mut [f32], each_head: EachHead) {
                unsafe { chunked::intra::<$simd>(task, buf, each_head) }
            }

            #[target_feature(enable = $features)]
            #[inline(never)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn inter_step(
                args: &DeltaRule,
                seq: &Sequence,
                hs: &HeadScratch,
                s: &mut [f32],
                vn: &mut [f32],
                chunk: Chunk,
                hv: usize,
                cols: Range<usize>,
            ) {
                unsafe {
                    chunked::inter_chunk_checkpointed::<$simd>(args, seq, hs, s, vn, chunk, hv, cols)
                }
            }

            const STEPS: Steps = Steps { intra: intra_step, inter: inter_step };

            unsafe fn intra(args: &DeltaRule, layout: &Layout, scratch: *mut f32, c: usize, chunk: Chunk, h: usize) {
                unsafe { chunked::intra_task(args, layout, scratch, (c, chunk, h), &STEPS) }
            }

            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn inter(
                args: &DeltaRule,
                layout: &Layout,
                scratch: *mut f32,
                seq: &Sequence,
                first: usize,
                chunks: &[Chunk],
                hv: usize,
                cols: Range<usize>,
            ) {
                unsafe {
                    chunked::inter::<$simd>(args, layout, scratch, seq, first, chunks, hv, cols, &STEPS)
                }
            }

            #[target_feature(enable = $features)]
            unsafe fn fused(
                args: &DeltaRule,
                seq: &Sequence,
                chunks: &[Chunk],
                qk_heads: Range<usize>,
                members: Range<usize>,
                cols: Range<usize>,
            ) {
                unsafe {
                    chunked::fused::<$simd>(args, seq, chunks, qk_heads, members, cols, &STEPS)
                }
            }

            #[target_feature(enable = $features)]
            unsafe fn kda_gate_row(
                args: &KdaGating,
                a_scale: &[f32],
                bias: &[f32],
                n: usize,
                buf: &mut [f32],
            ) {
                unsafe { gating::kda_gate_row::<$simd>(args, a_scale, bias, n, buf) }
            }

            pub(in crate::kernels::gdn) const KERNELS: Kernels =
                Kernels { recurrent, intra, inter, fused, kda_gate_row };
        }
    };
}

/// One v-head of a recurrent or padded sequence (`task` over `simple.len() * HV`).
unsafe fn run_simple_task(kernels: &Kernels, args: &DeltaRule, simple: &[usize], task: usize) {
    let seq = &args.sequences[simple[task / args.v_heads]];
    unsafe {
        if seq.padded {
            zero_rows(
                &args.out,
                seq.start..seq.start + seq.len,
                task % args.v_heads,
                args.v_dim,
            );
        } else {
            (kernels.recurrent)(args, seq, task % args.v_heads);
        }
    }
}

/// The recurrent and padded sequences alone (a call with no chunked one): on the calling thread
/// when they move little (a decode of a few sequences, see [`Context::for_each_moving`]).
fn run_simple(ctx: &Context, kernels: &Kernels, args: &DeltaRule, simple: &[usize]) {
    let state_size = args.state.as_ref().map_or(4, |s| s.dtype.size());
    let head_bytes = args.k_dim * args.v_dim * state_size;
    let bytes = recurrent_bytes(
        &args.sequences,
        simple.iter().copied(),
        args.v_heads,
        head_bytes,
    );
    ctx.for_each_moving(simple.len() * args.v_heads, bytes, |task| {
        // SAFETY: each task owns its sequence's output rows and slots for one v-head.
        unsafe { run_simple_task(kernels, args, simple, task) }
    });
}

#[cfg(target_arch = "aarch64")]
use super::aarch64::kernels;
#[cfg(target_arch = "x86_64")]
use super::x86::kernels;

/// KDA's gate row for `isa` (a SIMD level, supported by the CPU).
pub fn kda_gate_row(isa: Isa) -> KdaGateRowFn {
    kernels(isa).kda_gate_row
}

/// Fused tasks that carry several q/k heads still leave this many tasks per thread.
const FUSED_TASKS_PER_THREAD: usize = 2;

/// The f32 states one fused task keeps in L2 beside a chunk's scratch: its q/k heads' v-heads
/// (8 at K = V = 128) take each chunk in turn, so their token rows, adjacent in `q`, `k`, `v`
/// and `g`, are read as one run per token. A head at a time, every row was a page apart;
/// 8 v-heads per task made the per-channel prefill 5-7% and Gated DeltaNet 3% faster
/// (in-process A/B, Xeon AVX-512; 16 v-heads, 1 MiB, were slower again).
const FUSED_STATE_BYTES: usize = 512 << 10;

/// Narrowest block of state columns a pass-2 task takes: a multiple of every ISA's vector, and
/// wide enough that its GEMMs keep whole register panels (32 = two AVX-512 vectors).
const MIN_BLOCK_COLUMNS: usize = 32;

/// Share of a fused task's time that is pass 1 (measured: splitting a Gated DeltaNet or KDA
/// prefill's fused tasks into 2 and 4 column blocks made their sum 1.25 and 1.7-1.8 times the
/// unsplit one), which every column block of a head repeats.
const PASS1_SHARE: f64 = 0.25;

/// Share of a head's pass 1 that its v-heads have in common (loading q and k, `k k^T`, `q k^T`),
/// which a task of some of them repeats; the rest is per v-head.
const PASS1_COMMON: f64 = 0.5;

/// How each (sequence, q/k head) pair is split into tasks when the pairs alone do not fill the
/// threads: into runs of its group's v-heads and blocks of state columns.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Split {
    member_runs: usize,
    blocks: usize,
}

impl Split {
    const WHOLE: Split = Split {
        member_runs: 1,
        blocks: 1,
    };

    fn ways(self) -> usize {
        self.member_runs * self.blocks
    }

    /// Predicted time of `units` pairs split so on `threads` threads, in unsplit tasks: rounds
    /// of tasks times one task (the common part of pass 1 whole, the rest shared by the runs,
    /// pass 2 by runs and blocks).
    fn cost(self, units: usize, threads: usize) -> f64 {
        let rounds = (units * self.ways()).div_ceil(threads.max(1)) as f64;
        let runs = self.member_runs as f64;
        let pass1 = PASS1_SHARE * (PASS1_COMMON + (1.0 - PASS1_COMMON) / runs);
        rounds * (pass1 + (1.0 - PASS1_SHARE) / self.ways() as f64)
    }

    /// The split of `units` pairs over `threads` threads that minimises [`Split::cost`] (the
    /// fewest tasks among equals): whole pairs while they fill the threads (always on 1-2
    /// threads), more on a socket, where one long prefill has fewer heads than cores. Runs of
    /// v-heads only with `members` (the fused form; the waves' pass 2 is per v-head already);
    /// column blocks of at least [`MIN_BLOCK_COLUMNS`], none with checkpoints (see
    /// [`super::chunked::inter_chunk_checkpointed`]).
    fn best(args: &DeltaRule, units: usize, threads: usize, members: bool) -> Split {
        let powers = |most: usize| {
            std::iter::successors(Some(1usize), |b| Some(b * 2)).take_while(move |&b| b <= most)
        };
        let group = args.v_heads / args.heads;
        let most_runs = match members {
            true => group,
            false => 1,
        };
        let most_blocks = match args.v_dim.is_multiple_of(MIN_BLOCK_COLUMNS)
            && args.sequences.iter().all(|s| s.checkpoints.is_empty())
        {
            true => args.v_dim / MIN_BLOCK_COLUMNS,
            false => 1,
        };
        let mut best = Split::WHOLE;
        for member_runs in powers(most_runs).filter(|r| group.is_multiple_of(*r)) {
            for blocks in powers(most_blocks) {
                let split = Split {
                    member_runs,
                    blocks,
                };
                if split.cost(units, threads) < best.cost(units, threads) {
                    best = split;
                }
            }
        }
        best
    }
}

/// Block `block` of `blocks` of the state columns.
fn block_columns(v_dim: usize, blocks: usize, block: usize) -> Range<usize> {
    let width = v_dim / blocks;
    block * width..(block + 1) * width
}

/// q/k heads per fused task: as many as [`FUSED_STATE_BYTES`] holds the states of, as long as
/// every thread still gets [`FUSED_TASKS_PER_THREAD`] tasks.
fn fused_heads_per_task(args: &DeltaRule, sequences: usize, threads: usize) -> usize {
    let state_bytes = (args.v_heads / args.heads) * args.k_dim * args.v_dim * 4;
    let by_cache = FUSED_STATE_BYTES / state_bytes.max(1);
    let by_threads = sequences * args.heads / (FUSED_TASKS_PER_THREAD * threads);
    by_cache.min(by_threads).clamp(1, args.heads)
}

/// # Safety
/// As for [`super::gated_delta_rule`]; the CPU supports `isa` (a SIMD level).
pub unsafe fn gated_delta_rule(
    ctx: &Context,
    isa: Isa,
    path: Path,
    args: &DeltaRule,
) -> Result<()> {
    let kernels = kernels(isa);
    let (heads, v_heads) = (args.heads, args.v_heads);
    let Plan {
        chunks,
        chunked: chunked_seqs,
        simple,
    } = Plan::new(&args.sequences, path, CHUNK, RECURRENT_MAX_LEN);
    if chunks.is_empty() {
        run_simple(ctx, kernels, args, &simple);
        return Ok(());
    }
    // One task per (chunked sequence, run of q/k heads or run of one head's v-heads, block of
    // state columns) when that keeps at least half the threads busy: each runs both passes chunk
    // by chunk, its scratch in cache (the waves below stream their scratch through memory: over
    // twice the work). A split pair repeats part of its pass 1, the price of more tasks than
    // heads.
    let split = Split::best(args, chunked_seqs.len() * heads, ctx.threads(), true);
    if chunked_seqs.len() * heads * split.ways() >= ctx.threads().div_ceil(2) {
        let per_task = match split {
            Split::WHOLE => fused_heads_per_task(args, chunked_seqs.len(), ctx.threads()),
            _ => 1,
        };
        let ways = split.ways();
        let per_seq = heads.div_ceil(per_task) * ways;
        let run_members = v_heads / heads / split.member_runs;
        let fused_tasks = chunked_seqs.len() * per_seq;
        ctx.for_each(fused_tasks + simple.len() * v_heads, |task| unsafe {
            // SAFETY: each task owns its sequence's output rows and slots for the columns of its
            // v-heads.
            match task.checked_sub(fused_tasks) {
                None => {
                    let (b, first, count) = chunked_seqs[task / per_seq];
                    let chunks = &chunks[first..first + count];
                    let (run, part) = (task % per_seq / ways, task % ways);
                    let h0 = run * per_task;
                    let qk_heads = h0..(h0 + per_task).min(heads);
                    let m0 = part / split.blocks * run_members;
                    let members = m0..m0 + run_members;
                    let cols = block_columns(args.v_dim, split.blocks, part % split.blocks);
                    (kernels.fused)(args, &args.sequences[b], chunks, qk_heads, members, cols)
                }
                Some(simple_task) => run_simple_task(kernels, args, &simple, simple_task),
            }
        });
        return Ok(());
    }
    // The chunk scratch of all heads at once would be ~56 KiB per token with H=16, HV=32,
    // K=V=128; process the q/k heads in waves just wide enough to keep every thread busy in pass
    // 2, reusing one buffer (kept per calling thread between calls: no page faults per call).
    let group = v_heads / heads;
    let blocks = Split::best(args, chunked_seqs.len() * v_heads, ctx.threads(), false).blocks;
    let wanted_tasks = 4 * ctx.threads();
    let wave = wanted_tasks
        .div_ceil(chunked_seqs.len() * group * blocks)
        .clamp(1, heads);
    let layout_of = |first_head: usize| Layout {
        first_head,
        heads: wave.min(heads - first_head),
        group,
        slots: group,
        k_dim: args.k_dim,
        v_dim: args.v_dim,
    };
    let floats = chunks
        .len()
        .checked_mul(layout_of(0).chunk_size())
        .ok_or_else(|| {
            Error::new(
                Status::Overflow,
                "gated_delta_rule: chunk scratch size overflows",
            )
        })?;
    let waves = Waves {
        ctx,
        chunks: chunks.len(),
        units: heads,
        wave,
        simple_tasks: simple.len() * v_heads,
    };
    with_scratch(floats, "gated_delta_rule", |base| {
        waves.run(
            // SAFETY (all three): each task writes only its own chunk/head scratch, or its own
            // sequence's output rows and slots for one v-head; pass 2 starts after pass 1.
            |first_head, wave_heads, task| unsafe {
                let (c, h) = (task / wave_heads, first_head + task % wave_heads);
                (kernels.intra)(args, &layout_of(first_head), base.get(), c, chunks[c], h);
            },
            |task| unsafe { run_simple_task(kernels, args, &simple, task) },
            |wave_heads| chunked_seqs.len() * wave_heads * group * blocks,
            |first_head, wave_heads, task| unsafe {
                let wave_v_heads = wave_heads * group;
                let (b, first, count) = chunked_seqs[task / (wave_v_heads * blocks)];
                let member = task / blocks % wave_v_heads;
                let hv = args.v_head(first_head + member / group, member % group);
                let cols = block_columns(args.v_dim, blocks, task % blocks);
                (kernels.inter)(
                    args,
                    &layout_of(first_head),
                    base.get(),
                    &args.sequences[b],
                    first,
                    &chunks[first..first + count],
                    hv,
                    cols,
                )
            },
        )
    })
}
