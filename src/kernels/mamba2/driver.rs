//! The SIMD driver: splits a call into recurrent, chunked and padded work and runs it on the
//! context's threads with the entry points of one instruction set. The kernel bodies are generic
//! over [`crate::kernels::simd::Simd`]; each ISA only instantiates them under its
//! `#[target_feature]` with `mamba2_entry_points!`, in its architecture's file (`x86.rs`,
//! `aarch64.rs`).

use super::chunked::Layout;
use super::{CHUNK, RECURRENT_MAX_LEN, Scan, recurrent};
use crate::error::{Error, Result, Status};
use crate::kernels::chunking::{Chunk, Plan, Waves, with_scratch};
use crate::kernels::{Path, Sequence, recurrent_bytes};
use crate::runtime::{Context, Isa};
use std::ops::Range;

pub(super) type RecurrentFn = unsafe fn(&Scan, &Sequence, usize);
pub(super) type ChannelsFn = unsafe fn(&Scan, &Sequence, Range<usize>);
pub(super) type IntraFn = unsafe fn(&Scan, &Layout, *mut f32, usize, Chunk, usize);
pub(super) type InterFn =
    unsafe fn(&Scan, &Layout, *mut f32, &Sequence, usize, &[Chunk], Range<usize>);

/// The entry points of one instruction set.
pub(super) struct Kernels {
    pub(super) recurrent: RecurrentFn,
    pub(super) channels: ChannelsFn,
    /// Channels per task of `channels`.
    pub(super) channel_block: usize,
    pub(super) intra: IntraFn,
    pub(super) inter: InterFn,
}

/// A module `$module` whose `KERNELS` are the generic bodies instantiated for `$simd` under
/// `$features`.
macro_rules! mamba2_entry_points {
    ($module:ident, $simd:ty, $features:literal) => {
        mod $module {
            use std::ops::Range;

            use crate::kernels::chunking::Chunk;
            use crate::kernels::mamba2::chunked::{self, Layout};
            use crate::kernels::mamba2::driver::Kernels;
            use crate::kernels::mamba2::{Scan, channels, recurrent};
            use crate::kernels::Sequence;

            // The recurrence keeps at most 16 lanes per vector in its tail buffers.
            const _: () = assert!(<$simd as crate::kernels::simd::Simd>::LANES <= 16);

            #[target_feature(enable = $features)]
            unsafe fn recurrent(args: &Scan, seq: &Sequence, h: usize) {
                crate::with_float_type!(args.state_dtype(), St => unsafe {
                    recurrent::sequence_head::<$simd, St>(args, seq, h)
                })
            }

            #[target_feature(enable = $features)]
            unsafe fn channels(args: &Scan, seq: &Sequence, heads: Range<usize>) {
                unsafe { channels::sequence_block::<$simd>(args, seq, heads) }
            }

            #[target_feature(enable = $features)]
            unsafe fn intra(args: &Scan, layout: &Layout, scratch: *mut f32, c: usize, chunk: Chunk, g: usize) {
                unsafe { chunked::intra::<$simd>(args, layout, scratch, c, chunk, g) }
            }

            #[target_feature(enable = $features)]
            unsafe fn inter(
                args: &Scan,
                layout: &Layout,
                scratch: *mut f32,
                seq: &Sequence,
                first: usize,
                chunks: &[Chunk],
                heads: Range<usize>,
            ) {
                unsafe { chunked::inter::<$simd>(args, layout, scratch, seq, first, chunks, heads) }
            }

            pub(in crate::kernels::mamba2) const KERNELS: Kernels = Kernels {
                recurrent,
                channels,
                channel_block: channels::BLOCK_VECTORS
                    * <$simd as crate::kernels::simd::Simd>::LANES,
                intra,
                inter,
            };
        }
    };
}

/// One head of a recurrent or padded sequence (`task` over `simple.len() * NH`).
unsafe fn run_simple_task(kernels: &Kernels, args: &Scan, simple: &[usize], task: usize) {
    let seq = &args.sequences[simple[task / args.heads]];
    unsafe {
        if seq.padded {
            recurrent::zero_rows(args, seq, task % args.heads);
        } else {
            (kernels.recurrent)(args, seq, task % args.heads);
        }
    }
}

/// How many times wider than a prefill's the channel blocks of a decode-only call are.
const DECODE_BLOCK_FACTOR: usize = 8;

/// A call of one channel per head (`P = 1`, Mamba-1): every sequence, prefill or decode, in
/// tasks of (sequence, block of channels of one group).
///
/// # Safety
/// As for [`mamba2_scan`].
unsafe fn run_channels(ctx: &Context, kernels: &Kernels, args: &Scan) -> Result<()> {
    let group_heads = args.heads / args.groups;
    // A decode's work per channel is one token: a task of a few vectors of channels would spend
    // more on setting up than on the channels, so decode-only calls take wider blocks.
    let channel_block = match args.sequences.iter().all(|s| s.len <= 1) {
        true => kernels.channel_block * DECODE_BLOCK_FACTOR,
        false => kernels.channel_block,
    };
    let blocks = group_heads.div_ceil(channel_block);
    let per_sequence = args.groups * blocks;
    let bytes = recurrent_bytes(
        &args.sequences,
        0..args.sequences.len(),
        args.heads,
        args.head_state_bytes(),
    );
    ctx.for_each_moving(args.sequences.len() * per_sequence, bytes, |task| {
        let seq = &args.sequences[task / per_sequence];
        let (g, block) = (task % per_sequence / blocks, task % blocks);
        let start = g * group_heads + block * channel_block;
        let heads = start..(start + channel_block).min((g + 1) * group_heads);
        // SAFETY: each task owns its sequence's output rows and slots for its channels.
        unsafe {
            if seq.padded {
                heads.for_each(|h| recurrent::zero_rows(args, seq, h));
            } else {
                (kernels.channels)(args, seq, heads);
            }
        }
    });
    Ok(())
}

/// Most heads a pass-2 task carries through a sequence together: each chunk's pass-1 scratch
/// (80 KiB at N = 128) is then read once from memory for all of them, and their states
/// (32 KiB each at P = 64, N = 128) stay in L2.
const MAX_HEAD_BLOCK: usize = 8;

/// # Safety
/// As for [`super::mamba2_scan`]; the CPU supports `isa` (a SIMD level).
pub unsafe fn mamba2_scan(ctx: &Context, isa: Isa, path: Path, args: &Scan) -> Result<()> {
    #[cfg(target_arch = "aarch64")]
    let kernels = super::aarch64::kernels(isa);
    #[cfg(target_arch = "x86_64")]
    let kernels = super::x86::kernels(isa);
    if args.head_dim == 1 {
        return unsafe { run_channels(ctx, kernels, args) };
    }
    // The SSD form factors one decay per head out of its products; per state channel it would
    // not (no model pairs `A [NH, N]` with `P > 1`): the recurrence serves those.
    let path = if args.a_per_state() {
        Path::Recurrent
    } else {
        path
    };
    let Plan {
        chunks,
        chunked: chunked_seqs,
        simple,
    } = Plan::new(&args.sequences, path, CHUNK, RECURRENT_MAX_LEN);
    let heads = args.heads;
    if chunks.is_empty() {
        let head_bytes = args.head_state_bytes();
        let bytes = recurrent_bytes(&args.sequences, simple.iter().copied(), heads, head_bytes);
        ctx.for_each_moving(simple.len() * heads, bytes, |task| {
            // SAFETY: each task owns its sequence's output rows and slots for one head.
            unsafe { run_simple_task(kernels, args, &simple, task) }
        });
        return Ok(());
    }
    // All groups' scratch at once would be ~80 KiB per token and group with N = 128: process the
    // groups in waves just wide enough to keep every thread busy in pass 2, reusing one buffer.
    let (groups, group_heads) = (args.groups, heads / args.groups);
    let wave = (4 * ctx.threads())
        .div_ceil(chunked_seqs.len() * group_heads)
        .clamp(1, groups);
    let layout_of = |first_group: usize| Layout {
        first_group,
        groups: wave.min(groups - first_group),
        state_dim: args.state_dim,
    };
    let floats = chunks
        .len()
        .checked_mul(layout_of(0).chunk_size())
        .ok_or_else(|| {
            Error::new(
                Status::Overflow,
                "mamba2_scan: chunk scratch size overflows",
            )
        })?;
    // Pass 2: (sequence, block of one group's heads), enough blocks for every thread.
    let block_of = |wave_groups: usize| {
        (chunked_seqs.len() * wave_groups * group_heads)
            .div_ceil(2 * ctx.threads())
            .clamp(1, MAX_HEAD_BLOCK.min(group_heads))
    };
    let waves = Waves {
        ctx,
        chunks: chunks.len(),
        units: groups,
        wave,
        simple_tasks: simple.len() * heads,
    };
    with_scratch(floats, "mamba2_scan", |base| {
        waves.run(
            // SAFETY (all three): each task writes only its own chunk/group scratch, or its own
            // sequence's output rows and slots for its heads; pass 2 starts after pass 1.
            |first_group, wave_groups, task| unsafe {
                let (c, g) = (task / wave_groups, first_group + task % wave_groups);
                (kernels.intra)(args, &layout_of(first_group), base.get(), c, chunks[c], g);
            },
            |task| unsafe { run_simple_task(kernels, args, &simple, task) },
            |wave_groups| {
                chunked_seqs.len() * wave_groups * group_heads.div_ceil(block_of(wave_groups))
            },
            |first_group, wave_groups, task| unsafe {
                let block = block_of(wave_groups);
                let blocks = group_heads.div_ceil(block);
                let (b, first, count) = chunked_seqs[task / (wave_groups * blocks)];
                let g = first_group + task / blocks % wave_groups;
                let start = g * group_heads + task % blocks * block;
                let heads = start..(start + block).min((g + 1) * group_heads);
                (kernels.inter)(
                    args,
                    &layout_of(first_group),
                    base.get(),
                    &args.sequences[b],
                    first,
                    &chunks[first..first + count],
                    heads,
                )
            },
        )
    })
}
